"""Our fp32 panel kernel (rest_lsp/kernels/panel_matmul.py): what F.linear computes, to fp32 rounding; a row's result the
same bit for bit whatever the number of rows beside it; the op under TorchScript; and without a compiler, oneDNN."""

import logging
import warnings

import pytest
import torch
import torch.nn.functional as F

from rest_lsp.kernels import levels, loader, panel_matmul
from rest_lsp.engine.matmuls import Matmul, PanelMatmul, pick_packing

needs_kernel = pytest.mark.skipif(not panel_matmul.available(), reason="no C compiler here builds the panel kernel")


@needs_kernel
@pytest.mark.parametrize("n,k", [(16, 8), (50, 33), (96, 576), (7, 100), (1, 3)])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_kernel_computes_what_f_linear_does(n, k, bias):
    torch.manual_seed(n * 1000 + k)
    weight = torch.randn(n, k)
    b = torch.randn(n) if bias else None
    panels = panel_matmul.pack(weight)
    assert panels.shape == (-(-n // 16), k, 16)
    for m in (1, 5, 6, 7, 12, 13, 64):
        x = torch.randn(m, k)
        got = panel_matmul.panel_mm(x, panels, n, b)
        want = F.linear(x, weight, b)
        assert got.shape == (m, n)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * k**0.5)


@needs_kernel
def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    """A tree step's rows come out as the plain step's row would, bit for bit (one tile or three)."""
    torch.manual_seed(3)
    weight, bias = torch.randn(200, 130), torch.randn(200)
    panels = panel_matmul.pack(weight)
    x = torch.randn(17, 130)
    together = panel_matmul.panel_mm(x, panels, 200, bias)
    for i in range(17):
        assert torch.equal(together[i : i + 1], panel_matmul.panel_mm(x[i : i + 1], panels, 200, bias))
    assert torch.equal(together[5:12], panel_matmul.panel_mm(x[5:12], panels, 200, bias))


@needs_kernel
def test_the_op_runs_under_torchscript_as_in_python():
    torch.manual_seed(4)
    weight = torch.randn(40, 24)
    bias = torch.randn(40)
    layer = Matmul.of(weight, bias, "panel")
    assert isinstance(layer, PanelMatmul)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated; it still runs here
        scripted = torch.jit.script(layer)
    x = torch.randn(3, 24)
    assert torch.equal(scripted(x), panel_matmul.panel_mm(x, panel_matmul.pack(weight), 40, bias))
    torch.testing.assert_close(scripted(x), F.linear(x, weight, bias))


@needs_kernel
def test_input_that_does_not_fit_the_panels_is_refused():
    panels = panel_matmul.pack(torch.randn(16, 8))
    with pytest.raises(ValueError, match="does not fit"):
        panel_matmul.panel_mm(torch.randn(2, 9), panels, 16)
    with pytest.raises(ValueError, match="does not fit"):
        panel_matmul.panel_mm(torch.randn(2, 8, dtype=torch.float64), panels, 16)
    with pytest.raises(ValueError, match="does not fit"):  # more outputs than the panels hold
        panel_matmul.panel_mm(torch.randn(2, 8), panels, 17)
    with pytest.raises(ValueError, match="does not fit"):  # a bias shorter than the outputs
        panel_matmul.panel_mm(torch.randn(2, 8), panels, 16, torch.randn(15))
    with pytest.raises(ValueError, match="does not fit"):  # panels that are not contiguous
        panel_matmul.panel_mm(torch.randn(2, 8), panels.transpose(0, 1), 16)


@needs_kernel
def test_fp32_on_a_cpu_picks_the_panel_kernel():
    assert pick_packing(None, torch.float32, torch.device("cpu")) == "panel"
    assert pick_packing(None, torch.bfloat16, torch.device("cpu")) != "panel"


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """The kernel looked for again, built into an empty folder."""
    panel_matmul.KERNEL.forget()
    monkeypatch.setattr(loader, "kernel_folder", lambda: tmp_path / "kernels")
    yield tmp_path / "kernels"
    panel_matmul.KERNEL.forget()


def test_without_a_compiler_the_step_runs_on_onednn_and_says_so_once(monkeypatch, fresh_library, caplog):
    monkeypatch.setattr(loader, "_compiler", lambda: None)
    with caplog.at_level(logging.INFO, logger="rest_lsp.kernels.loader"):
        assert panel_matmul.library() is None
        assert not panel_matmul.available()
    assert [r.getMessage() for r in caplog.records] == [
        "No C compiler here (CC, cc, gcc): fp32 steps run without rest-lsp's panel kernel (on oneDNN where torch has "
        "it)."]
    from rest_lsp.engine.matmuls import onednn_packs

    want = "onednn" if onednn_packs(torch.float32, torch.device("cpu")) else "none"
    assert pick_packing(None, torch.float32, torch.device("cpu")) == want
    with pytest.raises(ValueError, match="panel cannot pack"):
        pick_packing("panel", torch.float32, torch.device("cpu"))


def test_a_compiler_that_fails_leaves_onednn_with_one_warning(monkeypatch, fresh_library, caplog, tmp_path):
    failing = tmp_path / "broken-cc"
    failing.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\n"
                       "echo 'broken-cc: error: cannot compile' >&2\necho 'compilation terminated.' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    with caplog.at_level(logging.WARNING, logger="rest_lsp.kernels.loader"):
        assert panel_matmul.library() is None
        assert panel_matmul.library() is None  # tried once
    assert [r.getMessage() for r in caplog.records] == [
        f"The panel_matmul kernel ({levels.chosen()} level) could not be built with {failing} (broken-cc: error: "
        "cannot compile): fp32 steps run without rest-lsp's panel kernel (on oneDNN where torch has it)."]
    assert not any(fresh_library.glob("*.so"))


@needs_kernel
def test_the_kernel_is_built_once_and_kept(monkeypatch, fresh_library):
    lib = panel_matmul.library()
    assert lib is not None
    built = list(fresh_library.glob("panel_matmul-*.so"))
    assert len(built) == 1 and not [p for p in fresh_library.iterdir() if p.is_dir()]  # no temporary folder left
    panel_matmul.KERNEL.forget()
    stamp = built[0].stat().st_mtime_ns
    assert panel_matmul.library() is not None
    assert built[0].stat().st_mtime_ns == stamp  # loaded from the cache, not built again


@needs_kernel
def test_a_library_that_computes_wrong_results_is_not_used(monkeypatch, fresh_library, caplog):
    """A miscompiled kernel must never reach the exact mode: the library is checked against F.linear first."""
    wrong = panel_matmul.KERNEL.source.replace("lo[i] += b * w0;", "lo[i] += b * w0 * 2;")
    assert wrong != panel_matmul.KERNEL.source
    monkeypatch.setattr(panel_matmul.KERNEL, "source", wrong)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.kernels.loader"):
        assert panel_matmul.library() is None
    assert "its results differ from F.linear's" in caplog.text


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 3, 6, 8, 14])
@pytest.mark.parametrize("n", [200, 33])
def test_the_kernel_computes_what_f_linear_does_on_two_threads(two_threads, m, n):
    """Every tile height (1-6 rows, 8 = 6 + 2, 14 = 6 + 6 + 2) over 13 panels (200 columns, the last partial) or
    3 (33 columns); the kernel splits the panels between its 2 threads from 65536 multiply-adds (all of these but
    33 columns at m < 4)."""
    k = 576
    torch.manual_seed(m * 1000 + n)
    weight, bias, x = torch.randn(n, k), torch.randn(n), torch.randn(m, k)
    got = panel_matmul.panel_mm(x, panel_matmul.pack(weight), n, bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5 * k**0.5)
    # and bit for bit what one thread computes: the threads share the panels, never a sum
    torch.set_num_threads(1)
    assert torch.equal(got, panel_matmul.panel_mm(x, panel_matmul.pack(weight), n, bias))


def test_where_a_compiler_exists_fp32_steps_run_on_the_kernel_built_with_openmp():
    """Not skipped where a compiler exists: a kernel that cannot be built or loaded, or one built without OpenMP
    (one thread), must turn this red rather than leave the kernel's tests skipped and the steps on oneDNN."""
    from support import tiny_model
    from rest_lsp.engine.decoding import Decoder

    if loader._compiler() is None:
        pytest.skip("no C compiler here (CC, cc, gcc): the steps run on oneDNN, as " +
                    "test_without_a_compiler_the_step_runs_on_onednn_and_says_so_once checks")
    lib = panel_matmul.library()
    assert lib is not None, "a C compiler is here, yet the panel kernel could not be built or loaded"
    assert lib.panel_threaded() == 1, "the panel kernel was built without OpenMP: its matmuls run on one thread"
    assert panel_matmul.available() and pick_packing(None, torch.float32, torch.device("cpu")) == "panel"
    assert Decoder(tiny_model("llama")).engine == "lean-panel"
