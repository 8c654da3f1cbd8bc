"""Every native entry point checks its sizes before it touches memory (issue 42): rows, columns and each buffer's
length, refused with a code that the Python side turns into one sentence, never an abort; the Python wrappers
check the tensors against what the C reads and writes; and row_attn's per-thread scratch fits every task, the
last short block of rows with the longest tail too (the heap corruption of issue 42)."""

import ctypes

import pytest
import torch

from rest_lsp.kernels import buffers, logit_scan, panel_matmul, quant_matmul, row_attention

MIN = -1e30


def lib_of(module):
    lib = module.library()
    if lib is None:
        pytest.skip(f"no C compiler here builds {module.__name__}")
    return lib


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


# -- row_attn's scratch ---------------------------------------------------------------------------------------------

def short_rows_long_tails(n: int, keys: int) -> torch.Tensor:
    """Rows of 8 that see only themselves, then a last short block whose rows see every key: each later task of
    fewer rows needs longer scratch rows than the task before it had."""
    mask = torch.full((n, keys), MIN)
    for i in range(n):
        mask[i, i] = 0
    mask[n - n % 8 :] = 0
    return mask


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,keys,past", [(9, 40, 0), (17, 90, 0), (33, 120, 3), (10, 64, 1)])
def test_row_attention_gives_the_reference_when_a_short_last_block_has_the_longest_tails(n, keys, past, threads):
    lib = lib_of(row_attention)
    gen = torch.Generator().manual_seed(n)
    hq, hkv, d = 9, 3, 64  # the default model's heads
    q = torch.randn(hq, n, d, generator=gen)
    k, v = torch.randn(hkv, past + keys, d, generator=gen), torch.randn(hkv, past + keys, d, generator=gen)
    mask = short_rows_long_tails(n, keys)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = row_attention.row_attn(q, k, v, past + keys, mask, past, 0.125, lib=lib)
    finally:
        torch.set_num_threads(before)
    want = row_attention.reference(q, k, v, past + keys, mask, past, 0.125)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)


# -- the C entry points' own checks -----------------------------------------------------------------------------------

