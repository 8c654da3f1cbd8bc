"""The CPU matmul of a quantized model's step: Q8_0 weights (32 int8 and one fp16 scale a block, llama.cpp's format)
multiplied with the CPU's integer dot products, never widened to 16 or 32 bits in memory.

A step of a quantized model is a pass over every weight for a handful of rows. Kept as Q8_0 a weight is 8.5 bits,
a quarter of fp32's bytes and about half of fp16's, so the pass streams that much less. The arithmetic is
llama.cpp's for Q8_0 x Q8_0:

  - each input row is quantized per block of 32 (d = max|x| / 127, q = x / d rounded to the nearest, ties to
    even), once per call;
  - a block's 32 products are summed exactly in int32 (integer dot products), then the block's term
    float(sum) * (d_w * d_x) is added to the output with one fused multiply-add, block after block in k order.

Each output is that same chain of operations whatever the rows beside it and whatever the instruction set, so a
row's result is bit for bit the same alone or in a tree of 16 (REST = plain decoding in this mode), and the
AVX-512, AVX-VNNI, AVX2 and portable builds agree bit for bit (tests/engine/test_quant_matmul.py).

Layout (`pack`): the weight [N, K] becomes panels of 16 output columns; a panel is its K/32 blocks of quants, each
block 8 groups x 16 columns x 4 consecutive k as bytes q + 128 (one 64-byte vector a group: the unsigned operand
of `vpdpbusd`, whose 16 int32 lanes are the 16 columns), followed by the blocks' fp16 scales [K/32][16], padded to
64 bytes. The weight's +128 comes back out exactly as 128 x (the row block's sum of q), known from the
quantization. A GGUF's Q5_0 and Q4_0 blocks are Q8_0 blocks of small quants (q - 16 in [-16, 15], q - 8 in
[-8, 7]) with the same per-32 fp16 scale, so they keep fewer bits in their panels (`pack_blocks(..., bits)`): a
4-bit block is 4 vectors of nibbles q + 8 (groups 2j in the low nibbles, 2j + 1 in the high ones), a 5-bit block
the nibbles of q + 16 the same way and then a 64-byte plane of the fifth bits (byte i's bit g: group g's byte i,
which a shift and a mask make 0x10 or 0 on every level). The kernel unpacks a block to the bytes q + offset and
runs the 8-bit arithmetic on them, the offset (16, 8) taken out as 128 is: the
integer sums, and so every float operation after them, are those of the same values as 8-bit blocks, bit for
bit. Paths, by the level a library is built for (levels.py): AVX-512 VNNI (zmm, up to 12 rows a tile with the
block's weights in registers), AVX-VNNI (ymm), AVX2 (`vpmaddubsw` over |w| and x signed as w, no saturation
since |x| <= 127; 4- and 5-bit blocks' products q + offset times x added in int16 over 8 or 4 groups, which cannot
overflow), portable C. AVX-VNNI and AVX2 take up to 16 rows a tile: a block is unpacked (on AVX2 also made signed
and absolute) once into L1 for all of them, so a tree step streams each panel once. The panels are split between
torch's OpenMP threads as in panel_matmul.py.

K-quant formats (`FORMATS`: Q4_1, Q4_K, Q5_K, Q6_K, as a GGUF holds them; `pack_blocks(..., bits, mins,
sub_scales, sub_mins)`): their quants are stored as the 4-bit ones are (Q4_1, Q4_K: q in [0, 15], offset 0), the
5-bit ones (Q5_K: q in [0, 31]) or as nibbles and then two 64-byte vectors of their top 2 bits (Q6_K: q + 32 in
[0, 63]; vector j's byte i holds group 4 j + c's at bits 2 c), and a block has two
float terms, each one fused multiply-add: Q4_1 and Q4_K/Q5_K a min term, min x (the row block's sum of quants,
known exactly from the quantization, as llama.cpp's Q8_1 and Q8_K keep it), with factors d and m (Q4_1) or
d x sc and -(dmin x mn) (K: fp16 d and dmin per superblock of 256, 6-bit sc and mn per block of 32, kept as
such in the panel); Q6_K two integer sums a block, one per 16 weights, each with its d x sc. Every factor is an
exact fp32 product, so each level computes the same floats. Their panels never go to the AMX tiles.

A prefill's many rows run on AMX-INT8 tiles where the CPU has them (compiled for a target with AMX-INT8, the tile
state granted to the process by Linux; from `amx_rows()` rows a call): a panel's blocks unpacked once to their
signed quants (a block is one B tile, 8 x 64 bytes), then per 16 rows and block one TDPBSSD of the rows' 32 quants
(an A tile) makes the block's exact int32 sums, the very integers the VNNI tiles make, and each row then takes the
VNNI tiles' float operations on them in their order. Same integers, same float operations: the same results bit
for bit, whichever tiles a row ran on and whatever rows were beside it (`without_amx` turns them off to compare).

The C is quant_matmul.c, built per level and loaded by loader.py's one path, then checked against a reference
product before use; where it cannot be built or the cache folder is not this user's alone, `available()` is False.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging

import torch

from rest_lsp.kernels.buffers import extent, outcome
from rest_lsp.kernels.loader import Kernel, register

log = logging.getLogger(__name__)

PANEL = 16  # output columns per panel
BLOCK = 32  # weights per Q8_0 block (one scale)
SUPERBLOCK = 256  # weights per K-quant superblock (Q4_K, Q5_K, Q6_K: one d, and dmin, per 8 blocks)
BITS = (8, 5, 4)  # the widths of the one-scale formats (Q8_0, Q5_0, Q4_0), their codes too
# each panel format's code (the kernel's `bits` argument): the one-scale widths, and the formats with two terms a
# block (see "K-quant formats" below)
FORMATS = {"Q8_0": 8, "Q5_0": 5, "Q4_0": 4, "Q4_1": 41, "Q4_K": 42, "Q5_K": 52, "Q6_K": 62}
CODES = tuple(FORMATS.values())
WIDTHS = {8: 8, 5: 5, 4: 4, 41: 4, 42: 4, 52: 5, 62: 6}  # the bits a quant is stored in, by code
BLOCK_BYTES = {code: 512 if w == 8 else 256 + 64 * (w - 4) for code, w in WIDTHS.items()}  # a panel's per block
OFFSETS = {8: 128, 5: 16, 4: 8, 41: 0, 42: 0, 52: 0, 62: 32}  # what a quant is stored as plus
MINS = (41, 42, 52)  # a min term a block: w = f0 q + f1
SPLIT = (62,)  # a scale per 16 weights: w = f0 q (first half), f1 q (second half)
SUPER = (42, 52, 62)  # scales per superblock of 8 blocks


PATHS = {3: "AVX-512 VNNI", 2: "AVX-VNNI", 1: "AVX2", 0: "portable C"}
AMX = "AMX-INT8"  # what path_name adds where the library's many-row calls run on AMX tiles
# -ffp-contract=off: every multiply and add rounds where the source says (the fused ones are written as such); the
# level's flags follow (levels.py)
FLAGS = ("-O3", "-ffp-contract=off", "-shared", "-fPIC")
LIBS = ("-lm",)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    ll, vp = ctypes.c_longlong, ctypes.c_void_p
    # x, xn, m, k, w, wn, n, bits, bias, bn, y, yn, threads (xn...: the elements each buffer holds)
    lib.quant_mm.argtypes = [vp, ll, ll, ll, vp, ll, ll, ctypes.c_int, vp, ll, vp, ll, ctypes.c_int]
    lib.quant_mm.restype = ctypes.c_int
    lib.quant_rows.argtypes = [vp, ll, ll, ll, vp, ll, vp, ll, vp, ll]  # x, xn, m, k, xq, xqn, xd, xdn, xs, xsn
    lib.quant_rows.restype = ctypes.c_int
    lib.quant_path.restype = ctypes.c_int
    lib.quant_threaded.restype = ctypes.c_int
    lib.quant_amx.restype = ctypes.c_int
    lib.quant_set_amx.argtypes = [ctypes.c_int]
    lib.quant_set_amx.restype = ctypes.c_int
    lib.quant_amx_rows.restype = ctypes.c_int
    return lib


def _checked(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` once it computes a small product with partial panels, blocks and tiles as the reference does, at
    every width (ValueError if not): a compiler that miscompiles it must not reach a step. Where it has AMX tiles,
    a product of enough rows for them (full and partial 16-row tiles) too, and bit for bit as without them."""
    gen = torch.Generator().manual_seed(0)
    rows = 13 if not lib.quant_amx() else lib.quant_amx_rows() + 37  # 16-row tiles: full ones and a partial one
    weight, bias, x = (torch.randn(*shape, generator=gen) for shape in ((50, 200), (50,), (rows, 200)))

    def product(bits: int, panels: torch.Tensor, m: int, amx: bool) -> torch.Tensor:
        got = torch.empty(m, 50)
        before = lib.quant_set_amx(int(amx))
        try:
            ran = call(lib, x[:m], panels, 50, bits, bias, got, 1)
        finally:
            lib.quant_set_amx(before)
        if ran != amx:
            raise ValueError(f"its {m} rows ran {'without' if amx else 'on'} AMX tiles")
        return got

    for bits in BITS:
        q, d = quantize_q8_0(weight)
        if bits != 8:
            q = q.clamp(-OFFSETS[bits], OFFSETS[bits] - 1)
        panels, want = pack_blocks(q, d, bits), reference_blocks(x, q, d, bias)
        got = product(bits, panels, 13, False)
        if not torch.allclose(got, want[:13], rtol=1e-5, atol=1e-4):
            raise ValueError(f"its results differ from the reference's ({bits}-bit blocks)")
        if lib.quant_amx():
            tiles = product(bits, panels, rows, True)
            if not torch.allclose(tiles, want, rtol=1e-5, atol=1e-4):
                raise ValueError(f"its AMX results differ from the reference's ({bits}-bit blocks)")
            if not torch.equal(tiles, product(bits, panels, rows, False)):
                raise ValueError(f"its AMX results are not its VNNI results bit for bit ({bits}-bit blocks)")
    x2 = torch.randn(13, SUPERBLOCK, generator=gen)
    for bits in CODES[len(BITS):]:  # the two-term formats, a superblock wide (never on AMX tiles)
        blocks = random_blocks(bits, 50, SUPERBLOCK, gen)
        got = torch.empty(13, 50)
        call(lib, x2, pack_blocks(**blocks, bits=bits), 50, bits, bias, got, 1)
        want = reference_blocks(x2, blocks["quants"], blocks["scales"], bias, bits,
                                **{k: v for k, v in blocks.items() if k not in ("quants", "scales")})
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-4 * float(want.abs().max())):
            raise ValueError(f"its results differ from the reference's (format {bits})")
    if not lib.quant_threaded():
        log.warning("The quantized kernel was built without OpenMP: its matmuls run on one thread.")
    return lib


