"""CUDA graphs of the static step: its inputs written in place (`StepInputs`) and one graph per cache storage,
capacity and row bucket (`StepGraphs`), replayed instead of some twenty kernel launches per layer."""

# no `from __future__ import annotations`: kept like lean_llama.py, whose TorchScript reads annotations as types
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

# Row counts a static step pads to: each is one CUDA graph per cache. A tree larger than the last runs eagerly.
STEP_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
GRAPHS_KEPT = 32  # captured graphs kept (least recently used dropped): buckets x caches x capacities in use


@dataclass
class StepInputs:
    """A static step's inputs, written in place before each step (a captured graph reads them where they are)."""

    ids: torch.Tensor  # [b]
    positions: torch.Tensor  # [b]
    slots: torch.Tensor  # [b] the cache rows the b tokens' keys and values go to
    mask: torch.Tensor  # [b, C] additive, over every row of the cache

    @classmethod
    def empty(cls, bucket: int, capacity: int, dtype: torch.dtype, device: torch.device) -> "StepInputs":
        ids = torch.zeros(bucket, dtype=torch.long, device=device)
        return cls(ids, ids.clone(), ids.clone(), torch.zeros(bucket, capacity, dtype=dtype, device=device))

    def fill(self, ids: torch.Tensor, positions: torch.Tensor, past: int, mask: torch.Tensor | None) -> None:
        """n real tokens at cache rows past.., then padding: token 0 at position 0, seeing the cached rows and
        itself (a row that sees nothing would turn to NaN and write NaN keys into the cache)."""
        n, bucket = ids.shape[0], self.ids.shape[0]
        self.ids.zero_()
        self.ids[:n] = ids
        self.positions.zero_()
        self.positions[:n] = positions
        torch.arange(past, past + bucket, out=self.slots)
        self.mask.fill_(torch.finfo(self.mask.dtype).min)
        self.mask[:, :past] = 0
        self.mask[:, past : past + bucket].fill_diagonal_(0)
        if mask is not None:
            self.mask[:n, past : past + n] = mask


@dataclass
class _Graph:
    graph: "torch.cuda.CUDAGraph"
    inputs: StepInputs
    out: torch.Tensor  # [b, H]
    cache: tuple[torch.Tensor, torch.Tensor]  # the storage the graph writes: alive while the graph may replay


class StepGraphs:
    """CUDA graphs of the static step, one per (cache storage, capacity, bucket), captured on first use.

    A graph holds the addresses of the cache it was captured on, so a cache that grows (a new block) or another
    document's cache gets graphs of its own; the least recently used are dropped past GRAPHS_KEPT."""

    def __init__(self, lean):  # the LeanLlama whose static step (`_static`) is captured
        self.lean = lean
        self.graphs: OrderedDict[tuple[int, int, int], _Graph] = OrderedDict()
        self.captures = 0

    def replay(self, cache, bucket: int, fill: Callable[[StepInputs], None]) -> torch.Tensor:
        key = (cache.k.data_ptr(), cache.capacity, bucket)
        entry = self.graphs.get(key)
        if entry is None:
            inputs = StepInputs.empty(bucket, cache.capacity, self.lean.dtype, self.lean.device)
            fill(inputs)
            entry = self.graphs[key] = self._capture(cache, inputs)
            while len(self.graphs) > GRAPHS_KEPT:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
            fill(entry.inputs)
        entry.graph.replay()
        return entry.out

    def _capture(self, cache, inputs: StepInputs) -> _Graph:
        device = self.lean.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS handles, workspaces): the same step, twice
            for _ in range(2):
                self.lean._static(inputs, cache)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.lean._static(inputs, cache)
        self.captures += 1
        return _Graph(graph, inputs, out, (cache.k, cache.v))
