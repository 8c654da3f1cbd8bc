"""A .gguf's own weight blocks, for the gguf mode (`--dtype gguf`): its Q8_0, Q5_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K
tensors read raw (gguf_header's tensor table, the file memory-mapped) as blocks of 32 small integers with their
scales (and mins), named by the transformers module they fill.

transformers dequantizes a .gguf to fp32 with the blocks' own formula (gguf-py's: w = d x q, d x q + m,
(d x sc) x q - dmin x mn...), so a block read here is kept only where that formula, computed as gguf-py computes
it, equals the loaded module's weight exactly; llama's q and k rows are stored permuted in a .gguf (transformers
un-permutes them), so that row order is tried too. A tensor of another type (F16, IQ4_XS...) or one that does not
match has no blocks here, and the engine quantizes its fp32 weight to Q8_0 instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

# the GGUF block types kept as they are, and their panels' format code (quant_matmul.FORMATS: 8, 5, 4 the one-scale
# widths; 41, 42, 52, 62 Q4_1, Q4_K, Q5_K, Q6_K)
BITS = {"Q8_0": 8, "Q5_0": 5, "Q4_0": 4, "Q4_1": 41, "Q4_K": 42, "Q5_K": 52, "Q6_K": 62}
SUPERBLOCK = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256}  # the kinds whose K must be whole superblocks
_ATTR = "_rest_lsp_gguf"  # where a loaded model keeps the path of the .gguf it came from


@dataclass(frozen=True)
class Blocks:
    """A weight [N, K] as blocks of 32 quants (quant_matmul.pack_blocks' arguments; `bits` the format's code):
    - Q8_0, Q5_0, Q4_0 (8, 5, 4): w[n, 32 b + i] = quants[n, b, i] x scales[n, b]; quants in [-128, 127],
      [-16, 15], [-8, 7];
    - Q4_1 (41): w = quants x scales[n, b] + mins[n, b]; quants in [0, 15];
    - Q4_K, Q5_K (42, 52): w = (scales[n, b / 8] x sub_scales[n, b]) x quants - mins[n, b / 8] x sub_mins[n, b]
      (d, dmin per superblock of 8 blocks; the 6-bit sc, mn per block); quants in [0, 15], [0, 31];
    - Q6_K (62): w = (scales[n, b / 8] x sub_scales[n, b, i / 16]) x quants; quants in [-32, 31].
    Each dequantizes in fp32 as gguf-py (and so transformers) does, bit for bit."""

    bits: int
    quants: torch.Tensor  # int8 [N, K/32, 32]
    scales: torch.Tensor  # fp16 [N, K/32], or [N, K/256] for the K-quants
    mins: torch.Tensor | None = None  # fp16, as scales (Q4_1, Q4_K, Q5_K)
    sub_scales: torch.Tensor | None = None  # int8 [N, K/32] (Q4_K, Q5_K) or [N, K/32, 2] (Q6_K)
    sub_mins: torch.Tensor | None = None  # int8 [N, K/32] (Q4_K, Q5_K)

    def fields(self) -> dict[str, torch.Tensor]:
        """The tensors that are set, by name (pack_blocks' keywords)."""
        return {name: t for name in ("quants", "scales", "mins", "sub_scales", "sub_mins")
                if (t := getattr(self, name)) is not None}

    def dequantized(self) -> torch.Tensor:
        from rest_lsp.kernels import quant_matmul

        f0, f1 = quant_matmul.factors(self.bits, self.scales, self.mins, self.sub_scales, self.sub_mins)
        q = self.quants.float()
        if self.bits in quant_matmul.SPLIT:
            w = torch.cat([q[..., :16] * f0[..., None], q[..., 16:] * f1[..., None]], -1)
        else:
            w = q * f0[..., None]
            if f1 is not None:
                w = w + f1[..., None]
        return w.reshape(self.quants.shape[0], -1)


def attach(model, path: str | Path) -> None:
    """Records on a model loaded from a .gguf which file it came from (the gguf mode reads its blocks there)."""
    model.__dict__[_ATTR] = str(path)


def source(model) -> str | None:
    return model.__dict__.get(_ATTR)


BLOCK_BYTES = {"Q8_0": 34, "Q5_0": 22, "Q4_0": 18, "Q4_1": 20, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def decode(raw: np.ndarray, kind: str, k: int) -> Blocks:
    """A GGUF tensor's raw bytes [N, K/block x block bytes] of type `kind` (a key of BITS) -> its Blocks, as ggml
    lays them out (gguf-py's dequantize is the reference):
    Q8_0: fp16 d, 32 int8. Q5_0: fp16 d, 32 high bits (uint32), 16 bytes of nibbles (element j the low nibble of
    byte j, element j + 16 its high one), q - 16. Q4_0: fp16 d, the 16 bytes of nibbles, q - 8. Q4_1: fp16 d, fp16
    m, the nibbles. Q4_K: per 256, fp16 d, dmin, 12 bytes of 6-bit sc and mn (`_scale_min`), 128 bytes of nibbles
    (bytes 32 c.. hold block 2 c low, 2 c + 1 high). Q5_K: d, dmin, the 12, 32 bytes of fifth bits (block i's in
    bit i), the nibbles. Q6_K: 128 bytes of low nibbles (64 c..: blocks 4 c, 4 c + 1 low, 4 c + 2, 4 c + 3 high),
    64 of high 2-bit pairs (32 c..: blocks 4 c + j at bits 2 j), 16 int8 scales (one per 16), fp16 d; q - 32."""
    raw = np.ascontiguousarray(raw).view(np.uint8)
    n = raw.shape[0]
    per = SUPERBLOCK.get(kind, 32)
    blocks = raw.reshape(n, k // per, BLOCK_BYTES[kind])

    def half(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.float16)[..., 0].copy())

    def int8(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a).astype(np.int8))

    if kind in ("Q8_0", "Q5_0", "Q4_0", "Q4_1"):
        size = BLOCK_BYTES[kind]
        scales = half(blocks[..., :2])
        if kind == "Q8_0":
            return Blocks(8, torch.from_numpy(blocks[..., 2:].copy()).view(torch.int8), scales)
        nibbles = blocks[..., size - 16 :]
        q = np.concatenate([nibbles & 15, nibbles >> 4], -1).astype(np.int16)  # [N, nb, 32]
        if kind == "Q4_1":
            return Blocks(41, int8(q), scales, mins=half(blocks[..., 2:4]))
        if kind == "Q4_0":
            return Blocks(4, int8(q - 8), scales)
        high = np.ascontiguousarray(blocks[..., 2:6]).view("<u4")  # [N, nb, 1]: bit j is element j's fifth bit
        fifth = (high >> np.arange(32, dtype=np.uint32)) & 1
        return Blocks(5, int8(q + 16 * fifth.astype(np.int16) - 16), scales)
    ns = k // 256
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = half(blocks[..., 0:2]), half(blocks[..., 2:4])
        sc, mn = _scale_min(blocks[..., 4:16])  # [N, ns, 8] each
        qs = blocks[..., -128:].reshape(n, ns, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
        q = (qs & 15).reshape(n, ns * 8, 32).astype(np.int16)
        if kind == "Q5_K":
            qh = blocks[..., 16:48].reshape(n, ns, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
            q = q + 16 * (qh & 1).reshape(n, ns * 8, 32).astype(np.int16)
        return Blocks(BITS[kind], int8(q), d, mins=dmin, sub_scales=int8(sc.reshape(n, ns * 8)),
                      sub_mins=int8(mn.reshape(n, ns * 8)))
    ql = blocks[..., :128].reshape(n, ns, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    ql = (ql & 15).reshape(n, ns * 8, 32).astype(np.int16)
    qh = blocks[..., 128:192].reshape(n, ns, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    qh = (qh & 3).reshape(n, ns * 8, 32).astype(np.int16)
    sc = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).reshape(n, ns * 8, 2)
    return Blocks(62, int8(ql + 16 * qh - 32), half(blocks[..., 208:210]), sub_scales=torch.from_numpy(sc.copy()))


def _scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's 12 bytes a superblock [..., 12] -> the 8 blocks' 6-bit scales and mins [..., 8] each:
    bytes 0-3 hold sc 0-3 (low 6 bits) and sc 4-7's top 2; 4-7 mn 0-3 and mn 4-7's top 2; 8-11 sc 4-7's low
    nibble and mn 4-7's high one."""
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], -1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], -1)
    return sc, mn


def llama_rows(blocks: Blocks, heads: int) -> Blocks:
    """The rows of a llama q or k weight in transformers' order, from a .gguf's (as transformers' reverse_permute
    reorders the dequantized weight)."""

    def order(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0]
        return t.reshape(heads, n // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape).contiguous()

    return Blocks(blocks.bits, **{name: order(t) for name, t in blocks.fields().items()})


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
        """The file's blocks of tensor `name` when it is of a kind kept (BITS) and they dequantize to `weight` [N, K]
        exactly (in the file's row order, or for llama's q and k in transformers' one); else None."""
        tensor = self.tensors.get(name)
        kind = getattr(getattr(tensor, "tensor_type", None), "name", None)
        if tensor is None or kind not in BITS:
            return None
        n, k = weight.shape
        if k % SUPERBLOCK.get(kind, 32) or tuple(int(s) for s in tensor.shape) != (k, n):
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
            log.warning("%d tensors of %s are blocks of a kept type that do not dequantize to the loaded weights "
                        "(first: %s): they run requantized to Q8_0.", len(self.unmatched), Path(self.path).name,
                        self.unmatched[0])
        log.info("gguf mode: %s of %s's tensors run on their own blocks (%s); the others are requantized to Q8_0.",
                 len(self.kept), Path(self.path).name, self.kept_counts() or "none")

    def kept_counts(self) -> str:
        """How many tensors of each type kept their blocks, e.g. "Q5_0 132, Q8_0 13, Q4_K 36, Q6_K 13"."""
        return ", ".join(f"{kind} {count}" for kind, bits in BITS.items()
                         if (count := sum(1 for b in self.kept.values() if b == bits)))