KERNEL = Kernel("quant_matmul", FLAGS, LIBS, _bind, _checked,
                "the quantized modes cannot run")


def library(level: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernel of `level` (the dispatcher's by default; another level this CPU executes for the tests
    and benchmarks), built and checked on first use; None where it cannot be (said once)."""
    return KERNEL.library(level)


def available() -> bool:
    return library() is not None


def path_name(lib: ctypes.CDLL | None = None) -> str:
    """The instruction set a library's dot products run on ("AVX-512 VNNI", "AVX-VNNI", "AVX2", "portable C"),
    with " + AMX-INT8" where its calls of many rows run on AMX tiles (`amx_available`)."""
    lib = lib or library()
    if lib is None:
        return "none"
    return PATHS[lib.quant_path()] + (f" + {AMX}" if lib.quant_amx() else "")


def build_name(lib: ctypes.CDLL | None = None) -> str:
    """Which build a library is: its file's name, `{stem}-{level}-{key}` (loader.py: the key a hash of the source,
    flags and compiler, recorded by `loader.build_and_load`); "none" without one, "unknown" for a library loaded
    elsewhere. What was measured on one build is not another's."""
    lib = lib or library()
    return "none" if lib is None else getattr(lib, "_rest_lsp_build", "unknown")


def amx_available(lib: ctypes.CDLL | None = None) -> bool:
    """Whether `lib` (the machine's own by default) has AMX-INT8 tiles compiled in and this process may use them:
    then its calls of `amx_rows(lib)` rows or more run on them, with the same results bit for bit."""
    lib = lib or library()
    return lib is not None and bool(lib.quant_amx())


