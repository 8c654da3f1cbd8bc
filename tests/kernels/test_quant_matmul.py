"""Our Q8_0 integer kernel (rest_lsp/kernels/quant_matmul.py): the product llama.cpp's Q8_0 x Q8_0 arithmetic defines,
a row's result the same bit for bit whatever the rows beside it (one thread or two) and whichever thread computes its
panels, the AMX tiles' results the VNNI tiles' bit for bit, the AVX-VNNI, AVX2 and portable builds equal to the
machine's own bit for bit, 5- and 4-bit panels (Q5_0, Q4_0 blocks) equal to the 8-bit ones on the same values, a
GGUF's Q8_0 blocks kept exactly, the op under TorchScript, and a library that computes wrong results refused."""

import logging
import warnings

import numpy as np
import pytest
import torch

from rest_lsp.engine.matmuls import Matmul, QuantMatmul, pick_packing, q8_packs
from rest_lsp.kernels import levels, loader, quant_matmul
from kernel_support import PATHS, library_of


def native():
    lib = quant_matmul.library()
    if lib is None:
        pytest.skip("no C compiler here builds the quantized kernel")
    return lib


@pytest.mark.parametrize("n,k", [(16, 32), (50, 70), (96, 576), (7, 100), (1, 3), (130, 64)])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_kernel_computes_the_q8_0_product(n, k, bias):
    native()
    torch.manual_seed(n * 1000 + k)
    weight = torch.randn(n, k)
    b = torch.randn(n) if bias else None
    panels = quant_matmul.pack(weight)
    assert panels.shape == (-(-n // 16), quant_matmul.panel_bytes(k))
    for m in (1, 4, 5, 12, 13, 25):
        x = torch.randn(m, k)
        got = quant_matmul.quant_mm(x, panels, n, b)
        assert got.shape == (m, n)
        torch.testing.assert_close(got, quant_matmul.reference(x, weight, b), rtol=1e-5, atol=2e-5 * k**0.5)
        # and it is a quantized product: near F.linear's, not equal to it
        assert (got - torch.nn.functional.linear(x, weight, b)).abs().max() < 0.05 * k**0.5


def test_the_kernels_row_quantization_is_the_documented_one():
    lib = native()
    torch.manual_seed(1)
    x = torch.randn(5, 70) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 1.0])[:, None]
    x[4, 40:] = 0  # a block of zeros: scale 0, quants 0
    x[1, 32:40] = torch.tensor([127.0, 2.5, -3.5, 0.5, -0.5, 1.5, -126.5, 64.5])  # d = 1: ties, to even
    x[1, 40:64] = 0
    nb = 3
    xq, xd, xs = quant_matmul.rows(x, lib)
    assert xq.shape == (5, nb, 32) and xd.shape == (5, nb) and xs.shape == (5, nb)
    want_q, want_d = quant_matmul.quantize_rows(x)
    assert torch.equal(xq, want_q) and torch.equal(xd, want_d)
    assert torch.equal(xs, want_q.int().sum(-1)) and xq.abs().max() == 127
    assert xq[1, 1, :8].tolist() == [127, 2, -4, 0, 0, 2, -126, 64]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(threads):
    """A tree step's rows come out as the plain step's row would, bit for bit (1-3 tiles, 1 or 2 threads)."""
    native()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(3)
        weight, bias = torch.randn(300, 130), torch.randn(300)
        panels = quant_matmul.pack(weight)
        x = torch.randn(29, 130)
        together = quant_matmul.quant_mm(x, panels, 300, bias)
        for i in range(29):
            assert torch.equal(together[i : i + 1], quant_matmul.quant_mm(x[i : i + 1], panels, 300, bias)), i
        for lo, hi in ((5, 12), (0, 12), (3, 16), (10, 23)):
            assert torch.equal(together[lo:hi], quant_matmul.quant_mm(x[lo:hi], panels, 300, bias))
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_every_panel_is_computed_once_whichever_thread_takes_it(threads):
    """The threads take their shares' chunks of panels and then each other's: with more threads than cores (so some
    fall behind and others take over their chunks) and shares of uneven length, every column comes out as on one
    thread, bit for bit."""
    native()
    old = torch.get_num_threads()
    try:
        torch.manual_seed(threads)
        weight = torch.randn(16 * 211 + 5, 96)  # 212 panels, the last of 5 columns
        panels = quant_matmul.pack(weight)
        x = torch.randn(3, 96)
        torch.set_num_threads(1)
        want = quant_matmul.quant_mm(x, panels, weight.shape[0], None)
        torch.set_num_threads(threads)
        for _ in range(20):
            assert torch.equal(quant_matmul.quant_mm(x, panels, weight.shape[0], None), want)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("level", levels.LEVELS)