def row_attn_args(**change):
    """A valid call of lib.row_attn (n 3, hq 4, hkv 2, d 16, 5 shared keys, a 3-column mask), `change` applied."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(4, 3, 16, generator=gen), torch.randn(2, 8, 16, generator=gen), torch.randn(2, 8, 16)
    mask, out = torch.zeros(3, 3), torch.empty(3, 64)
    args = dict(q=ptr(q), qn=q.numel(), n=3, hq=4, hkv=2, d=16, k=ptr(k), v=ptr(v), kvn=k.numel(), hs=8 * 16, P=5,
                mask=ptr(mask), maskn=mask.numel(), W=3, ms=3, scale=0.25, out=ptr(out), outn=out.numel(), threads=1)
    args.update(change)
    return args, (q, k, v, mask, out)


@pytest.mark.parametrize("change,code", [
    ({}, 0),
    ({"qn": 3 * 4 * 16 - 1}, buffers.BAD_SIZES),
    ({"outn": 3 * 64 - 1}, buffers.BAD_SIZES),
    ({"kvn": 8 * 16 + 8 * 16 - 1}, buffers.BAD_SIZES),  # head 1 reads rows 0..7 from 8 x 16 on
    ({"hs": 8 * 16 + 1}, buffers.BAD_SIZES),
    ({"P": 6}, buffers.BAD_SIZES),  # 6 + 3 rows of a capacity of 8
    ({"maskn": 8}, buffers.BAD_SIZES),
    ({"ms": 4}, buffers.BAD_SIZES),  # row 2 of the mask would end at 11
    ({"n": 0}, buffers.BAD_SIZES),
    ({"P": -1}, buffers.BAD_SIZES),
    ({"W": -1}, buffers.BAD_SIZES),
    ({"q": None}, buffers.BAD_SIZES),
    ({"n": 1 << 62, "qn": 1 << 62}, buffers.BAD_SIZES),  # n x hq x d overflows
    ({"hq": 3}, buffers.UNSUPPORTED),  # not a multiple of the key heads
    ({"hkv": 0}, buffers.UNSUPPORTED),
    ({"d": 2048, "hs": 0}, buffers.UNSUPPORTED),
])
def test_row_attn_checks_every_size_before_reading(change, code):
    lib = lib_of(row_attention)
    args, keep = row_attn_args(**change)
    assert lib.row_attn(*args.values()) == code


def quant_mm_args(**change):
    """A valid call of lib.quant_mm (x [3, 70] times 40 outputs of 8-bit panels, a bias), `change` applied."""
    x, bias, y = torch.randn(3, 70), torch.randn(40), torch.empty(3, 40)
    panels = quant_matmul.pack(torch.randn(40, 70))  # [3, panel_bytes(70)]
    args = dict(x=ptr(x), xn=x.numel(), m=3, k=70, w=ptr(panels), wn=panels.numel(), n=40, bits=8, bias=ptr(bias),
                bn=40, y=ptr(y), yn=y.numel(), threads=2)
    args.update(change)
    return args, (x, bias, y, panels)


@pytest.mark.parametrize("change,code", [
    ({}, 0),
    ({"xn": 3 * 70 - 1}, buffers.BAD_SIZES),
    ({"yn": 3 * 40 - 1}, buffers.BAD_SIZES),
    ({"bn": 39}, buffers.BAD_SIZES),
    ({"wn": 3 * quant_matmul.panel_bytes(70) - 1}, buffers.BAD_SIZES),
    ({"n": 49}, buffers.BAD_SIZES),  # a fourth panel
    ({"k": 100, "xn": 300}, buffers.BAD_SIZES),  # 4 blocks a panel
    ({"bits": 5, "wn": 3 * quant_matmul.panel_bytes(70, 5)}, 0),  # narrower panels read less
    ({"bits": 6}, buffers.UNSUPPORTED),
    ({"bits": 41}, 0),  # Q4_1 panels: blocks of 32, smaller than the buffer
    ({"bits": 42}, buffers.UNSUPPORTED),  # Q4_K: K = 70 is not whole superblocks of 256
    ({"m": -1}, buffers.BAD_SIZES),
    ({"w": None}, buffers.BAD_SIZES),
    ({"m": 1 << 40, "xn": 1 << 62}, buffers.BAD_SIZES),
    ({"m": 0, "x": None, "y": None}, 0),
])
def test_quant_mm_checks_every_size_before_reading(change, code):
    lib = lib_of(quant_matmul)
    args, keep = quant_mm_args(**change)
    assert lib.quant_mm(*args.values()) == code


@pytest.mark.parametrize("bits", [41, 42, 52, 62])
def test_quant_mm_checks_the_panels_of_each_two_term_format(bits):
    """Each format's panel size (its quants, then its scales and mins) is what the C checks the weight buffer
    against: one byte short is refused before anything is read."""
    lib = lib_of(quant_matmul)
    x, y = torch.randn(3, 512), torch.empty(3, 40)
    panels = quant_matmul.pack_blocks(**quant_matmul.random_blocks(bits, 40, 512), bits=bits)
    assert panels.shape == (3, quant_matmul.panel_bytes(512, bits))
    for wn, code in ((panels.numel(), 0), (panels.numel() - 1, buffers.BAD_SIZES)):
        assert lib.quant_mm(ptr(x), x.numel(), 3, 512, ptr(panels), wn, 40, bits, None, 0, ptr(y), y.numel(), 1) == code


@pytest.mark.parametrize("which", ["xn", "xqn", "xdn", "xsn"])
def test_quant_rows_checks_every_buffer(which):
    lib = lib_of(quant_matmul)
    x, xq, xd, xs = torch.randn(2, 40), torch.empty(2, 64, dtype=torch.int8), torch.empty(2, 2), torch.empty(2, 2,
                                                                                                    dtype=torch.int32)
    sizes = dict(xn=80, xqn=128, xdn=4, xsn=4)
    assert lib.quant_rows(ptr(x), sizes["xn"], 2, 40, ptr(xq), sizes["xqn"], ptr(xd), sizes["xdn"], ptr(xs),
                          sizes["xsn"]) == 0
    sizes[which] -= 1
    assert lib.quant_rows(ptr(x), sizes["xn"], 2, 40, ptr(xq), sizes["xqn"], ptr(xd), sizes["xdn"], ptr(xs),
                          sizes["xsn"]) == buffers.BAD_SIZES


@pytest.mark.parametrize("change,code", [
    ({}, 0),
    ({"xn": 3 * 33 - 1}, buffers.BAD_SIZES),
    ({"pn": 4 * 16 * 33 - 1}, buffers.BAD_SIZES),
    ({"n": 65}, buffers.BAD_SIZES),
    ({"bn": 49}, buffers.BAD_SIZES),
    ({"yn": 3 * 50 - 1}, buffers.BAD_SIZES),
    ({"k": -1}, buffers.BAD_SIZES),
    ({"p": None}, buffers.BAD_SIZES),
])
def test_panel_mm_checks_every_size_before_reading(change, code):
    lib = lib_of(panel_matmul)
    x, bias, y = torch.randn(3, 33), torch.randn(50), torch.empty(3, 50)
    panels = panel_matmul.pack(torch.randn(50, 33))  # [4, 33, 16]
    args = dict(x=ptr(x), xn=x.numel(), m=3, k=33, p=ptr(panels), pn=panels.numel(), n=50, bias=ptr(bias), bn=50,
                y=ptr(y), yn=y.numel(), threads=2)
    args.update(change)
    assert lib.panel_mm(*args.values()) == code


# -- what the Python side says ----------------------------------------------------------------------------------------

def one_sentence(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.count(". ") == 0, text
    return text


def test_a_refusal_becomes_one_sentence():
    with pytest.raises(ValueError) as err:
        buffers.outcome("row_attn", buffers.BAD_SIZES, "unused")
    assert one_sentence(err) == "row_attn: the sizes passed do not fit the buffers given (code -3)."
    with pytest.raises(MemoryError) as err:
        buffers.outcome("quant_mm", buffers.NO_MEMORY, "unused")
    assert one_sentence(err) == "quant_mm: no scratch memory for this call."
    with pytest.raises(ValueError, match="^quant_mm: no 6-bit panels.$"):
        buffers.outcome("quant_mm", buffers.UNSUPPORTED, "no 6-bit panels")
    assert buffers.outcome("quant_mm", 1, "") == 1


def test_extent_is_what_the_storage_holds_from_the_pointer_on():
    t = torch.zeros(10, 6)
    assert buffers.extent(t) == 60 and buffers.extent(t[3:]) == 42 and buffers.extent(t[:2]) == 60
    assert buffers.extent(t[2:, 4:]) == 60 - 16 and buffers.extent(t.view(-1).view(torch.uint8)[1:]) == 239


def test_a_call_that_reaches_the_c_with_sizes_it_refuses_is_one_sentence(monkeypatch):
    """Where a wrapper's checks let something through, the C's own checks still refuse it in one sentence (here the
    extent of x as a wrapper could have misjudged it)."""
    lib = lib_of(quant_matmul)
    monkeypatch.setattr(quant_matmul, "extent", lambda t: 1)
    panels = quant_matmul.pack(torch.randn(16, 64))
    with pytest.raises(ValueError) as err:
        quant_matmul.quant_mm(torch.randn(2, 64), panels, 16, lib=lib)
    assert one_sentence(err).startswith("quant_mm: the sizes passed do not fit the buffers given")


@pytest.mark.parametrize("case", ["three-d", "k", "bits", "few-panels", "bias", "negative-n"])
def test_quant_mm_refuses_tensors_that_do_not_fit_in_one_sentence(case):
    lib = lib_of(quant_matmul)
    q, d = quant_matmul.quantize_q8_0(torch.randn(40, 64))
    panels5 = quant_matmul.pack_blocks(q.clamp(-16, 15), d, 5)
    x, n, bias, bits = torch.randn(2, 64), 40, None, 5
    if case == "three-d":
        x = torch.randn(1, 2, 64)
    elif case == "k":
        x = torch.randn(2, 96)  # panels of 2 blocks, rows of 3
    elif case == "bits":
        bits = 8  # 5-bit panels read as 8-bit ones: another byte size for this k
    elif case == "few-panels":
        n = 49
    elif case == "bias":
        bias = torch.randn(39)
    elif case == "negative-n":
        n = -1
    with pytest.raises(ValueError) as err:
        quant_matmul.quant_mm(x, panels5, n, bias, lib=lib, bits=bits)
    assert one_sentence(err).startswith("quant_mm: ")


@pytest.mark.parametrize("case", ["three-d", "k", "few-panels", "bias", "negative-n"])
def test_panel_mm_refuses_tensors_that_do_not_fit_in_one_sentence(case):
    lib = lib_of(panel_matmul)
    panels = panel_matmul.pack(torch.randn(40, 64))
    x, n, bias = torch.randn(2, 64), 40, None
    if case == "three-d":
        x = torch.randn(1, 2, 64)
    elif case == "k":
        x = torch.randn(2, 65)
    elif case == "few-panels":
        n = 49
    elif case == "bias":
        bias = torch.randn(39)
    elif case == "negative-n":
        n = -1
    with pytest.raises(ValueError) as err:
        panel_matmul.panel_mm(x, panels, n, bias, lib=lib)
    assert one_sentence(err).startswith("panel_mm: ")


@pytest.mark.parametrize("case", ["two-d", "keys", "mask-from", "negative-from", "mask-rows", "heads", "wide"])
def test_row_attn_refuses_tensors_that_do_not_fit_in_one_sentence(case):
    lib = lib_of(row_attention)
    q, k, v = torch.randn(4, 3, 16), torch.randn(2, 10, 16), torch.randn(2, 10, 16)
    keys, mask, mask_from = 8, torch.zeros(3, 3), 5
    if case == "two-d":
        q = torch.randn(3, 16)
    elif case == "keys":
        keys, mask = 11, torch.zeros(3, 6)  # past the capacity of 10
    elif case == "mask-from":
        mask_from = 9
    elif case == "negative-from":
        mask_from, mask = -1, torch.zeros(3, 9)
    elif case == "mask-rows":
        mask = torch.zeros(2, 3)
    elif case == "heads":
        q = torch.randn(3, 3, 16)
    elif case == "wide":  # heads over 1024 wide: the C's own refusal
        q, k, v = torch.randn(2, 3, 1040), torch.randn(2, 10, 1040), torch.randn(2, 10, 1040)
    with pytest.raises(ValueError) as err:
        row_attention.row_attn(q, k, v, keys, mask, mask_from, 0.25, lib=lib)
    assert one_sentence(err).startswith("row_attn: ")


def test_the_bindings_pass_a_length_beside_every_pointer():
    """quant_mm, quant_rows, panel_mm, row_attn and logit_scan take (pointer, elements) pairs: their argtypes say
    so."""
    for module, name, count in ((quant_matmul, "quant_mm", 13), (quant_matmul, "quant_rows", 10),
                                (panel_matmul, "panel_mm", 12), (row_attention, "row_attn", 19),
                                (logit_scan, "logit_scan", 11)):
        fn = getattr(lib_of(module), name)
        assert len(fn.argtypes) == count and fn.restype is ctypes.c_int, name
