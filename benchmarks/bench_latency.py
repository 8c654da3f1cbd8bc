"""Inline-completion latency through the real language server over stdio (pygls' LanguageClient).

What is measured: the time from sending `textDocument/inlineCompletion` to receiving its reply, for
completions of up to 32 tokens, at function starts (the first body line, after its indentation) of real
Python files from this machine's standard library, with
  - COLD: a new document, its first request (the decoder's KV cache holds an unrelated file);
  - WARM: the same request after typing one more character (the file's real next character), so the
    decoder reuses the KV cache of the common prefix (or type-through answers without decoding);
each WITH REST (the server's default draft budget) and WITHOUT (draft budget 0).

Setup: the server starts with the default model (or --model), fp32 on CPU, server defaults except
maxNewTokens. The workspace folder holds a few other standard-library files (indexed, they feed REST's
drafts). Each target file is opened as the text before the cursor (a file written top to bottom), so the
datastore never holds the answer itself. One unmeasured request warms the process up first.

    .venv/bin/python benchmarks/bench_latency.py [--positions 8] [--workspace-files 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from lsprotocol import types

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.lsp_client import ServerSession, position_of, server_command  # noqa: E402
from rest_lsp.settings import Settings  # noqa: E402

DEF_LINE = re.compile(r"^[ \t]*(async[ \t]+)?def [A-Za-z_]\w*\(.*\).*:[ \t]*$")


def function_starts(text: str) -> list[int]:
    """Offsets of the first body character of each one-line `def` whose body starts on the next line."""
    lines = text.split("\n")
    starts, offset = [], 0
    for i, line in enumerate(lines[:-1]):
        body = lines[i + 1]
        if DEF_LINE.match(line) and body.strip() and len(body) - len(body.lstrip()) > len(line) - len(line.lstrip()):
            starts.append(offset + len(line) + 1 + len(body) - len(body.lstrip()))
        offset += len(line) + 1
    return starts


def pick(stdlib: Path, rng: random.Random, n_targets: int, n_workspace: int) -> tuple[list[Path], list[tuple[Path, int]]]:
    """Workspace files, and one seeded function start in each of n_targets other files."""
    files = sorted(p for p in stdlib.glob("*.py") if 8_000 <= p.stat().st_size <= 150_000)
    rng.shuffle(files)
    workspace, targets = files[:n_workspace], []
    for path in files[n_workspace:]:
        text = path.read_text(encoding="utf-8", errors="replace")
        starts = [s for s in function_starts(text) if s > 2_000]  # some file above the cursor
        if starts:
            targets.append((path, rng.choice(starts)))
        if len(targets) == n_targets:
            break
    return workspace, targets


async def run(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()  # the cores may be shared: say how busy they were
    rng = random.Random(args.seed)
    workspace_files, targets = pick(args.stdlib, rng, args.positions, args.workspace_files)
    if len(targets) < args.positions:
        raise SystemExit(f"bench_latency: found only {len(targets)} target files in {args.stdlib}.")
    tmp = Path(tempfile.mkdtemp(prefix="rest-lsp-bench-"))
    root = tmp / "workspace"
    root.mkdir()
    for path in workspace_files:
        shutil.copy(path, root / path.name)

    options = {"maxNewTokens": args.max_new_tokens, "cacheDir": str(tmp / "cache")}
    if args.model:
        options["model"] = args.model
    t0 = time.perf_counter()
    bench: ServerSession | None = None
    results: dict = {}
    try:
        bench = await ServerSession.start(server_command("--log-level", "WARNING"), root, options)
        load_s = time.perf_counter() - t0
        while (stats := await bench.stats())["documents"] < len(workspace_files):
            await asyncio.sleep(0.2)
        index_s = time.perf_counter() - t0 - load_s

        # unmeasured: the first forward passes of a process pay one-time costs
        warm_uri = (tmp / "warmup.py").as_uri()
        bench.open(warm_uri, "import os\n\n\ndef main():\n    ")
        await bench.inline(warm_uri, types.Position(4, 4))

        default_budget = Settings().draft_budget
        modes = [("REST", default_budget), ("no REST", 0)]
        rows = []
        for m, (mode, budget) in enumerate(modes):
            bench.configure({"draftBudget": budget})
            await bench.stats()  # the configuration is applied before the next request
            # each mode starts on another file than the last one measured, so its first request is cold too
            order = targets[m * len(targets) // 2:] + targets[: m * len(targets) // 2]
            for path, cursor in order:
                text = path.read_text(encoding="utf-8", errors="replace")
                before = text[:cursor]
                uri = (tmp / mode.replace(" ", "-") / path.name).as_uri()
                bench.open(uri, before)
                at = position_of(before)
                cold_ms, cold_text, cold_how, _, _ = await bench.inline(uri, at)
                char = text[cursor]
                bench.insert(uri, at, char)
                warm_ms, warm_text, warm_how, _, _ = await bench.inline(uri, position_of(before + char))
                rows.append({
                    "mode": mode, "draft_budget": budget, "file": path.name, "line": before.count("\n") + 1,
                    "typed": char, "cold_ms": round(cold_ms, 1), "cold_text": cold_text, "cold_answer": cold_how,
                    "warm_ms": round(warm_ms, 1), "warm_text": warm_text, "warm_answer": warm_how,
                })
                print(f"{mode:8} {path.name:24} cold {cold_ms:7.0f} ms ({cold_how})  "
                      f"warm {warm_ms:7.0f} ms ({warm_how})", file=sys.stderr)
        final = await bench.stats()
    finally:
        try:
            if bench is not None:
                await bench.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def summary(mode: str, key: str) -> dict:
        values = [r[f"{key}_ms"] for r in rows if r["mode"] == mode]
        decoded = [r[f"{key}_ms"] for r in rows if r["mode"] == mode and r[f"{key}_answer"] != "type-through"]
        return {"median_ms": round(statistics.median(values), 1), "min_ms": min(values), "max_ms": max(values),
                "decoded_median_ms": round(statistics.median(decoded), 1) if decoded else None,
                "type_through": len(values) - len(decoded)}

    same = sum(a["cold_text"] == b["cold_text"] for a in rows if a["mode"] == "REST"
               for b in rows if b["mode"] == "no REST" and b["file"] == a["file"])
    results = {
        "driver": "the real server over stdio (pygls LanguageClient), time from request sent to reply received",
        "model": args.model or "default (SmolLM2-135M-Instruct, from its .gguf)",
        "device": "cpu", "dtype": "float32 (server default on CPU)", "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "stdlib": str(args.stdlib),
        "workspace_files": [p.name for p in workspace_files],
        "positions": [{"file": p.name, "offset": c} for p, c in targets],
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "model_load_s": round(load_s, 1), "index_s": round(index_s, 1),
        "summary": {mode: {"cold": summary(mode, "cold"), "warm": summary(mode, "warm")} for mode, _ in modes},
        "same_cold_text_rest_vs_plain": f"{same}/{len(targets)}",
        "server_stats": final, "messages": bench.messages, "requests": rows,
    }
    return results


def table(results: dict) -> str:
    s = results["summary"]
    lines = [
        f"Inline completion, up to {results['max_new_tokens']} tokens, {len(results['positions'])} function starts "
        f"(seed {results['seed']}); {results['driver']}; {results['model']}, {results['dtype']}, CPU.",
        "",
        "| request | REST: median (min-max) ms | no REST: median (min-max) ms |",
        "|---|---|---|",
    ]
    for key, label in (("cold", "cold (new document, first request)"), ("warm", "warm (one more character typed)")):
        cells = []
        for mode in ("REST", "no REST"):
            c = s[mode][key]
            cell = f"{c['median_ms']:.0f} ({c['min_ms']:.0f}-{c['max_ms']:.0f})"
            if c["type_through"]:
                cell += f"; {c['type_through']} type-through, decoded only: {c['decoded_median_ms']:.0f}" \
                    if c["decoded_median_ms"] is not None else "; all type-through"
            cells.append(cell)
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    stats = results["server_stats"]
    lines += ["", f"Same cold completion with and without REST: {results['same_cold_text_rest_vs_plain']}. "
              f"Server over the run: mean tokens/step {stats['mean_tokens_per_step']:.2f}, "
              f"mean ms/token {stats['mean_ms_per_token']:.0f}. Model load {results['model_load_s']} s, "
              f"workspace ({len(results['workspace_files'])} files) indexed in {results['index_s']} s. "
              f"Load average (1 min) before/after: {results['load_average_before_after']} "
              f"on {results['cpu_count']} cores."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=8)
    parser.add_argument("--workspace-files", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--model", default=None, help="default: the bundled default model")
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "latency.json")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nsaved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
