"""Load time, peak memory and ms/token of rest-lsp's gguf mode against llama.cpp, per .gguf file: the real 0.5B and
the 1.5B/7B-shaped files of benchmarks/shaped_gguf.py.

    .venv/bin/python benchmarks/bench_sizes.py --dir /work/shaped [--real] [--n-new 32] [--prompt-tokens 256]
        [--threads 2] [--mem-cap-gb 20] [--sides rest,llama.cpp] [--timeout-s 1800]

Each (file, side) runs in its own child process under an address-space cap (`prlimit --as`): --mem-cap-gb (default:
20 GB or 80% of the memory available now, whichever is less) plus the file's size (a memory-mapped file counts in
the address space but its pages can be dropped); a load too big for the machine fails there and its row says "out
of memory" instead of the machine swapping or the OOM killer choosing a victim. In the child: the load (rest-lsp: rest_lsp.engine.model.load_model(file, "cpu", "gguf"),
as bench_rest loads; llama.cpp: llama-cpp-python's Llama, else the llama-server that build_llama_server.sh built),
one short warm-up, then plain greedy decoding of --n-new tokens after a --prompt-tokens prompt of real code (the
same token ids on both sides). Reported per child: load seconds, peak RSS (VmHWM of the process: what the mapped
file pages and the heap reached together), RSS after decoding split into anonymous memory and file pages,
prefill ms, ms per new token after the first. rest-lsp's conversion cache goes to a temporary folder that is
removed afterwards (a 7B's fp32 conversion would be tens of GB on disk).

LLAMA_CPP_LIB_PATH=<build>/build/bin (an AVX2-only build of build_llama_server.sh) makes llama-cpp-python load
that build; --llama-label names the column. Prints a markdown table; writes benchmarks/results/<out>.json and
draws benchmarks/figures/<out>.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from benchmarks.harness import RESULTS, STDLIB, write_json  # noqa: E402

FIGURES = REPO / "benchmarks" / "figures"
SIDES = ("rest", "llama.cpp")
PROMPT_SOURCE = STDLIB / "json" / "encoder.py"  # real code every machine has
OOM_MARKS = ("MemoryError", "out of memory", "Cannot allocate memory", "std::bad_alloc", "failed to allocate",
             "mmap failed", "unable to allocate", "DefaultCPUAllocator: can't allocate")


# -- in the child -----------------------------------------------------------------------------------------------

def memory() -> dict:
    """This process's peak RSS and its RSS now split into anonymous memory and file pages, in MB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return {"peak_rss_mb": fields.get("VmHWM"), "rss_anon_mb": fields.get("RssAnon"),
            "rss_file_mb": fields.get("RssFile")}


def prompt_ids(path: Path, n: int) -> list[int]:
    """The first `n` tokens of real code, by the file's own tokenizer (rest-lsp's reading of it)."""
    from rest_lsp.engine.model import load_tokenizer

    tok = load_tokenizer(str(path))
    ids = tok.encode(PROMPT_SOURCE.read_text(encoding="utf-8"))
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def child_rest(path: Path, prompt: list[int], n_new: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from rest_lsp.drafting.drafts import ContextLookup
    from rest_lsp.engine.decoding import DecodeConfig, Decoder
    from rest_lsp.engine.model import load_model

    t0 = time.perf_counter()
    loaded = load_model(str(path), "cpu", "gguf")
    load_s = time.perf_counter() - t0
    decoder = Decoder(loaded)
    decoder.generate(prompt[:16], ContextLookup(), DecodeConfig(max_new_tokens=4, budget=0))  # warm-up
    decoder.reset()
    # the prompt and the first token (the first step computes the prompt's last CHAIN_TAIL tokens under it), then
    # plain decoding on the cache that left: one step per token after the first, as llama_cpp_peer counts
    first = decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=1, budget=0))
    result = decoder.generate(prompt + first.tokens, ContextLookup(),
                              DecodeConfig(max_new_tokens=n_new - 1, budget=0))
    return {"load_s": load_s, "mode": loaded.mode, "tokens": len(first.tokens) + len(result.tokens),
            "prefill_ms": first.prefill_ms + first.decode_ms,
            "ms_per_token": result.decode_ms / result.steps if result.steps else None,
            "later_prefill_tokens": result.prefill_tokens, **memory()}


