"""The quantized kernel's row tiles (rest_lsp/kernels/quant_matmul.c): every number of rows a call, 1 to 33 (every
tile size up to 16 and calls of two and three tiles), gives each row the bits it has alone and on the dispatched
level, at every format (Q8_0, Q5_0, Q4_0 and the two-term Q4_1, Q4_K, Q5_K, Q6_K) and level; and a block's integer
sums stay exact at their extremes, where the AVX2 path adds products in int16."""

import pytest
import torch

from rest_lsp.kernels import levels, quant_matmul
from kernel_support import library_of


def native():
    lib = quant_matmul.library()
    if lib is None:
        pytest.skip("no C compiler here builds the quantized kernel")
    return lib


def blocks(n, k, bits, seed):
    """Random `bits`-bit blocks (the extremes included) and fp16 scales."""
    gen = torch.Generator().manual_seed(seed)
    off = quant_matmul.OFFSETS[bits]
    q = torch.randint(-off, off, (n, -(-k // 32), 32), generator=gen, dtype=torch.int8)
    q[0] = -off
    q[1] = off - 1
    return q, (torch.rand(q.shape[:2], generator=gen) * 0.05 + 1e-3).half()


def formatted(bits, n, k, seed):
    """Random blocks of any format (`quant_matmul.random_blocks`, every field's extremes included) and their
    panels."""
    blocks = quant_matmul.random_blocks(bits, n, k, torch.Generator().manual_seed(seed))
    return blocks, quant_matmul.pack_blocks(**blocks, bits=bits)


def _rows_alone_and_together(x, panels, n, bias, lib, mine, bits, want):
    """The 33 rows of x on `lib`, one call each and every count 1..33 at once, equal `want` (those rows on `mine`)
    bit for bit, and every tail of rows equals `mine`'s without bias: a row's bits never depend on its neighbours."""
    alone = torch.cat([quant_matmul.quant_mm(x[i : i + 1], panels, n, bias, lib=lib, bits=bits) for i in range(33)])
    assert torch.equal(alone, want), bits
    for m in range(1, 34):
        assert torch.equal(quant_matmul.quant_mm(x[:m], panels, n, bias, lib=lib, bits=bits), want[:m]), (bits, m)
        assert torch.equal(quant_matmul.quant_mm(x[33 - m :], panels, n, None, lib=lib, bits=bits),
                           quant_matmul.quant_mm(x[33 - m :], panels, n, None, lib=mine, bits=bits)), (bits, m)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("level", levels.LEVELS)
def test_every_row_count_gives_each_row_its_own_bits_in_the_two_term_formats(level, threads):
    """Q4_1, Q4_K, Q5_K and Q6_K panels (3 panels, the last partial; 2 superblocks): each row's result is the same
    bits alone, in every call of 1 to 33 rows, and on every level as on the dispatched one; and it is the
    reference's product of the blocks' weights."""
    mine = native()
    lib = library_of(quant_matmul, level)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for bits in quant_matmul.CODES[len(quant_matmul.BITS):]:
            n, k = 40, 100 if bits == 41 else 512  # Q4_1: a partial block too
            blocks, panels = formatted(bits, n, k, bits)
            gen = torch.Generator().manual_seed(bits)
            bias, x = torch.randn(n, generator=gen), torch.randn(33, k, generator=gen)
            x[4, :32] = 0  # a row block of zeros
            want = quant_matmul.quant_mm(x, panels, n, bias, lib=mine, bits=bits)
            extra = {name: t for name, t in blocks.items() if name not in ("quants", "scales")}
            reference = quant_matmul.reference_blocks(x, blocks["quants"], blocks["scales"], bias, bits, **extra)
            torch.testing.assert_close(want, reference, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
            _rows_alone_and_together(x, panels, n, bias, lib, mine, bits, want)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("level", levels.LEVELS)
def test_the_two_term_formats_largest_sums_are_exact_on_every_level(level):
    """Every quant at its largest or smallest stored value (Q6_K's 6 bits: on AVX2 their products are summed over 2
    groups in int16) times rows of +-127, the scales 1 and the mins 0: each output is the exact integer sum, at
    every tile size; and a min alone (quants 0) gives -min x the row's sum of quants."""
    native()
    lib = library_of(quant_matmul, level)
    for bits in quant_matmul.CODES[len(quant_matmul.BITS):]:
        off, top = quant_matmul.OFFSETS[bits], (1 << quant_matmul.WIDTHS[bits]) - quant_matmul.OFFSETS[bits] - 1
        blocks, _ = formatted(bits, 32, 256, 0)
        q = torch.full((32, 8, 32), top, dtype=torch.int8)
        q[1::2] = -off  # odd columns the smallest quant
        q[4:8, :, 16:] = (top - off) - q[4:8, :, 16:]  # and some columns mixed: the largest and smallest swapped
        blocks["quants"] = q
        blocks["scales"] = torch.ones_like(blocks["scales"])
        for name in ("mins", "sub_mins"):
            if name in blocks:
                blocks[name] = torch.zeros_like(blocks[name])
        if "sub_scales" in blocks:
            blocks["sub_scales"] = torch.ones_like(blocks["sub_scales"])
        panels = quant_matmul.pack_blocks(**blocks, bits=bits)
        x = torch.full((17, 256), 127.0)  # each row block's scale 1: its quants +-127
        x[1::2] = -127.0
        x[2, 32:] = -127.0
        x[3, ::3] = -127.0
        want = (x.double() @ q.reshape(32, 256).double().T).float()  # the exact sums (all below 2^24)
        for m in (1, 2, 3, 4, 8, 16, 17):
            assert torch.equal(quant_matmul.quant_mm(x[:m], panels, 32, None, lib=lib, bits=bits), want[:m]), \
                (bits, m)
        if bits in quant_matmul.MINS:  # the min term alone: w = -dmin x mn (Q4_K, Q5_K) or m (Q4_1)
            blocks["quants"] = torch.zeros_like(q)
            blocks["scales"] = torch.zeros_like(blocks["scales"]) if bits == 41 else blocks["scales"]
            blocks["mins"] = torch.full_like(blocks["mins"], 0.5 if bits == 41 else -0.5)
            if "sub_mins" in blocks:
                blocks["sub_mins"] = torch.ones_like(blocks["sub_mins"])
            panels = quant_matmul.pack_blocks(**blocks, bits=bits)
            got = quant_matmul.quant_mm(x[:3], panels, 32, None, lib=lib, bits=bits)
            assert torch.equal(got, (x[:3].sum(1, keepdim=True) * 0.5).expand(3, 32)), bits


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("level", levels.LEVELS)
def test_every_row_count_gives_each_row_its_own_bits_on_every_level(level, threads):
    mine = native()
    lib = library_of(quant_matmul, level)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for bits in quant_matmul.BITS:
            n, k = 40, 100  # 3 panels (the last partial), 4 blocks (the last partial)
            q, d = blocks(n, k, bits, bits)
            panels, bias = quant_matmul.pack_blocks(q, d, bits), torch.randn(n)
            x = torch.randn(33, k, generator=torch.Generator().manual_seed(bits))
            x[4, :32] = 0  # a row block of zeros
            want = quant_matmul.quant_mm(x, panels, n, bias, lib=mine, bits=bits)
            _rows_alone_and_together(x, panels, n, bias, lib, mine, bits, want)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("level", levels.LEVELS)
def test_a_blocks_largest_sums_are_exact_on_every_level(level):
    """Every quant of a block at its largest or smallest value times rows of +-127: the largest sums a block makes
    (on AVX2, 4-bit products summed over 8 groups and 5-bit ones over 4 in int16), exact at every tile size."""
    native()
    lib = library_of(quant_matmul, level)
    for bits in quant_matmul.BITS:
        off = quant_matmul.OFFSETS[bits]
        q = torch.full((32, 2, 32), off - 1, dtype=torch.int8)
        q[1::2] = -off  # odd columns the smallest quant
        q[4:8, :, 16:] = -1 - q[4:8, :, 16:]  # and some columns mixed: the largest and smallest swapped
        d = torch.ones(32, 2, dtype=torch.float16)
        panels = quant_matmul.pack_blocks(q, d, bits)
        x = torch.full((17, 64), 127.0)  # each row block's scale 1: its quants +-127
        x[1::2] = -127.0
        x[2, 32:] = -127.0
        x[3, ::3] = -127.0
        want = (x.double() @ q.reshape(32, 64).double().T).float()  # the exact sums (all below 2^24)
        for m in (1, 2, 3, 4, 8, 16, 17):
            assert torch.equal(quant_matmul.quant_mm(x[:m], panels, 32, None, lib=lib, bits=bits), want[:m]), \
                (bits, m)
