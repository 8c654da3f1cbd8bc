"""The quantized kernel's row tiles (rest_lsp/kernels/quant_matmul.c): every number of rows a call, 1 to 33 (every
tile size up to 16 and calls of two and three tiles), gives each row the bits it has alone and on the dispatched
level, at every width and level; and a block's integer sums stay exact at their extremes, where the AVX2 path adds
products in int16."""

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
            alone = torch.cat([quant_matmul.quant_mm(x[i : i + 1], panels, n, bias, lib=lib, bits=bits)
                               for i in range(33)])
            assert torch.equal(alone, want), bits
            for m in range(1, 34):
                assert torch.equal(quant_matmul.quant_mm(x[:m], panels, n, bias, lib=lib, bits=bits), want[:m]), \
                    (bits, m)
                assert torch.equal(quant_matmul.quant_mm(x[33 - m :], panels, n, None, lib=lib, bits=bits),
                                   quant_matmul.quant_mm(x[33 - m :], panels, n, None, lib=mine, bits=bits)), (bits, m)
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
