"""Draft trees: retrieved continuations merged into one trie, cut to a node budget, flattened for verification.

Node 0 of a flattened tree is the root: the last token of the context, whose KV is not cached yet. Nodes 1..n are
draft tokens; a node's parent always comes before it. The model sees the root and the drafts in one forward pass.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

import torch

from rest_lsp.drafting.acceptance import AcceptanceModel, Key, bucket
from rest_lsp.drafting.drafts import Continuation, Proposal


@dataclass(frozen=True)
class DraftTree:
    tokens: list[int]  # [n+1], tokens[0] is the root
    parents: list[int]  # [n+1], parents[0] == -1
    depths: list[int]  # [n+1], depths[0] == 0
    # [n+1]: the estimated probability that the model accepts each node (the product of the conditional
    # probabilities along its path; 1.0 at the root). Never more than the parent's.
    shares: tuple[float, ...] = ()
    # [n+1]: per node, the (acceptance bucket, ratio) of each source that proposed it, for learning
    votes: tuple[tuple[tuple[Key, float], ...], ...] = ()
    # [n+1]: P(node | parent) as the sources' word had it, before the acceptance model's calibration (1.0 at the
    # root): what the calibration learns from
    chances: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> list[dict[int, int]]:
        """children()[i] maps a token to the node that continues node i with it."""
        kids: list[dict[int, int]] = [{} for _ in self.tokens]
        for i in range(1, len(self.tokens)):
            kids[self.parents[i]][self.tokens[i]] = i
        return kids

    def prefix(self, k: int) -> "DraftTree":
        """The first k nodes (a whole tree: parents come first)."""
        return DraftTree(self.tokens[:k], self.parents[:k], self.depths[:k], self.shares[:k], self.votes[:k],
                         self.chances[:k])


def build_tree(
    root_token: int,
    proposals: Sequence[Proposal] | Sequence[Continuation],
    budget: int,
    acceptance: AcceptanceModel | None = None,
) -> DraftTree:
    """Merge proposals into one trie (a shared prefix is one node) and keep the `budget` likeliest nodes.

    A node's probability given its parent: each proposing source says min(1, scale * ratio), its scale learned by
    `acceptance` (1 without it); the node takes its most confident source's word, and siblings are scaled to sum to
    at most 1 (they exclude each other). A node's
    probability is the product along its path, so it never exceeds its parent's, and taking nodes best-first from
    a frontier keeps every kept node's parent. Plain continuations are one proposal of unknown origin.
    """
    if proposals and not isinstance(proposals[0], Proposal):
        proposals = [Proposal.from_continuations("drafts", 0, proposals, max_nodes=1 << 30)]
    # trie over all proposals: children, token, and the votes (bucket, ratio) each node received
    trie: list[dict[int, int]] = [{}]
    toks: list[int] = [root_token]
    votes: list[list[tuple[Key, float]]] = [[]]
    depth: list[int] = [0]

    def node_under(up: int, t: int) -> int:
        node = trie[up].get(t)
        if node is None:
            node = len(trie)
            trie[up][t] = node
            trie.append({})
            toks.append(t)
            votes.append([])
            depth.append(depth[up] + 1)
        return node

    for prop in proposals:
        base = 0
        for t in prop.under:  # a start that another source proposes: this one hangs below it, without a vote there
            base = node_under(base, t)
        where = [0] * len(prop)  # proposal index -> trie node
        keys: dict[int, Key] = {}  # by depth in the proposal
        for i, (t, parent, ratio) in enumerate(zip(prop.tokens, prop.parents, prop.ratios)):
            node = node_under(base if parent < 0 else where[parent], t)
            # learned by the node's depth in the source's own continuation, wherever the tree hangs it
            own = depth[node] - len(prop.under)
            key = keys.get(own)
            if key is None:
                key = keys[own] = bucket(prop.source, prop.match_length, own)
            votes[node].append((key, ratio))
            where[i] = node

    factors: dict[Key, float] = {}  # the acceptance model's factor per bucket, asked once per tree

    def probability(key: Key, ratio: float) -> float:
        if acceptance is None:
            return min(1.0, ratio)
        factor = factors.get(key)
        if factor is None:
            factor = factors[key] = acceptance.factor(key)
        return min(1.0, factor * ratio)

    def chance(node: int) -> float:
        # the best-informed witness, not a noisy-OR: sources agree for the same reasons (the text after the
        # cursor is also in the workspace and in earlier outputs), so agreement is not independent evidence
        return max((probability(key, ratio) for key, ratio in votes[node]), default=0.0)

    def children(node: int) -> list[tuple[int, float]]:
        """(trie child, P(child | node) as the sources say): siblings exclude each other, so at most 1 in all."""
        kids = [(child, chance(child)) for child in trie[node].values()]
        total = sum(p for _, p in kids)
        return [(c, p / total) for c, p in kids] if total > 1.0 else kids

    def calibrated(p: float) -> float:
        return p if acceptance is None else acceptance.calibrated(p)

    out_tokens, out_parents, out_depths, out_shares, out_votes = [root_token], [-1], [0], [1.0], [()]
    out_chances = [1.0]
    order = 0
    # heap of (-path probability, order, trie node, parent index in the output, the sources' P(node | parent))
    frontier: list[tuple[float, int, int, int, float]] = []
    for child, p in children(0):
        heapq.heappush(frontier, (-calibrated(p), order, child, 0, p))
        order += 1
    while frontier and len(out_tokens) <= budget:
        neg, _, node, parent, raw = heapq.heappop(frontier)
        if neg >= 0:
            break  # probability 0: never worth a slot
        index = len(out_tokens)
        out_tokens.append(toks[node])
        out_parents.append(parent)
        out_depths.append(depth[node])
        out_shares.append(-neg)
        out_votes.append(tuple(votes[node]))
        out_chances.append(raw)
        for child, p in children(node):
            heapq.heappush(frontier, (neg * calibrated(p), order, child, index, p))
            order += 1
    return DraftTree(out_tokens, out_parents, out_depths, tuple(out_shares), tuple(out_votes), tuple(out_chances))


def cost_at(cost: Sequence[float], k: int) -> float:
    """cost[k], its last segment extended beyond the table."""
    if k < len(cost):
        return cost[k]
    return cost[-1] + (cost[-1] - cost[-2]) * (k - len(cost) + 1)


def fit_to_cost(tree: DraftTree, cost: Sequence[float], trust: float = 1.0) -> DraftTree:
    """Keep the first n drafts that maximise expected tokens per unit of time:
    (1 + trust * sum of node probabilities) / cost(n+1); `trust` scales them further (1: take them as they are).

    `cost[k]` is the time of a step verifying k tokens relative to a plain step (cost[1] == 1). Nodes come
    heaviest first and every prefix of them is a whole tree, so cutting the tail keeps it valid. On a GPU the
    curve is flat and the whole tree is kept; on a CPU a weak match gets a small tree or none.
    """

    best_n, best, gain = 0, 1.0, 1.0
    for n in range(1, len(tree)):
        gain += trust * tree.shares[n]
        if gain / cost_at(cost, n + 1) > best:
            best_n, best = n, gain / cost_at(cost, n + 1)
    if best_n == len(tree) - 1:
        return tree
    return tree.prefix(best_n + 1)


def under_chain(tree: DraftTree, chain: Sequence[int]) -> DraftTree:
    """The tree hung under a chain of tokens (each the child of the one before, the tree's root the last one's
    child): the shape of a pass that computes an uncached prompt tail and verifies a tree on top of it."""
    k = len(chain)
    if not k:
        return tree
    parents = list(range(-1, k - 1)) + [k - 1] + [p + k for p in tree.parents[1:]]
    depths = list(range(k)) + [d + k for d in tree.depths]
    return DraftTree(list(chain) + tree.tokens, parents, depths)


def tree_attention_mask(tree: DraftTree, past_length: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive mask [1, 1, n+1, past+n+1]: each node sees the whole cached context, its ancestors and itself."""
    n = len(tree)
    # built on the host and copied once: on a GPU, n row updates would be n kernel launches
    sees = torch.eye(n, dtype=torch.bool)  # [n, n]
    # Parents precede children, so one pass in order inherits the full ancestor set.
    for i, parent in enumerate(tree.parents[1:], start=1):
        sees[i] |= sees[parent]
    allowed = torch.cat([torch.ones(n, past_length, dtype=torch.bool), sees], dim=1)  # [n, past+n]
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.to(device)[None, None]  # [1, 1, n, past+n]


def tree_position_ids(tree: DraftTree, past_length: int, device=None) -> torch.Tensor:
    """Position of a node = its depth past the context; siblings share a position."""
    return (past_length + torch.tensor(tree.depths, device=device))[None]  # [1, n]
