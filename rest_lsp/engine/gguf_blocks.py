"""A .gguf's own weight blocks, for the gguf mode (`--dtype gguf`): its Q8_0, Q5_0 and Q4_0 tensors read raw
(gguf_header's tensor table, the file memory-mapped) as blocks of 32 small integers and one fp16 scale, named by the
transformers module they fill.

transformers dequantizes a .gguf to fp32 with the blocks' own formula (w = d x q), so a block read here is kept
only where d x q equals the loaded module's weight exactly; llama's q and k rows are stored permuted in a .gguf
(transformers un-permutes them), so that row order is tried too. A tensor of another type (Q4_K, Q6_K, F16...) or
one that does not match has no blocks here, and the engine quantizes its fp32 weight to Q8_0 instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

BITS = {"Q8_0": 8, "Q5_0": 5, "Q4_0": 4}  # the GGUF block types kept as they are, and their panels' width
_ATTR = "_rest_lsp_gguf"  # where a loaded model keeps the path of the .gguf it came from


@dataclass(frozen=True)
class Blocks:
    """A weight [N, K] as blocks: w[n, 32 b + i] = quants[n, b, i] x scales[n, b]."""

    bits: int  # 8, 5 or 4: the quants lie in [-128, 127], [-16, 15] or [-8, 7]
    quants: torch.Tensor  # int8 [N, K/32, 32]
    scales: torch.Tensor  # fp16 [N, K/32]

    def dequantized(self) -> torch.Tensor:
        return (self.quants.float() * self.scales.float()[..., None]).reshape(self.quants.shape[0], -1)


def attach(model, path: str | Path) -> None:
    """Records on a model loaded from a .gguf which file it came from (the gguf mode reads its blocks there)."""
    model.__dict__[_ATTR] = str(path)


def source(model) -> str | None:
    return model.__dict__.get(_ATTR)


def decode(raw: np.ndarray, kind: str, k: int) -> Blocks:
    """A GGUF tensor's raw bytes [N, K/32 x block bytes] of type `kind` (Q8_0, Q5_0, Q4_0) -> its Blocks.
    Q8_0: fp16 d, 32 int8. Q5_0: fp16 d, 32 high bits (uint32), 16 bytes of nibbles (element j the low nibble of
    byte j, element j + 16 its high one), q - 16. Q4_0: fp16 d, the 16 bytes of nibbles, q - 8."""
    raw = torch.from_numpy(np.array(raw, copy=True)).view(torch.uint8)
    n, nb = raw.shape[0], k // 32
    size = {"Q8_0": 34, "Q5_0": 22, "Q4_0": 18}[kind]
    blocks = raw.reshape(n, nb, size)
    scales = blocks[..., :2].contiguous().view(torch.float16)[..., 0]
    if kind == "Q8_0":
        return Blocks(8, blocks[..., 2:].contiguous().view(torch.int8), scales)
    nibbles = blocks[..., size - 16 :]
    q = torch.cat([nibbles & 15, nibbles >> 4], -1).short()  # [N, nb, 32]
    if kind == "Q4_0":
        return Blocks(4, (q - 8).to(torch.int8), scales)
    high = blocks[..., 2:6].contiguous().view(torch.int32)  # [N, nb, 1]: bit j is element j's fifth bit
    fifth = (high >> torch.arange(32, dtype=torch.int32)) & 1
    return Blocks(5, (q + 16 * fifth.short() - 16).to(torch.int8), scales)


def llama_rows(blocks: Blocks, heads: int) -> Blocks:
    """The rows of a llama q or k weight in transformers' order, from a .gguf's (as transformers' reverse_permute
    reorders the dequantized weight)."""

    def order(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0]
        return t.reshape(heads, n // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape).contiguous()

    return Blocks(blocks.bits, order(blocks.quants), order(blocks.scales))


class GgufWeights:
    """The blocks of one .gguf's tensors, looked up by GGUF tensor name and checked against the loaded weight."""

    def __init__(self, path: str | Path):
        from rest_lsp.engine import gguf_header

        self.path = str(path)
        header = gguf_header.read(self.path)  # the header and tensor table only, checked against the file's size
        self.tensors = header.tensors
        self.arch = header.arch
        self.heads = header.get(f"{self.arch}.attention.head_count", int)
        self.kv_heads = header.get(f"{self.arch}.attention.head_count_kv", int) or self.heads
        self.kept: dict[str, int] = {}  # tensor name -> the bits its panels keep
        self.unmatched: list[str] = []  # block tensors whose d x q is not the loaded weight (requantized instead)

    def head_name(self) -> str:
        """The LM head's tensor: output.weight, or the token embeddings where the model ties them."""
        return "output.weight" if "output.weight" in self.tensors else "token_embd.weight"

    @torch.no_grad()
    def blocks(self, name: str, weight: torch.Tensor) -> Blocks | None:
        """The file's blocks of tensor `name` when it is Q8_0, Q5_0 or Q4_0 and they dequantize to `weight` [N, K]
        exactly (in the file's row order, or for llama's q and k in transformers' one); else None."""
        tensor = self.tensors.get(name)
        kind = getattr(getattr(tensor, "tensor_type", None), "name", None)
        if tensor is None or kind not in BITS:
            return None
        n, k = weight.shape
        if k % 32 or tuple(int(s) for s in tensor.shape) != (k, n):
            self.unmatched.append(name)
            return None
        found = decode(tensor.data, kind, k)
        want = weight.detach().float().cpu()
        candidates = [found]
        heads = (self.heads if name.endswith("attn_q.weight")
                 else self.kv_heads if name.endswith("attn_k.weight") else None)
        if self.arch == "llama" and heads:
            candidates.append(llama_rows(found, int(heads)))
        for blocks in candidates:
            if torch.equal(blocks.dequantized(), want):
                self.kept[name] = blocks.bits
                return blocks
        self.unmatched.append(name)
        return None

    def report(self) -> None:
        """Says once what ran on the file's own blocks and what was requantized because it did not match."""
        if self.unmatched:
            log.warning("%d tensors of %s are Q8_0/Q5_0/Q4_0 blocks that do not dequantize to the loaded weights "
                        "(first: %s): they run requantized to Q8_0.", len(self.unmatched), Path(self.path).name,
                        self.unmatched[0])
        counts = {bits: sum(1 for b in self.kept.values() if b == bits) for bits in (8, 5, 4)}
        log.info("gguf mode: %s of %s's tensors run on their own blocks (8/5/4 bits: %d/%d/%d); the others are "
                 "requantized to Q8_0.", len(self.kept), Path(self.path).name, counts[8], counts[5], counts[4])