def test_each_level_computes_the_same_bits(level):
    """Every level this CPU executes (the dot products done otherwise, the same float operations after them)
    gives the dispatched level's results bit for bit."""
    mine = native()
    lib = library_of(quant_matmul, level)
    if levels.is_x86():
        assert quant_matmul.path_name(lib).split(" + ")[0] == PATHS[level]
    torch.manual_seed(5)
    weight, bias = torch.randn(70, 200), torch.randn(70)
    weight[3, :32] = 0  # an all-zero block
    weight[4, 32:64] = -weight[4, 32:64].abs()  # a block whose largest magnitude is negative: a quant of -127
    panels = quant_matmul.pack(weight)
    x = torch.randn(17, 200)
    want = quant_matmul.quant_mm(x, panels, 70, bias, lib=mine)
    assert torch.equal(quant_matmul.quant_mm(x, panels, 70, bias, lib=lib), want)
    assert torch.equal(quant_matmul.quant_mm(x[2:3], panels, 70, bias, lib=lib), want[2:3])


def test_the_weight_of_minus_128_is_multiplied_right_on_every_path():
    """A GGUF may hold a quant of -128 (llama.cpp's own quantizer never writes it): the unsigned +128 byte is 0
    and the AVX2 path's |w| is 128; both must still give -128 x."""
    mine = native()
    q = torch.full((16, 1, 32), -128, dtype=torch.int8)
    d = torch.full((16, 1), 0.5, dtype=torch.float16)
    panels = quant_matmul.pack_blocks(q, d)
    x = torch.full((2, 32), 127.0)
    want = torch.full((2, 16), -128 * 127 * 32 * 0.5)
    for level in levels.runnable():
        lib = quant_matmul.library(level)
        if lib is not None:
            assert torch.equal(quant_matmul.quant_mm(x, panels, 16, None, lib=lib), want), level


