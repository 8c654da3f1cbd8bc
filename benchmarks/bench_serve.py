"""K simulated editors against `rest-lsp serve` on a local Ray cluster, beside the in-process service.

Each editor is bench_replay's person (functions of a corpus written back line by line, a completion asked at each
line start after `--pause-ms`), on its own copy of the corpus (one workspace each), driving the service interface
as the language server does (buffers, edit hints, cursor, submit): the in-process CompletionService for the
baseline (`local`, one editor), a RemoteService (`rest-lsp --remote`) for the cluster runs. Runs:
  - local, K = 1;
  - 2 replicas x `--threads`, K = 1, 2, 4 editors, then K = 2 with the replica of editor 0 killed (SIGKILL) a third
    of the way through;
  - 1 replica, K = 4 (the scaling reference).
With `--hog`, every cluster run of K >= 2 editors is run again with editor 0 asking, through its settings as any
editor may, for as much as it can (maxNewTokens 4096, timeBudgetMs 0, waitBudgetMs 0, maxLines 0); the server's
limits (`rest-lsp serve --max-new-tokens/--completion-ms/--kv-cache-mb`, given here as `--server-*`) cap it, and the
table gives the other editors' p50/p95 apart from editor 0's.
Per run: requests, requests/s (requests over the run's wall time), p50/p95 latency in ms and in plain decoding
steps (ms/token of the same model decoding plainly in this process, measured first), suggestions identical to the
local run's at the same step, requests per replica; the kill run adds retries and when the replacement served.

    .venv/bin/python benchmarks/bench_serve.py [--corpus DIR] [--functions 3] [--lines 6] [--pause-ms 50]
        [--model M] [--dtype float32] [--threads 1] [--max-new-tokens 32] [--hog]
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_replay import choose_functions, plan_episode, prepare_workspace  # noqa: E402
from benchmarks.harness import corpus_files, percentile, stdlib_corpora  # noqa: E402
from rest_lsp.service.completion import CompletionService, NoEvents  # noqa: E402
from rest_lsp.settings import Settings  # noqa: E402

TOKEN = secrets.token_urlsafe(32)
HOG = dict(max_new_tokens=4096, time_budget_ms=0, wait_budget_ms=0, max_lines=0)  # the most an editor may ask


class Editor:
    """One person writing the episodes into a service, as server.py drives it."""

    def __init__(self, service, root: Path, episodes, pause_s: float, name: str, index: int = 0):
        self.service, self.root, self.episodes, self.pause_s, self.name = service, root, episodes, pause_s, name
        self.index = index
        self.records: list[dict] = []
        self.progress = 0

    def run(self) -> None:
        for episode in self.episodes:
            path = str(self.root / episode.file)
            uri = Path(path).as_uri()
            text = episode.opened
            first = episode.steps[0]
            offset = sum(len(line) for line in text.splitlines(keepends=True)[:first.line]) + len(first.indent)
            self.service.change_buffer(path, text)
            self.service.moved(uri, text, offset)
            for s, step in enumerate(episode.steps):
                time.sleep(self.pause_s * (3 if s == 0 else 1))
                started = time.perf_counter()
                got = self.service.submit(uri, text, offset).future.result(120)
                ms = (time.perf_counter() - started) * 1e3
                self.records.append({"key": (episode.file, episode.function, s), "ms": ms, "editor": self.index,
                                     "text": got.text if got else None})
                self.progress += 1
                insert = step.rest + step.after
                text = text[:offset] + insert + text[offset:]
                offset += len(insert)
                self.service.cancel(uri)
                self.service.change_buffer(path, text)
                self.service.expect(uri, text, offset)
            self.service.close_buffer(path)


def plan(corpus: Path, functions: int, lines: int, seed: int):
    files = corpus_files(corpus)
    rng = random.Random(seed)
    chosen = choose_functions(files, functions, rng)
    episodes = [plan_episode(files[name], fn, lines, rng, name) for name, fn in chosen]
    return files, chosen, episodes


def settings_of(args, **kw) -> Settings:
    values = dict(model=args.model, dtype=args.dtype, device="cpu", max_new_tokens=args.max_new_tokens,
                  cache_dir=str(args.work / "client-cache"))
    return Settings(**(values | kw))


def plain_ms_per_token(args) -> float:
    """The model's plain decoding step here (the unit of the latency columns)."""
    service = CompletionService(settings_of(args, draft_budget=0, prefetch=False, suggestion_cache_size=0,
                                            cache_dir=None))
    service.start([])
    assert service.wait_ready(300), service.load_error
    prompts = ["import os\n\n\ndef main():\n    ", "class Point:\n    def __init__(self, x, y):\n        ",
               "def parse(text):\n    result = []\n    for line in text.splitlines():\n        "]
    for i, p in enumerate(prompts):  # warm-up: its steps are left out
        service.submit(f"mem://w{i}.py", p, len(p)).future.result(120)
    before = service.stats()
    for i, p in enumerate(prompts * 2):
        service.submit(f"mem://p{i}.py", p + "\n" * (i // 3), len(p) + i // 3).future.result(120)
    after = service.stats()
    service.close()
    return (after["decode_ms"] - before["decode_ms"]) / max(1, after["generated_tokens"] - before["generated_tokens"])


def run_editors(make_service, args, k: int, label: str, kill_after: float | None = None) -> dict:
    """`make_service(i)`: editor i's service."""
    files, chosen, episodes = plan(args.corpus, args.functions, args.lines, args.seed)
    editors, services = [], []
    for i in range(k):
        root = args.work / f"{label}-{i}"
        prepare_workspace(args.corpus, root, files, chosen)
        service = make_service(i)
        service.start([root])
        assert service.wait_ready(300)
        if hasattr(service, "wait_indexed"):
            service.wait_indexed(300)
        _wait_synced(service)
        services.append(service)
        editors.append(Editor(service, root, episodes, args.pause_ms / 1e3, f"{label}-{i}", i))
    threads = [threading.Thread(target=e.run, name=e.name) for e in editors]
    started = time.perf_counter()
    for t in threads:
        t.start()
    killed = _kill_when(editors, services[0], kill_after, sum(len(e.steps) for e in episodes)) if kill_after else None
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    stats = [s.stats() for s in services]
    for s in services:
        s.close()
    records = [r for e in editors for r in e.records]
    out = {"label": label, "k": k, "wall_s": wall, "records": records, "stats": stats}
    if killed is not None:
        out["kill"] = killed
    return out


def _wait_synced(service, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while service.stats().get("snapshots_sent", 1) < 1:
        assert time.monotonic() < deadline, "the workspace never reached the server"
        time.sleep(0.2)


def _kill_when(editors, service, fraction: float, total: int) -> dict:
    """SIGKILL editor 0's replica once it has made `fraction` of its requests; when a replacement serves."""
    from ray import serve

    while editors[0].progress < fraction * total:
        time.sleep(0.05)
    pid = service._http.call("GET", f"/v1/workspaces/{service.workspace}/stats")["pid"]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    seen_down = False  # Serve notices the death at a health check: RUNNING drops, then a replacement brings it back
    while time.monotonic() - killed < 120:
        running = serve.status().applications["rest-lsp"].deployments["rest-lsp"].replica_states.get("RUNNING", 0)
        seen_down = seen_down or running < 2
        if seen_down and running == 2:
            return {"pid": pid, "replacement_s": round(time.monotonic() - killed, 1)}
        time.sleep(0.25)
    return {"pid": pid, "replacement_s": None}


def start_cluster(args, replicas: int) -> str:
    from rest_lsp.commands import serve as serve_command

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)  # serve's own defaults for every flag not given here
    ns = parser.parse_args(["--token-file", str(args.token_file)])
    ns.__dict__.update(model=args.model, dtype=args.dtype, device="cpu", replicas=replicas, num_cpus=args.threads,
                       num_gpus=0, host="127.0.0.1", port=port, workspace_mb=2048)
    for name in ("max_new_tokens", "completion_ms", "kv_cache_mb"):
        if getattr(args, f"server_{name}") is not None:
            setattr(ns, name, getattr(args, f"server_{name}"))
    return serve_command.start(ns, ray_init={"_temp_dir": str(args.ray_dir)})


def summarize(run: dict, baseline: dict[tuple, str | None], step_ms: float) -> dict:
    ms = [r["ms"] for r in run["records"]]
    same = sum(1 for r in run["records"] if r["key"] in baseline and r["text"] == baseline[r["key"]])
    # a suggestion the local run gave and this one did not (its client gave up waiting), or another text
    missing = sum(1 for r in run["records"] if r["text"] is None and baseline.get(r["key"]) is not None)
    other = sum(1 for r in run["records"] if r["text"] is not None and r["text"] != baseline.get(r["key"]))
    replicas: dict[str, int] = {}
    for s in run["stats"]:
        for name, n in (s.get("replicas") or {}).items():
            replicas[name[:6]] = replicas.get(name[:6], 0) + n
    p50, p95 = percentile(ms, 50), percentile(ms, 95)
    return {"run": run["label"], "k": run["k"], "requests": len(ms), "req_s": len(ms) / run["wall_s"],
            "p50_ms": p50, "p95_ms": p95, "p50_steps": p50 / step_ms, "p95_steps": p95 / step_ms,
            "identical": f"{same}/{len(ms)}", "missing": missing, "different": other, "replicas": replicas,
            "retried": sum(s.get("retried", 0) for s in run["stats"]), **split_latency(run["records"]),
            **run.get("kill", {})}


def split_latency(records: list[dict]) -> dict:
    """p50/p95 ms and mean suggestion length (chars) of editor 0 and of the others apart (editor 0 is the hog in
    a hog run)."""
    out = {}
    for name, mine in (("editor0", [r for r in records if r.get("editor", 0) == 0]),
                       ("others", [r for r in records if r.get("editor", 0) != 0])):
        if mine:
            ms = [r["ms"] for r in mine]
            out |= {f"{name}_p50_ms": percentile(ms, 50), f"{name}_p95_ms": percentile(ms, 95),
                    f"{name}_chars": sum(len(r["text"] or "") for r in mine) / len(mine)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, default=stdlib_corpora("json")[0])
    p.add_argument("--functions", type=int, default=3)
    p.add_argument("--lines", type=int, default=6)
    p.add_argument("--pause-ms", type=float, default=50)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="local,2x1,2x2,2x4,kill,1x4")
    p.add_argument("--hog", action="store_true", help="run each cluster run of 2+ editors again with editor 0 "
                   "asking for 4096-token completions with no time budget")
    p.add_argument("--server-max-new-tokens", type=int, default=None, help="serve's --max-new-tokens (its default)")
    p.add_argument("--server-completion-ms", type=int, default=None, help="serve's --completion-ms (its default)")
    p.add_argument("--server-kv-cache-mb", type=int, default=None, help="serve's --kv-cache-mb (its default)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    args.work = Path(tempfile.mkdtemp(prefix="bserve"))
    args.ray_dir = args.work / "ray"
    args.token_file = args.work / "token"
    args.token_file.write_text(TOKEN)
    args.token_file.chmod(0o600)
    ray_token = args.work / "ray_token"
    ray_token.write_text(secrets.token_hex(32))
    ray_token.chmod(0o600)
    os.environ.setdefault("RAY_AUTH_TOKEN_PATH", str(ray_token))
    wanted = args.runs.split(",")
    try:
        step_ms = plain_ms_per_token(args)
        print(f"plain step: {step_ms:.1f} ms/token", file=sys.stderr)
        results = []
        local = run_editors(lambda i: CompletionService(settings_of(args), NoEvents()), args, 1, "local")
        baseline = {r["key"]: r["text"] for r in local["records"]}
        results.append(summarize(local, baseline, step_ms))
        results += cluster_runs(args, 2, [w for w in wanted if w.startswith("2x") or w == "kill"], baseline, step_ms)
        if "1x4" in wanted:
            results += cluster_runs(args, 1, ["1x4"], baseline, step_ms)
        print_table(results, step_ms)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


def cluster_runs(args, replicas: int, runs: list[str], baseline, step_ms: float) -> list[dict]:
    from rest_lsp.commands import serve as serve_command

    if not runs:
        return []
    url = start_cluster(args, replicas)
    out = []
    try:
        for run in runs:
            if run == "kill":
                results = [run_editors(_remote(args, url), args, 2, f"{replicas}r-kill", kill_after=1 / 3)]
            else:
                k = int(run.split("x")[1])
                results = [run_editors(_remote(args, url), args, k, f"{replicas}r-k{k}")]
                if args.hog and k >= 2:
                    results.append(run_editors(_remote(args, url, hog=True), args, k, f"{replicas}r-k{k}-hog"))
            for result in results:
                out.append(summarize(result, baseline, step_ms))
                print(out[-1], file=sys.stderr)
    finally:
        serve_command.stop()
    return out


def _remote(args, url: str, hog: bool = False):
    """make_service for run_editors: editor i's RemoteService; with `hog`, editor 0 asks for the most it may."""
    from rest_lsp.team.remote import RemoteService

    def make(i: int):
        return RemoteService(settings_of(args, **(HOG if hog and i == 0 else {})), NoEvents(), url, TOKEN)

    return make


def print_table(results: list[dict], step_ms: float) -> None:
    print(f"plain decoding step: {step_ms:.1f} ms/token")
    print("| run | editors | requests | req/s | p50 ms | p95 ms | p50 steps | p95 steps | identical to local | "
          "none (timed out) | other text | requests per replica | retried | replacement s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['run']} | {r['k']} | {r['requests']} | {r['req_s']:.2f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} "
              f"| {r['p50_steps']:.1f} | {r['p95_steps']:.1f} | {r['identical']} | {r['missing']} | {r['different']} | "
              f"{' '.join(f'{n}' for n in sorted(r['replicas'].values(), reverse=True)) or '-'} | {r['retried']} | "
              f"{r.get('replacement_s', '-')} |")
    print()
    print("| run | editors | editor 0 p50 ms | editor 0 p95 ms | editor 0 chars | others p50 ms | others p95 ms | "
          "others chars |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        if "others_p50_ms" in r:
            print(f"| {r['run']} | {r['k']} | {r['editor0_p50_ms']:.0f} | {r['editor0_p95_ms']:.0f} "
                  f"| {r['editor0_chars']:.0f} | {r['others_p50_ms']:.0f} | {r['others_p95_ms']:.0f} "
                  f"| {r['others_chars']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
