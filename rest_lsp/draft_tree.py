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

    out_tokens, out_parents, out_depths = [root_token], [-1], [0]
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
        for t, child in trie[node].items():
            heapq.heappush(frontier, (-weight[child], order, child, t, index))
            order += 1
    return DraftTree(out_tokens, out_parents, out_depths)


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