def amx_rows(lib: ctypes.CDLL | None = None) -> int:
    """The fewest rows a call runs on AMX tiles where it can."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the quantized kernel is not available on this machine")
    return lib.quant_amx_rows()


@contextlib.contextmanager
def without_amx(lib: ctypes.CDLL | None = None):
    """Within it, `lib`'s calls (from any thread: the setting is the library's) run on the VNNI tiles alone: the
    tests compare the two."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the quantized kernel is not available on this machine")
    before = lib.quant_set_amx(0)
    try:
        yield lib
    finally:
        lib.quant_set_amx(before)


def random_blocks(bits: int, n: int, k: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Random blocks of format `bits` (a code of FORMATS) for a weight [n, k] (k a multiple of 256 for the
    superblock formats), each field's extremes included: `pack_blocks`' keyword arguments."""
    gen = generator or torch.Generator().manual_seed(0)
    nb, off, width = -(-k // BLOCK), OFFSETS[bits], WIDTHS[bits]
    q = torch.randint(-off, (1 << width) - off, (n, nb, BLOCK), generator=gen, dtype=torch.int8)
    q[0, 0], q[-1, -1] = -off, (1 << width) - off - 1  # a block of every stored bit 0, one of every bit 1
    per = nb // 8 if bits in SUPER else nb

    def half(*shape, sign=False):
        t = torch.rand(*shape, generator=gen) * 0.05 + 1e-3
        return (t * (torch.randint(0, 2, shape, generator=gen) * 2 - 1) if sign else t).half()

    out = {"quants": q, "scales": half(n, per)}
    if bits in MINS:
        out["mins"] = half(n, per, sign=bits == 41)
    if bits in (42, 52):
        out["sub_scales"] = torch.randint(0, 64, (n, nb), generator=gen, dtype=torch.int8)
        out["sub_mins"] = torch.randint(0, 64, (n, nb), generator=gen, dtype=torch.int8)
        out["sub_scales"][0, 0], out["sub_mins"][-1, -1] = 63, 63
    if bits == 62:
        out["sub_scales"] = torch.randint(-128, 128, (n, nb, 2), generator=gen, dtype=torch.int8)
        out["sub_scales"][0, 0, 0], out["sub_scales"][-1, -1, 1] = -128, 127
    return out


# -- Q8_0 blocks ---------------------------------------------------------------------------------------------------

def quantize_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (quants int8 [N, K/32, 32], scales fp16 [N, K/32]) as llama.cpp's quantize_row_q8_0 makes
    them (d = max|w| / 127; q = w / d rounded half away from zero), K padded with zeros to a multiple of 32.
    Weights that were Q8_0 blocks (dequantized: q x d) come back as those blocks exactly."""
    w = weight.detach().float()
    n, k = w.shape
    nb = -(-k // BLOCK)
    if nb * BLOCK != k:
        w = torch.nn.functional.pad(w, (0, nb * BLOCK - k))
    w = w.reshape(n, nb, BLOCK)
    d = w.abs().amax(-1) / 127.0  # [N, nb]
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    v = w * inv[..., None]
    q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).to(torch.int8)
    return q, d.half()


def from_gguf_q8_0(raw: torch.Tensor | "object", k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF Q8_0 tensor's raw bytes [N, K/32 * 34] (gguf.GGUFReader's `data`: per block an fp16 scale, then 32
    int8) -> (quants int8 [N, K/32, 32], scales fp16 [N, K/32])."""
    raw = torch.as_tensor(raw).view(torch.uint8)
    n = raw.shape[0]
    blocks = raw.reshape(n, k // BLOCK, 2 + BLOCK)
    return blocks[..., 2:].contiguous().view(torch.int8), blocks[..., :2].contiguous().view(torch.float16)[..., 0]


def tail_bytes(nb: int, bits: int = 8) -> int:
    """The bytes of a panel's scales after its quants (the C's `tail_bytes`)."""
    if bits in BITS:
        return nb * PANEL * 2
    if bits == 41:
        return nb * PANEL * 4
    ns = nb // 8
    return ns * PANEL * 2 + nb * PANEL * 2 if bits == 62 else ns * PANEL * 4 + nb * PANEL * 2


def panel_bytes(k: int, bits: int = 8) -> int:
    nb = -(-k // BLOCK)
    return nb * BLOCK_BYTES[bits] + -(-tail_bytes(nb, bits) // 64) * 64


def panels_shape(n: int, k: int, bits: int = 8) -> tuple[int, int]:
    """The shape of an [n, k] weight's panels (`pack_blocks`' output): (panels, bytes a panel)."""
    return -(-n // PANEL), panel_bytes(k, bits)


def _columns(t: torch.Tensor, count: int) -> torch.Tensor:
    """A per-row tensor [count x 16, a, ...] -> the panels' bytes of it [count, a x ... x 16 x itemsize]: per
    panel, its 16 columns last (the C reads [a][...][16])."""
    rest = t.shape[1:]
    t = t.reshape(count, PANEL, -1).transpose(1, 2).contiguous()  # [P, a x ..., 16]
    return t.view(torch.uint8).reshape(count, -1) if t.dtype != torch.uint8 else t.reshape(count, -1)


def pack_blocks(quants: torch.Tensor, scales: torch.Tensor, bits: int = 8, mins: torch.Tensor | None = None,
                sub_scales: torch.Tensor | None = None, sub_mins: torch.Tensor | None = None) -> torch.Tensor:
    """Blocks -> panels uint8 [ceil(N / 16), panel_bytes(K, bits)] (see the module's docstring), the columns past N
    zero. `bits` is the format's code (FORMATS); quants int8 [N, nb, 32] in [-OFFSETS, 2^WIDTHS - OFFSETS)
    (ValueError for one outside). Q8_0, Q5_0, Q4_0 (8, 5, 4): scales fp16 [N, nb]. Q4_1 (41): scales, mins fp16
    [N, nb] (d, m). Q4_K, Q5_K (42, 52; nb a multiple of 8): scales, mins fp16 [N, nb / 8] (d, dmin), sub_scales,
    sub_mins int8 [N, nb] (sc, mn in [0, 63]). Q6_K (62): scales fp16 [N, nb / 8] (d), sub_scales int8 [N, nb, 2]
    (a scale per 16 weights)."""
    if bits not in CODES:
        raise ValueError(f"no {bits}-bit panels: use one of {CODES}")
    n, nb, _ = quants.shape
    off, width = OFFSETS[bits], WIDTHS[bits]
    if bits not in BITS and n and (int(quants.min()) < -off or int(quants.max()) >= (1 << width) - off):
        raise ValueError(f"format {bits}'s panels hold quants in [{-off}, {(1 << width) - off - 1}]")
    if bits != 8 and bits in BITS and n and (int(quants.min()) < -off or int(quants.max()) >= off):
        raise ValueError(f"{bits}-bit panels hold quants in [{-off}, {off - 1}]")
    if bits in SUPER and nb % 8:
        raise ValueError(f"format {bits}'s panels take whole superblocks of 256 weights, not {nb * BLOCK}")
    count = -(-n // PANEL)

    def padded(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(count * PANEL, *t.shape[1:], dtype=t.dtype)
        out[:n] = t
        return out

    q = padded(quants)
    # [P, 16 cols, nb, 8 groups, 4] -> [P, nb, 8, 16 x 4]: the bytes q + offset, as the kernel unpacks them
    u = (q.view(count, PANEL, nb, 8, 4).permute(0, 2, 3, 1, 4).reshape(count, nb, 8, 64).short() + off).to(torch.uint8)
    if width == 8:
        body = u.reshape(count, nb * 512)
    else:
        low = u & 15
        nibbles = low[:, :, 0::2] | (low[:, :, 1::2] << 4)  # [P, nb, 4, 64]: groups 2j low, 2j + 1 high
        parts = [nibbles.reshape(count, nb, 256)]
        if width == 5:  # byte i's bit g is group g's byte i's fifth bit
            fifth = ((u >> 4) & 1).long()  # [P, nb, 8 groups, 64 bytes]
            plane = (fifth << torch.arange(8).view(1, 1, 8, 1)).sum(2).to(torch.uint8)  # [P, nb, 64]
            parts.append(plane)
        if width == 6:  # vector j's byte i: the top 2 bits of group 4 j + c's byte i at bits 2 c
            top = u >> 4
            parts.append((top[:, :, 0::4] | (top[:, :, 1::4] << 2) | (top[:, :, 2::4] << 4) | (top[:, :, 3::4] << 6))
                         .reshape(count, nb, 128))
        body = torch.cat(parts, -1).reshape(count, nb * BLOCK_BYTES[bits])
    fields = [scales] + ([mins] if bits in MINS else []) + ([sub_scales] if bits in SUPER else []) + (
        [sub_mins] if bits in (42, 52) else [])
    if any(f is None for f in fields):
        raise ValueError(f"format {bits}'s panels need its scales" + (" and mins" if bits in MINS else ""))
    tail = torch.cat([_columns(padded(f.to(torch.float16 if f.is_floating_point() else torch.int8)), count)
                      for f in fields], 1)
    out = torch.zeros(count, panel_bytes(nb * BLOCK, bits), dtype=torch.uint8)
    out[:, : body.shape[1]] = body
    out[:, body.shape[1] : body.shape[1] + tail.shape[1]] = tail
    return out


def factors(bits: int, scales: torch.Tensor, mins: torch.Tensor | None = None, sub_scales: torch.Tensor | None = None,
            sub_mins: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A format's float factors per block, as the kernel computes them (fp32, exact products): (f0 [N, nb], f1
    [N, nb] or None); a block's weights are f0 q (+ f1 for MINS; Q6_K: f0 q on its first 16, f1 q on the rest)."""
    if bits in BITS:
        return scales.float(), None
    if bits == 41:
        return scales.float(), mins.float()
    d = scales.float().repeat_interleave(8, 1)  # [N, nb]: each superblock's d for its 8 blocks
    if bits == 62:
        return d * sub_scales[..., 0].float(), d * sub_scales[..., 1].float()
    return d * sub_scales.float(), -(mins.float().repeat_interleave(8, 1) * sub_mins.float())


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (float) -> Q8_0 panels (`quantize_q8_0`, `pack_blocks`)."""
    return pack_blocks(*quantize_q8_0(weight))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's quantization of input rows x [m, K] in torch: (quants int8 [m, nb, 32], scales fp32 [m, nb]),
    d = max|x| / 127, x / d ... as x * (1 / d) rounded half to even."""
    x = x.float()
    m, k = x.shape
    nb = -(-k // BLOCK)
    x = torch.nn.functional.pad(x, (0, nb * BLOCK - k)).reshape(m, nb, BLOCK)
    d = x.abs().amax(-1) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return torch.round(x * inv[..., None]).to(torch.int8), d


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernel computes, in float64 after the exact integer sums: sum over blocks of
    sum(qw qx) * float32(d_w d_x), + bias (the kernel adds the terms in fp32, one fused multiply-add each)."""
    return reference_blocks(x, *quantize_q8_0(weight), bias)


def reference_blocks(x: torch.Tensor, qw: torch.Tensor, dw: torch.Tensor, bias: torch.Tensor | None = None,
                     bits: int = 8, mins: torch.Tensor | None = None, sub_scales: torch.Tensor | None = None,
                     sub_mins: torch.Tensor | None = None) -> torch.Tensor:
    """`reference` for a weight given as blocks (`pack_blocks`' arguments): the exact integer sums, each times its
    fp32 factor x dx (as the kernel rounds it; a MINS format's min term f1 times the fp32 sum x dx), added in
    float64."""
    qx, dx = quantize_rows(x)
    f0, f1 = factors(bits, dw, mins, sub_scales, sub_mins)
    half = BLOCK // 2 if bits in SPLIT else BLOCK
    sums = torch.einsum("nbi,mbi->mnb", qw[..., :half].long(), qx[..., :half].long())  # [m, N, nb] exact
    out = (sums.double() * (f0[None] * dx[:, None]).double()).sum(-1)  # fp32 products, as the kernel's
    if f1 is not None and bits in SPLIT:  # Q6_K: the second half's sums, each times its fp32 f1 x dx
        second = torch.einsum("nbi,mbi->mnb", qw[..., half:].long(), qx[..., half:].long())  # [m, N, nb]
        out = out + (second.double() * (f1[None] * dx[:, None]).double()).sum(-1)
    elif f1 is not None:  # MINS: f1 times the row block's sum of quants x dx, rounded to fp32 once (the kernel's c)
        c = qx.long().sum(-1).float() * dx  # [m, nb]
        out = out + (f1[None].double() * c[:, None, :].double()).sum(-1)
    if bias is not None:
        out = out + bias.double()
    return out.float()


def quant_mm(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None = None,
             lib: ctypes.CDLL | None = None, bits: int = 8) -> torch.Tensor:
    """x [m, K] (fp32) times the weight in `panels` of `bits`-bit blocks (`pack`, `pack_blocks`) + bias -> [m, n]."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the quantized kernel is not available on this machine")
    if x.dim() != 2:
        raise ValueError(f"quant_mm: the input {list(x.shape)} must be rows [m, K]")
    x = x.contiguous()
    m, k = x.shape
    if (x.dtype != torch.float32 or panels.dtype != torch.uint8 or panels.dim() != 2 or bits not in CODES
            or (bits in SUPER and k % SUPERBLOCK) or panels.shape[1] != panel_bytes(k, bits)
            or panels.shape[0] * PANEL < n or n < 0
            or not panels.is_contiguous() or not (x.is_cpu and panels.is_cpu)
            or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous() or bias.numel() < n
                                      or not bias.is_cpu))):
        raise ValueError(f"quant_mm: input [{m}, {k}] {x.dtype} does not fit {bits}-bit panels {list(panels.shape)} "
                         f"{panels.dtype} for {n} outputs" + ("" if bias is None else f", bias [{bias.numel()}]"))
    y = torch.empty(m, n, dtype=torch.float32)
    if m:
        call(lib, x, panels, n, bits, bias, y, torch.get_num_threads())
    return y


def call(lib: ctypes.CDLL, x: torch.Tensor, panels: torch.Tensor, n: int, bits: int, bias: torch.Tensor | None,
         y: torch.Tensor, threads: int) -> int:
    """lib.quant_mm on these tensors, each pointer with the elements its storage holds from there (the C checks
    its sizes against them): 1 where the rows ran on AMX tiles, else 0; a ValueError or MemoryError in one
    sentence where it refused."""
    rc = lib.quant_mm(x.data_ptr(), extent(x), x.shape[0], x.shape[1], panels.data_ptr(), extent(panels), n, bits,
                      None if bias is None else bias.data_ptr(), 0 if bias is None else extent(bias),
                      y.data_ptr(), extent(y), threads)
    return outcome("quant_mm", rc, f"no panels of format {bits} for these rows")


def rows(x: torch.Tensor, lib: ctypes.CDLL | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's own quantization of x [m, K] (fp32): (quants int8 [m, nb, 32], scales [m, nb], sums of the
    quants int32 [m, nb]), what `quantize_rows` computes in torch."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the quantized kernel is not available on this machine")
    if x.dim() != 2 or x.dtype != torch.float32 or not x.is_cpu:
        raise ValueError(f"quant_rows: the input {list(x.shape)} {x.dtype} must be fp32 rows [m, K]")
    x = x.contiguous()
    m, k = x.shape
    nb = -(-k // BLOCK)
    xq, xd, xs = torch.empty(m, nb, BLOCK, dtype=torch.int8), torch.empty(m, nb), torch.empty(m, nb, dtype=torch.int32)
    outcome("quant_rows", lib.quant_rows(x.data_ptr(), extent(x), m, k, xq.data_ptr(), extent(xq), xd.data_ptr(),
                                         extent(xd), xs.data_ptr(), extent(xs)), "")
    return xq, xd, xs


def _op(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None, bits: int = 8) -> torch.Tensor:
    return quant_mm(x, panels, n, bias, bits=bits)


register("quant_mm(Tensor x, Tensor panels, int n, Tensor? bias, int bits=8) -> Tensor", _op)  # torch.ops.rest_lsp