def narrow_blocks(n, k, bits, seed):
    """Random blocks of `bits`-bit quants (every value in range, the extremes included) and fp16 scales."""
    gen = torch.Generator().manual_seed(seed)
    off = quant_matmul.OFFSETS[bits]
    nb = -(-k // 32)
    q = torch.randint(-off, off, (n, nb, 32), generator=gen, dtype=torch.int8)
    q[0, 0] = -off  # a block of the lowest quant: every stored bit 0
    if n > 1:
        q[1, -1] = off - 1  # and of the highest: every bit 1
    d = (torch.rand(n, nb, generator=gen) * 0.05 + 1e-4).half()
    d[-1, 0] = 0  # a zero scale
    return q, d


@pytest.mark.parametrize("bits", [5, 4])
@pytest.mark.parametrize("level", levels.LEVELS)
def test_narrow_panels_give_the_8_bit_panels_bits_on_every_level(bits, level):
    """A Q5_0 or Q4_0 weight on its 5- or 4-bit panels computes, bit for bit, what the 8-bit kernel computes on the
    same values as int8 blocks, on every instruction set built here; and a row's result is the same alone or among
    up to 16 rows (odd N, K = 896 = 28 blocks, K not a multiple of 32, bias or none)."""
    mine = native()
    lib = library_of(quant_matmul, level)
    for n, k in ((16, 32), (50, 70), (33, 896), (7, 100)):
        q, d = narrow_blocks(n, k, bits, n * k)
        narrow, wide = quant_matmul.pack_blocks(q, d, bits), quant_matmul.pack_blocks(q, d, 8)
        assert narrow.shape == (-(-n // 16), quant_matmul.panel_bytes(k, bits))
        assert narrow.shape[1] < wide.shape[1]
        x = torch.randn(16, k, generator=torch.Generator().manual_seed(k))
        for bias in (None, torch.randn(n, generator=torch.Generator().manual_seed(n))):
            want = quant_matmul.quant_mm(x, wide, n, bias, lib=mine)
            torch.testing.assert_close(want, quant_matmul.reference_blocks(x, q, d, bias), rtol=1e-5,
                                       atol=2e-5 * k**0.5)
            assert torch.equal(quant_matmul.quant_mm(x, narrow, n, bias, lib=lib, bits=bits), want), (n, k)
            for m in range(1, 17):  # 1..16 rows: every tile size, the rows alone and together
                got = quant_matmul.quant_mm(x[:m], narrow, n, bias, lib=lib, bits=bits)
                assert torch.equal(got, want[:m]), (n, k, m)
            for i in (0, 5, 15):
                assert torch.equal(quant_matmul.quant_mm(x[i : i + 1], narrow, n, bias, lib=lib, bits=bits),
                                   want[i : i + 1])
            old = torch.get_num_threads()
            torch.set_num_threads(2)  # the panels split between two threads: each column still one chain
            try:
                assert torch.equal(quant_matmul.quant_mm(x, narrow, n, bias, lib=lib, bits=bits), want)
            finally:
                torch.set_num_threads(old)


def with_amx():
    lib = native()
    if not quant_matmul.amx_available(lib):
        pytest.skip(f"no usable AMX tiles in this library ({quant_matmul.path_name(lib)})")
    return lib


def ran_on_amx(lib, x, panels, n, bits):
    """Whether the library ran this call's rows on its AMX tiles (quant_mm's return: 1 on them, 0 not)."""
    ran = quant_matmul.call(lib, x, panels, n, bits, None, torch.empty(x.shape[0], n), 1)
    assert ran in (0, 1)
    return ran == 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bits", [8, 5, 4])
def test_the_amx_tiles_give_the_vnni_tiles_bits(bits, threads):
    """Calls of many rows run on AMX tiles: the same exact integer sums a block, then the VNNI tiles' float
    operations in their order, so the same results bit for bit (full and partial 16-row tiles, the rows in several
    chunks for K = 4864, N not a multiple of 16, K a multiple of 32 or not, a block count not a multiple of 4, bias
    or none, 1 or 2 threads)."""
    lib = with_amx()
    rows = quant_matmul.amx_rows(lib)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n, k in ((50, 70), (33, 896), (130, 200), (20, 4864)):
            q, d = narrow_blocks(n, k, bits, n * k + bits)
            panels = quant_matmul.pack_blocks(q, d, bits)
            x = torch.randn(300, k, generator=torch.Generator().manual_seed(k))
            x[7, 32:64] = 0  # a row block of zeros: its scale 0
            x[20, :32] = -x[20, :32].abs()  # a quant of -127
            assert ran_on_amx(lib, x[:rows], panels, n, bits) and not ran_on_amx(lib, x[: rows - 1], panels, n, bits)
            with quant_matmul.without_amx(lib):
                assert not ran_on_amx(lib, x, panels, n, bits)
            for bias in (None, torch.randn(n, generator=torch.Generator().manual_seed(n))):
                for m in (16, 17, 40, 300):
                    got = quant_matmul.quant_mm(x[:m], panels, n, bias, lib=lib, bits=bits)
                    with quant_matmul.without_amx(lib):
                        want = quant_matmul.quant_mm(x[:m], panels, n, bias, lib=lib, bits=bits)
                    assert torch.equal(got, want), (n, k, m, bias is not None)
                torch.testing.assert_close(got, quant_matmul.reference_blocks(x, q, d, bias), rtol=1e-5,
                                           atol=2e-5 * k**0.5)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_result_is_the_same_alone_and_in_a_prefill(threads):
    """A row of a 300-row call (AMX tiles where the library has them) comes out as the row alone (a step's VNNI
    tiles), and as among fewer rows than the AMX tiles take, bit for bit."""
    lib = native()
    rows = quant_matmul.amx_rows(lib)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(6)
        for bits in (8, 5):
            q, d = narrow_blocks(100, 900, bits, bits)
            panels, bias = quant_matmul.pack_blocks(q, d, bits), torch.randn(100)
            x = torch.randn(300, 900)
            together = quant_matmul.quant_mm(x, panels, 100, bias, lib=lib, bits=bits)
            for i in (0, 1, 15, 16, 17, 150, 287, 288, 299):
                alone = quant_matmul.quant_mm(x[i : i + 1], panels, 100, bias, lib=lib, bits=bits)
                assert torch.equal(alone, together[i : i + 1]), (bits, i)
            for lo in (0, 5, 290):
                few = quant_matmul.quant_mm(x[lo : lo + rows - 1], panels, 100, bias, lib=lib, bits=bits)
                assert torch.equal(few, together[lo : lo + rows - 1]), (bits, lo)
    finally:
        torch.set_num_threads(old)


def test_narrow_panels_hold_the_blocks_where_the_kernel_reads_them():
    """4 bits: group 2j's q + 8 in the low nibbles of vector j, group 2j + 1's in the high ones. 5 bits: the nibbles
    of q + 16 so, then a 64-byte plane of the fifth bits after the block's 256 bytes of nibbles: byte i's bit g is
    group g's byte i's."""
    q = torch.arange(17 * 2 * 32).reshape(17, 2, 32).remainder(32).sub(16).to(torch.int8)
    d = torch.arange(34, dtype=torch.float16).reshape(17, 2)
    five = quant_matmul.pack_blocks(q, d, 5)
    assert five.shape == (2, quant_matmul.panel_bytes(64, 5)) and quant_matmul.panel_bytes(64, 5) == 2 * 320 + 64
    # block 1, group 3 (k = 32 + 12..15), column 5, k = 32 + 14: nibble vector 1 (high nibbles), byte 5 * 4 + 2
    u = int(q[5, 1, 14]) + 16
    assert five[0, 320 + 64 + 20 + 2].item() >> 4 == u & 15
    assert (five[0, 320 + 256 + 22].item() >> 3) & 1 == u >> 4  # group 3's byte 22
    assert torch.equal(five[0, 640 : 640 + 64].view(torch.float16).view(2, 16), d[:16].T)
    q4 = q.clamp(-8, 7)
    four = quant_matmul.pack_blocks(q4, d, 4)
    assert four.shape == (2, 2 * 256 + 64)
    # block 0, group 2 (k = 8..11), column 7, k = 9: vector 1, low nibbles, byte 7 * 4 + 1
    assert four[0, 64 + 29].item() & 15 == int(q4[7, 0, 9]) + 8
    assert four[1, 0].item() == (int(q4[16, 0, 0]) + 8) | ((int(q4[16, 0, 4]) + 8) << 4)


def test_narrow_panels_refuse_quants_they_cannot_hold_and_inputs_of_another_width():
    native()
    q, d = narrow_blocks(16, 64, 5, 0)
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        quant_matmul.pack_blocks(q, d, 4)
    with pytest.raises(ValueError, match="no 6-bit panels"):
        quant_matmul.pack_blocks(q, d, 6)
    panels = quant_matmul.pack_blocks(q, d, 5)
    for bits in (8, 4, 6):
        with pytest.raises(ValueError, match="does not fit"):
            quant_matmul.quant_mm(torch.randn(2, 64), panels, 16, bits=bits)


def test_the_narrow_panels_run_under_torchscript_as_in_python():
    native()
    q, d = narrow_blocks(40, 64, 4, 1)
    bias = torch.randn(40)
    layer = QuantMatmul(quant_matmul.pack_blocks(q, d, 4), 40, bias, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(layer)
    x = torch.randn(3, 64)
    assert torch.equal(scripted(x), quant_matmul.quant_mm(x, quant_matmul.pack_blocks(q, d, 8), 40, bias))


def test_a_ggufs_q8_0_blocks_are_kept_exactly():
    """What transformers makes of a Q8_0 tensor (the blocks dequantized to fp32) quantizes back to the very
    blocks of the file; and fresh weights quantize to what llama.cpp's quantizer (gguf-py's copy) writes."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((48, 96)) * 0.05).astype(np.float32)
    raw = quantize(weight, GGMLQuantizationType.Q8_0)  # [48, 3 * 34] bytes
    q, d = quant_matmul.from_gguf_q8_0(torch.from_numpy(raw), 96)
    assert q.shape == (48, 3, 32) and d.shape == (48, 3)
    dequantized = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q8_0))
    assert torch.equal(dequantized, (q.float() * d.float()[..., None]).reshape(48, 96))
    again_q, again_d = quant_matmul.quantize_q8_0(dequantized)
    assert torch.equal(again_q, q) and torch.equal(again_d, d)
    fresh_q, fresh_d = quant_matmul.quantize_q8_0(torch.from_numpy(weight))
    assert torch.equal(fresh_q, q) and torch.equal(fresh_d, d)


def test_the_panels_hold_the_blocks_where_the_kernel_reads_them():
    q = torch.arange(17 * 2 * 32).reshape(17, 2, 32).remainder(255).sub(127).to(torch.int8)
    d = torch.arange(34, dtype=torch.float16).reshape(17, 2)
    panels = quant_matmul.pack_blocks(q, d)
    assert panels.shape == (2, quant_matmul.panel_bytes(64)) and quant_matmul.panel_bytes(64) == 2 * 512 + 64
    # panel 0, block 1, group 2, column 5, byte 3 is column 5's k = 32 + 2 * 4 + 3, plus 128
    assert panels[0, 512 + 2 * 64 + 5 * 4 + 3].item() == (int(q[5, 1, 11]) + 128)
    assert panels[1, 0].item() == int(q[16, 0, 0]) + 128 and panels[1, 4].item() == 128  # column 17: padding
    scales = panels[0, 1024 : 1024 + 64].view(torch.float16).view(2, 16)
    assert torch.equal(scales, d[:16].T)


def test_the_op_runs_under_torchscript_as_in_python():
    native()
    torch.manual_seed(4)
    weight, bias = torch.randn(40, 64), torch.randn(40)
    layer = Matmul.of(weight, bias, "q8")
    assert isinstance(layer, QuantMatmul) and layer.packing == "q8"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated; it still runs here
        scripted = torch.jit.script(layer)
    x = torch.randn(3, 64)
    assert torch.equal(scripted(x), quant_matmul.quant_mm(x, quant_matmul.pack(weight), 40, bias))
    assert q8_packs(torch.float32, torch.device("cpu"))
    assert pick_packing("q8", torch.float32, torch.device("cpu")) == "q8"
    with pytest.raises(ValueError, match="q8 cannot pack"):
        pick_packing("q8", torch.bfloat16, torch.device("cpu"))


def test_input_that_does_not_fit_the_panels_is_refused():
    native()
    panels = quant_matmul.pack(torch.randn(16, 64))
    for x, n, bias in ((torch.randn(2, 96), 16, None), (torch.randn(2, 64, dtype=torch.float64), 16, None),
                       (torch.randn(2, 64), 17, None), (torch.randn(2, 64), 16, torch.randn(15))):
        with pytest.raises(ValueError, match="does not fit"):
            quant_matmul.quant_mm(x, panels, n, bias)
    with pytest.raises(ValueError, match="does not fit"):
        quant_matmul.quant_mm(torch.randn(2, 64), panels.float(), 16)


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    quant_matmul.KERNEL.forget()
    monkeypatch.setattr(loader, "kernel_folder", lambda: tmp_path / "kernels")
    yield tmp_path / "kernels"
    quant_matmul.KERNEL.forget()


def test_a_library_that_computes_wrong_results_is_not_used(monkeypatch, fresh_library, caplog):
    if loader._compiler() is None:
        pytest.skip("no C compiler here")
    assert quant_matmul.KERNEL.source.count("/ 127.0f") == 2  # the scale of a row's block, scalar and AVX-512
    wrong = quant_matmul.KERNEL.source.replace("/ 127.0f", "/ 63.0f")
    monkeypatch.setattr(quant_matmul.KERNEL, "source", wrong)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.kernels.loader"):
        assert quant_matmul.library() is None
        assert not quant_matmul.available() and not q8_packs(torch.float32, torch.device("cpu"))
    assert "its results differ from the reference's" in caplog.text


def test_without_a_compiler_there_is_no_quantized_mode(monkeypatch, fresh_library):
    monkeypatch.setattr(loader, "_compiler", lambda: None)
    assert quant_matmul.library() is None
    with pytest.raises(ValueError, match="q8 cannot pack"):
        pick_packing("q8", torch.float32, torch.device("cpu"))


def test_the_settings_accept_q8_0_as_a_dtype():
    """The server's --dtype and the editor's setting take the mode `rest-lsp generate --dtype q8_0` runs."""
    import argparse

    from rest_lsp.settings import Settings, add_arguments

    settings, errors = Settings().update({"dtype": "q8_0"})
    assert errors == [] and settings.dtype == "q8_0"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert Settings.from_args(parser.parse_args(["--dtype", "q8_0"])).dtype == "q8_0"
    assert Settings().update({"dtype": "q8"})[1]  # still one of the listed values only
