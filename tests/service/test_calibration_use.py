"""The server and the CLI use this machine's step-cost curve: the server reads the one measured here before (at
start, never measuring: the cores are the first request's), and `rest-lsp generate` measures it once."""

from __future__ import annotations

from rest_lsp.engine import calibration
from rest_lsp.engine.decoding import Decoder
from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings

QUICK = dict(sizes=(1, 2, 4, 8), context=48, repeats=1)  # one round: always kept (calibration.too_noisy)


def _service(settings: Settings) -> CompletionService:
    svc = CompletionService(settings)
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    return svc


def test_a_server_starts_on_the_curve_measured_here_before(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "_preemptions", lambda: 0)  # the suite's workers share the cores: kept anyway
    settings = Settings(model=str(tiny_models["random"]), dtype="float32", debounce_ms=0, index_workspace=False,
                        cache_dir=str(tmp_path))
    first = _service(settings)
    try:
        assert first._decoder.calibration is None  # nothing measured here yet: a conservative seed, then learned
        assert first.stats()["step_cost"]["seed"] == "conservative"
        measured = first._decoder.calibrate(tmp_path, **QUICK)
        assert measured is not None and measured.source == "measured" and measured.path.is_file()
    finally:
        first.close()
    second = _service(settings)
    try:
        found = second._decoder.calibration
        assert found is not None and found.source == "cache" and found.path == measured.path
        assert second._decoder.step_cost == measured.curve
        assert second.stats()["step_cost"]["seed"] == "measured"  # what the steps teach is added to it
    finally:
        second.close()


def test_generate_measures_the_curve_before_it_decodes_with_rest(tiny_models, tmp_path, monkeypatch, capsys):
    from rest_lsp.cli import main

    calls = []
    real = Decoder.calibrate

    def counted(self, *args, **kwargs):
        calls.append(self)
        return real(self, tmp_path, **QUICK)

    monkeypatch.setattr(Decoder, "calibrate", counted)
    generated = []
    real_generate = Decoder.generate

    def recording(self, *args, **kwargs):
        generated.append(self.calibration)
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(Decoder, "generate", recording)
    prompt = tmp_path / "p.py"
    prompt.write_text("def add(a, b):\n    return a + b\n")
    args = ["generate", str(prompt), "--model", str(tiny_models["random"]), "--dtype", "float32",
            "--max-new-tokens", "4"]
    assert main(args) == 0
    assert len(calls) == 1 and len(generated) == 1 and generated[0] is not None  # measured, then decoded on it
    assert main(args + ["--no-rest"]) == 0
    assert len(calls) == 1  # plain decoding sizes no tree
    capsys.readouterr()