def child_llama(path: Path, prompt: list[int], n_new: int, threads: int) -> dict:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return child_llama_server(path, prompt, n_new, threads)
    from llama_cpp_peer import _greedy, _llama

    t0 = time.perf_counter()
    llm = _llama(path, n_ctx=len(prompt) + n_new + 16, threads=threads)
    load_s = time.perf_counter() - t0
    _greedy(llm, prompt[:16], 4)  # warm-up
    run = _greedy(llm, prompt, n_new)
    return {"load_s": load_s, "mode": "llama-cpp-python", "tokens": len(run.tokens), "prefill_ms": run.first_ms,
            "ms_per_token": run.ms_per_token, **memory()}


def child_llama_server(path: Path, prompt: list[int], n_new: int, threads: int) -> dict:
    """llama-server as the peer where llama-cpp-python is missing: its process's memory, its own timings."""
    import asyncio

    from llama_vim import LlamaServer, find_binary

    binary = find_binary()
    if binary is None:
        raise SystemExit("no llama.cpp: install the bench extra or build llama-server (build_llama_server.sh)")
    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    t0 = time.perf_counter()
    server = asyncio.run(LlamaServer.start(binary, path, threads, log))
    load_s = time.perf_counter() - t0
    try:
        body = {"n_predict": n_new, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"], "ignore_eos": True,
                "cache_prompt": False}
        server.post("/completion", {**body, "prompt": prompt[:16], "n_predict": 4})
        status, reply = server.post("/completion", {**body, "prompt": prompt})
        if status != 200:
            raise SystemExit(f"llama-server answered {status}: {reply}")
        t = reply["timings"]
        status_file = Path(f"/proc/{server.pid}/status").read_text().splitlines()
        mem = {k: int(v.split()[0]) / 1024 for k, _, v in (line.partition(":") for line in status_file)
               if k in ("VmHWM", "RssAnon", "RssFile")}
    finally:
        server.stop()
        log.unlink(missing_ok=True)
    return {"load_s": load_s, "mode": "llama-server", "tokens": t["predicted_n"], "prefill_ms": t["prompt_ms"],
            "ms_per_token": t["predicted_per_token_ms"], "peak_rss_mb": mem.get("VmHWM"),
            "rss_anon_mb": mem.get("RssAnon"), "rss_file_mb": mem.get("RssFile")}


def child_main(args: argparse.Namespace) -> int:
    prompt = json.loads(args.prompt.read_text())
    run = child_rest if args.child == "rest" else child_llama
    print("RESULT " + json.dumps(run(args.file, prompt, args.n_new, args.threads)), flush=True)
    return 0


# -- in the parent ----------------------------------------------------------------------------------------------

def classify_failure(returncode: int, stderr: str, cap_gb: float) -> str:
    """One sentence for a child that gave no result: out of memory under the cap, killed, or its last error line."""
    if any(mark.lower() in stderr.lower() for mark in OOM_MARKS):
        return f"out of memory (address space capped at {cap_gb:.1f} GB)"
    if returncode < 0 or returncode in (137, 139):
        return f"killed (signal {-returncode if returncode < 0 else returncode - 128})"
    last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "no output")
    return f"failed (exit {returncode}): {last[:160]}"


def available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return 20.0


def wait_policy(load: float, cores: int, threads: int) -> str | None:
    """OpenMP's wait policy for the children: PASSIVE on a loaded machine (llama_cpp_peer.busy: a spinning thread
    beside a descheduled one costs either side tenfold), else the default (each thread spins a while at a barrier;
    PASSIVE there sleeps and wakes it at every parallel region, which slows both sides on a quiet machine:
    docs/LOG.md, 2026-12-05 evening). Decided once, before the first child: the load the children themselves make
    must not decide it for the next."""
    from benchmarks.llama_cpp_peer import busy

    return "PASSIVE" if busy(threads, load, cores) else None


