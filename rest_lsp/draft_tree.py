"""Draft trees: retrieved continuations merged into one trie, cut to a node budget, flattened for verification.

Node 0 of a flattened tree is the root: the last token of the context, whose KV is not cached yet. Nodes 1..n are
draft tokens; a node's parent always comes before it. The model sees the root and the drafts in one forward pass.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

import torch

from rest_lsp.drafts import Continuation


@dataclass(frozen=True)
class DraftTree:
    tokens: list[int]  # [n+1], tokens[0] is the root
    parents: list[int]  # [n+1], parents[0] == -1
    depths: list[int]  # [n+1], depths[0] == 0
    # [n+1]: the share of all retrieved continuations that pass through each node (1.0 at the root), an
    # estimate of how likely the model is to reach and accept it
    shares: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> list[dict[int, int]]:
        """children()[i] maps a token to the node that continues node i with it."""
        kids: list[dict[int, int]] = [{} for _ in self.tokens]
        for i in range(1, len(self.tokens)):
            kids[self.parents[i]][self.tokens[i]] = i
        return kids


def build_tree(root_token: int, continuations: Sequence[Continuation], budget: int) -> DraftTree:
    """Merge continuations into a trie (a shared prefix is one node) and keep the `budget` heaviest nodes.

    A node weighs the sum of the continuations that pass through it, so it never outweighs its parent; taking
    nodes best-first from a frontier keeps every kept node's parent.
    """
    # trie[i] = {token: child index}; weight[i] accumulates
    trie: list[dict[int, int]] = [{}]
    weight: list[float] = [0.0]
    for tokens, w in continuations:
        if w <= 0:
            continue
        node = 0
        for t in tokens:
            nxt = trie[node].get(t)
            if nxt is None:
                nxt = len(trie)
                trie[node][t] = nxt
                trie.append({})
                weight.append(0.0)
            weight[nxt] += w
            node = nxt

    total = sum(w for _, w in continuations if w > 0) or 1.0
    out_tokens, out_parents, out_depths, out_shares = [root_token], [-1], [0], [1.0]
    # heap of (-weight, order, trie node, parent index in the output)
    order = 0
    frontier: list[tuple[float, int, int, int, int]] = []
    for t, child in trie[0].items():
        heapq.heappush(frontier, (-weight[child], order, child, t, 0))
        order += 1
    while frontier and len(out_tokens) <= budget:
        _, _, node, token, parent = heapq.heappop(frontier)
        index = len(out_tokens)
        out_tokens.append(token)
        out_parents.append(parent)
        out_depths.append(out_depths[parent] + 1)
        out_shares.append(weight[node] / total)
        for t, child in trie[node].items():
            heapq.heappush(frontier, (-weight[child], order, child, t, index))
            order += 1
    return DraftTree(out_tokens, out_parents, out_depths, tuple(out_shares))


def fit_to_cost(tree: DraftTree, cost: Sequence[float], trust: float = 1.0) -> DraftTree:
    """Keep the first n drafts that maximise expected tokens per unit of time:
    (1 + trust * sum of shares) / cost(n+1), where trust scales shares into acceptance probabilities.

    `cost[k]` is the time of a step verifying k tokens relative to a plain step (cost[1] == 1). Nodes come
    heaviest first and every prefix of them is a whole tree, so cutting the tail keeps it valid. On a GPU the
    curve is flat and the whole tree is kept; on a CPU a weak match gets a small tree or none.
    """

    def at(k: int) -> float:
        if k < len(cost):
            return cost[k]
        slope = cost[-1] - cost[-2]  # beyond the table: extend its last segment
        return cost[-1] + slope * (k - len(cost) + 1)

    best_n, best, gain = 0, 1.0, 1.0
    for n in range(1, len(tree)):
        gain += trust * tree.shares[n]
        if gain / at(n + 1) > best:
            best_n, best = n, gain / at(n + 1)
    if best_n == len(tree) - 1:
        return tree
    k = best_n + 1
    return DraftTree(tree.tokens[:k], tree.parents[:k], tree.depths[:k], tree.shares[:k])


def tree_attention_mask(tree: DraftTree, past_length: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive mask [1, 1, n+1, past+n+1]: each node sees the whole cached context, its ancestors and itself."""
    n = len(tree)
    parents = torch.tensor(tree.parents, device=device)
    sees = torch.eye(n, dtype=torch.bool, device=device)  # [n, n]
    # Parents precede children, so one pass in order inherits the full ancestor set.
    for i in range(1, n):
        sees[i] |= sees[parents[i]]
    allowed = torch.cat([torch.ones(n, past_length, dtype=torch.bool, device=device), sees], dim=1)  # [n, past+n]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]  # [1, 1, n, past+n]


def tree_position_ids(tree: DraftTree, past_length: int, device=None) -> torch.Tensor:
    """Position of a node = its depth past the context; siblings share a position."""
    return (past_length + torch.tensor(tree.depths, device=device))[None]  # [1, n]
