"""A closed document keeps no KV cache: neither the one kept for it nor the decoder's own, once the decoder moves on,
nor one that work still under way for it leaves behind; one opened again keeps its cache."""

from support import tiny_model

from rest_lsp.engine.decoding import Decoder
from rest_lsp.service.completion import CompletionService
from rest_lsp.service.document_caches import DocumentCaches
from rest_lsp.settings import Settings

LIMIT = 1 << 30


def _prompt(n: int) -> list[int]:
    return [(7 * i + n) % 97 for i in range(40)]


def test_a_closed_documents_cache_is_dropped_kept_or_held():
    decoder, caches = Decoder(tiny_model("llama")), DocumentCaches()
    for n, doc in enumerate("abc"):
        caches.use(decoder, doc, LIMIT)
        decoder.prefill(_prompt(n))
    assert caches.kept() == ["a", "b"]
    caches.forget("a")  # kept: dropped at once
    assert caches.kept() == ["b"]
    caches.forget("c")  # the decoder holds it: not kept when the decoder leaves it (the old code kept it)
    caches.use(decoder, "b", LIMIT)
    assert caches.kept() == []
    caches.use(decoder, "a", LIMIT)  # work for a closed document, still under way at its close
    decoder.prefill(_prompt(0))
    caches.use(decoder, "b", LIMIT)
    assert caches.kept() == []


def test_a_document_opened_again_keeps_its_cache():
    decoder, caches = Decoder(tiny_model("llama")), DocumentCaches()
    caches.use(decoder, "a", LIMIT)
    decoder.prefill(_prompt(0))
    caches.forget("a")
    caches.opened("a")
    caches.use(decoder, "b", LIMIT)
    assert caches.kept() == ["a"]


def test_the_service_closes_and_opens_documents(tiny_models):
    svc = CompletionService(Settings(model=str(tiny_models["random"]), dtype="float32", max_new_tokens=2,
                                     debounce_ms=0, index_workspace=False, prefetch=False))
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    try:
        texts = {doc: f"def {doc}(x):\n    return x\n\n{doc}_value = " for doc in ("a", "b")}
        ask = lambda doc: svc.submit(f"mem://{doc}.py", texts[doc], len(texts[doc])).future.result(60)
        ask("a")
        svc.close_document("mem://a.py")
        ask("b")
        assert svc.stats()["document_caches"] == 0
        ask("a")  # opened again and asked: its cache is kept again when the decoder leaves it
        assert "mem://a.py" not in svc._model.documents._closed
    finally:
        svc.close()