def run_child(side: str, file: Path, prompt: Path, args: argparse.Namespace) -> dict:
    cap = int(args.mem_cap_gb * (1 << 30)) + file.stat().st_size
    env = dict(os.environ)
    cache = tempfile.mkdtemp(prefix="rest-lsp-sizes-cache-")
    env["REST_LSP_CACHE_DIR"] = cache  # rest-lsp's conversion cache: removed below
    if args.wait_policy:
        env.setdefault("OMP_WAIT_POLICY", args.wait_policy)
    command = ["prlimit", f"--as={cap}", "--", sys.executable, str(Path(__file__).resolve()), "--child", side,
               "--file", str(file), "--prompt", str(prompt), "--n-new", str(args.n_new), "--prompt-tokens", str(args.prompt_tokens),
               "--threads", str(args.threads)]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout_s} s"}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    wall = time.perf_counter() - t0
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[len("RESULT "):]), "wall_s": wall}
    return {"error": classify_failure(out.returncode, out.stderr + out.stdout, cap / (1 << 30)), "wall_s": wall,
            "stderr_tail": out.stderr[-1500:]}


def files_to_run(args: argparse.Namespace) -> list[Path]:
    files = [Path(f) for f in args.files or []]
    if args.dir:
        files += sorted(Path(args.dir).glob("*.gguf"), key=lambda p: p.stat().st_size)
    if args.real:
        from shaped_gguf import real_qwen_gguf

        files.insert(0, real_qwen_gguf())
    return files


def _gb(mb) -> str:
    return "-" if mb is None else f"{mb / 1024:.2f}"


