"""What warm-up and per-document KV caches save a request, through the completion service (no LSP), default model.

Scenarios, each timed from submit to answer, with the prefill tokens the request computed (service stats):
  - `cold`: a request in file A, nothing cached;
  - `switch back`: a request in file B, then back to A with one line added: with per-document caches
    (`documentCacheMb` default) and without (0);
  - `after an edit`: an edit at another place of A, then the request there: at once (the warm-up has had no
    time) and after the warm-up finished (the person paused).
Also the time of one warm-up chunk: the most a request arriving during a warm-up waits.

    .venv/bin/python benchmarks/bench_prefill_reuse.py [--model M] [--context-tokens 1024]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import rest_lsp.service.completion as completion
from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings

FILES = ("json/decoder.py", "textwrap.py")


def wait_for(check, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.01)


def ask(svc: CompletionService, doc: str, text: str, at: int) -> dict:
    before = svc.stats()["prefill_tokens"]
    t0 = time.perf_counter()
    svc.submit(doc, text, at).future.result(600)
    ms = (time.perf_counter() - t0) * 1e3
    return {"ms": round(ms), "prefill_tokens": svc.stats()["prefill_tokens"] - before}


def run(model: str | None, context: int, cache_mb: int) -> dict:
    svc = CompletionService(Settings(model=model, index_workspace=False, debounce_ms=0, context_tokens=context,
                                     document_cache_mb=cache_mb, max_new_tokens=16))
    svc.start([])
    if not svc.wait_ready(600):
        raise SystemExit(svc.load_error)
    try:
        lib = Path(json.__file__).parent.parent
        a, b = ((lib / f).read_text() for f in FILES)
        out = {"cold": ask(svc, "a.py", a, len(a) // 2)}
        ask(svc, "b.py", b, len(b) // 2)
        a = a[: len(a) // 2] + "x = 1\n" + a[len(a) // 2:]
        out["switch back"] = ask(svc, "a.py", a, len(a) // 2 + len("x = 1\n"))
        # an edit elsewhere: the request right after it, then after a pause that let the warm-up finish
        at = len(a) // 3
        a = a[:at] + "y = 2\n" + a[at:]
        svc.expect("a.py", a, at + 6)
        out["after an edit, at once"] = ask(svc, "a.py", a, at + 6)
        at = len(a) // 4
        a = a[:at] + "z = 3\n" + a[at:]
        warmed = svc.stats()["prewarm_tokens"]
        t0 = time.perf_counter()
        svc.expect("a.py", a, at + 6)
        wait_for(lambda: svc.stats()["prewarm_tokens"] > warmed)
        warm_ms = (time.perf_counter() - t0) * 1e3
        stats = svc.stats()
        chunks = stats["prewarm_chunks"]
        out["after an edit, warmed"] = ask(svc, "a.py", a, at + 6)
        out["warm-up"] = {"ms": round(warm_ms), "tokens": stats["prewarm_tokens"] - warmed,
                          "ms per chunk of %d" % completion.PREWARM_CHUNK:
                              round(warm_ms / max(1, (stats["prewarm_tokens"] - warmed) / completion.PREWARM_CHUNK))}
        out["chunks"] = chunks
        return out
    finally:
        svc.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--context-tokens", type=int, default=1024)
    args = ap.parse_args()
    with_caches = run(args.model, args.context_tokens, Settings().document_cache_mb)
    without = run(args.model, args.context_tokens, 0)
    print("| scenario | ms | prefill tokens |\n|---|---|---|")
    for name in ("cold", "after an edit, at once", "after an edit, warmed"):
        r = with_caches[name]
        print(f"| {name} | {r['ms']} | {r['prefill_tokens']} |")
    for label, res in (("with document caches", with_caches), ("without (documentCacheMb 0)", without)):
        r = res["switch back"]
        print(f"| switch back to A, {label} | {r['ms']} | {r['prefill_tokens']} |")
    print(f"\nwarm-up: {with_caches['warm-up']}")


if __name__ == "__main__":
    main()
