"""The prefetch in the best case: a person who reads each suggestion until the server is idle, then accepts it.

At body starts after block openers of a source file (what follows removed), the person asks, accepts, asks again
at the end of the accepted text, presses Enter (the editor's indentation) and asks again, ACCEPTS times per place.
Prints the latency of the answers by source (model = decoded, prefetch = computed ahead) and the service's counters.

    python benchmarks/bench_prefetch.py PLACES ACCEPTS on|off [FILE]
"""
import statistics, sys, time
from pathlib import Path
from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings

src = Path(sys.argv[4] if len(sys.argv) > 4 else Path(__file__).resolve().parents[1] / "rest_lsp" / "scheduling.py").read_text()
lines = src.split("\n")
places = []  # (before, after): cursor at the body start after a block opener, the rest of the file removed
off = 0
for i, line in enumerate(lines[:-1]):
    off += len(line) + 1
    nxt = lines[i + 1]
    if line.rstrip().endswith(":") and nxt.strip() and not line.lstrip().startswith(("class", "@")):
        indent = nxt[: len(nxt) - len(nxt.lstrip())]
        before = src[:off] + indent
        places.append((before, "\n"))
places = places[5:5 + int(sys.argv[1])]
accepts = int(sys.argv[2])
s = Settings(index_workspace=False, debounce_ms=0, prefetch=sys.argv[3] == "on")
svc = CompletionService(s)
svc.start([]); assert svc.wait_ready(300), svc.load_error
def idle():  # the person reads until the server has nothing left to do (at most 60 s)
    t0 = time.monotonic()
    quiet = 0
    while quiet < 3 and time.monotonic() - t0 < 60:
        q = svc._requests
        quiet = quiet + 1 if (q._running is None and not q._queue) else 0
        time.sleep(0.05)
lat = {"model": [], "prefetch": [], "other": []}
try:
    for n, (before, after) in enumerate(places):
        doc = f"mem://d{n}.py"
        for a in range(accepts):
            c = svc.submit(doc, before + after, len(before)).future.result(300)
            if c is None:
                break
            lat[c.source if c.source in lat else "other"].append(c.latency_ms)
            # the person reads it (idle; the prefetch runs), accepts it, and the editor asks again
            idle()
            before = before + c.text
            c2 = svc.submit(doc, before + after, len(before)).future.result(300)
            if c2 is not None:
                lat[c2.source if c2.source in lat else "other"].append(c2.latency_ms)
                before = before + c2.text
            # Enter: the next line, the editor's indentation
            last = before[before.rfind("\n") + 1:]
            ind = last[: len(last) - len(last.lstrip())] + ("    " if last.rstrip().endswith(":") else "")
            before = before + "\n" + ind
            idle()
finally:
    st = svc.stats(); svc.close()
for k, v in lat.items():
    if v:
        print(k, len(v), "median ms", round(statistics.median(v), 1), "p90", round(sorted(v)[int(0.9 * len(v))], 1))
print({k: st[k] for k in ("prefetched", "prefetch_hits", "prefetch_cancelled", "cache_hits", "completions_decoded")})