def _cell(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(rows: list[dict], sides: list[str], labels: dict) -> str:
    head = ("| file | GB | side | load s | peak RSS GB (x file) | RSS anon / file pages GB | prefill ms | ms/token | "
            "ms/token vs llama.cpp |")
    out = [head, "|---" * 9 + "|"]
    for r in rows:
        peer = r["sides"].get("llama.cpp", {}).get("ms_per_token")
        for side in sides:
            x = r["sides"].get(side, {})
            name = f"{labels[side]} ({x['mode']})" if x.get("mode") else labels[side]
            if "error" in x:
                out.append(f"| {r['name']} | {r['gb']:.2f} | {name} | {x['error']} | | | | | |")
                continue
            ratio = f"{x['ms_per_token'] / peer:.2f}x" if peer and x.get("ms_per_token") else "-"
            times = x["peak_rss_mb"] / 1024 / r["gb"] if x.get("peak_rss_mb") else None
            out.append(f"| {r['name']} | {r['gb']:.2f} | {name} | {x['load_s']:.1f} | {_gb(x.get('peak_rss_mb'))} "
                       f"({_cell(times, '.1f')}x) | {_gb(x.get('rss_anon_mb'))} / {_gb(x.get('rss_file_mb'))} | "
                       f"{_cell(x.get('prefill_ms'), '.0f')} | {_cell(x.get('ms_per_token'), '.1f')} | {ratio} |")
    return "\n".join(out)


def plot(rows: list[dict], sides: list[str], labels: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, speed) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = list(range(len(rows)))
    w = 0.8 / len(sides)
    for k, side in enumerate(sides):
        shift = [i + (k - (len(sides) - 1) / 2) * w for i in x]
        peak = [r["sides"].get(side, {}).get("peak_rss_mb") or 0 for r in rows]
        step = [r["sides"].get(side, {}).get("ms_per_token") or 0 for r in rows]
        mem.bar(shift, [p / 1024 for p in peak], w, label=labels[side])
        speed.bar(shift, step, w, label=labels[side])
        for i, r in enumerate(rows):
            if "error" in r["sides"].get(side, {}):
                mem.text(shift[i], 0, "failed", rotation=90, ha="center", va="bottom", fontsize=8)
    mem.plot(x, [r["gb"] for r in rows], "k_", markersize=30, label="file size")
    for ax, label in ((mem, "peak RSS, GB"), (speed, "ms / new token (plain greedy)")):
        ax.set_xticks(x, [r["name"].replace("qwen2.5-coder-", "").replace(".gguf", "") for r in rows],
                      rotation=20, fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("bench_sizes: load memory and decoding speed per .gguf (shaped files: random weights)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help=".gguf files")
    ap.add_argument("--dir", type=Path, help="also every .gguf in this folder (smallest first)")
    ap.add_argument("--real", action="store_true", help="also the real Qwen2.5-Coder-0.5B file, first")
    ap.add_argument("--sides", default=",".join(SIDES), help="comma-separated, from: " + ", ".join(SIDES))
    ap.add_argument("--n-new", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--mem-cap-gb", type=float, default=None,
                    help="each child's address-space cap beyond the file's size (default: min(20, 80%% of the "
                         "memory available))")
    ap.add_argument("--timeout-s", type=int, default=1800, help="each child's time limit")
    ap.add_argument("--llama-label", default="llama.cpp", help="the llama.cpp column's name (e.g. llama.cpp AVX2)")
    ap.add_argument("--out", default="sizes")
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--prompt", type=Path, help=argparse.SUPPRESS)  # a JSON list of token ids
    args = ap.parse_args(argv)
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if bad := [s for s in args.sides if s not in SIDES]:
        ap.error(f"--sides takes {', '.join(SIDES)}; got {', '.join(bad)}")
    if args.mem_cap_gb is None:
        args.mem_cap_gb = round(min(20.0, 0.8 * available_gb()), 1)
    if args.n_new < 2 or args.prompt_tokens < 16 or args.mem_cap_gb <= 0:
        ap.error("--n-new must be at least 2, --prompt-tokens at least 16, --mem-cap-gb positive.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if shutil.which("prlimit") is None:
        raise SystemExit("bench_sizes: needs prlimit (util-linux) to cap each child's memory.")
    files = files_to_run(args)
    if not files:
        raise SystemExit("bench_sizes: no .gguf file given (name files, --dir or --real).")
    labels = {"rest": "rest-lsp", "llama.cpp": args.llama_label}
    args.wait_policy = wait_policy(os.getloadavg()[0], len(os.sched_getaffinity(0)), args.threads)
    rows = []
    for file in files:
        row = {"file": str(file), "name": file.name, "gb": file.stat().st_size / 1e9, "sides": {}}
        # the prompt's token ids, read here: a tokenizer built in a child would count in its memory
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(prompt_ids(file, args.prompt_tokens), f)
        try:
            for side in args.sides:
                row["sides"][side] = got = run_child(side, file, Path(f.name), args)
                print(f"{file.name} {side}: {got}", file=sys.stderr, flush=True)
        finally:
            os.unlink(f.name)
        rows.append(row)
    text = table(rows, args.sides, labels)
    policy = os.environ.get("OMP_WAIT_POLICY") or args.wait_policy or "the default"
    print(f"threads {args.threads}, prompt {args.prompt_tokens} tokens, {args.n_new} new tokens, each child capped at "
          f"{args.mem_cap_gb:g} GB of address space plus its file's size; load average {os.getloadavg()[0]:.1f}; "
          f"OpenMP wait policy: {policy}\n")
    print(text)
    write_json(RESULTS / f"{args.out}.json", {"rows": rows, "threads": args.threads, "n_new": args.n_new,
                                              "prompt_tokens": args.prompt_tokens, "mem_cap_gb": args.mem_cap_gb,
                                              "llama_label": args.llama_label, "omp_wait_policy": policy})
    png = FIGURES / f"{args.out}.png"
    plot(rows, args.sides, labels, png)
    print(f"\nsaved {RESULTS / f'{args.out}.json'} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
