"""Where REST's accepted tokens are lost: an oracle over the replay of a person writing code (bench_replay).

The replay runs as bench_replay runs it (same functions, pauses, cursor notifications, prefetch), through the real
server with REST on and today's settings, in one configuration. REST's greedy output is plain decoding's (REST =
plain), so each decode the server runs gives the model's own continuation once. Inside the server process (this
file started as its command, `--serve`), right after each decode, and before its output reaches the outputs store,
every position of that continuation is replayed without the model: the request's own draft sources are asked what
they would draft there, the tree is built as the decoder builds it (the node budget, the learned acceptance as it
stood when the decode began, the step-cost curve the decoder had learned), and the continuation says how far each
draft is right. The model's habits (the recycle source) are fed back in the order the decode taught them, so a
position sees what a decode reaching it had seen. Each decode's line in the record (`--out` with `.jsonl`) also
holds its continuation, every position's proposals, the acceptance table and the step-cost curve it was drafted
with, so that other trees can be counted from the record alone (`--report` counts one again).

Per position it records: each source's proposal (match length, how many of the next tokens it held), how many
tokens the full trie (every proposal, no budget), the budget's tree and the tree cut to the step cost would have
accepted, and the same with candidates the decoder does not use: a second, read-only datastore of the workspace's
dependencies (the standard library and the installed packages the workspace imports, the corpus itself and copies
of it left out; `--deps`), and trees without the learned acceptance. Counting then follows the steps REST would
take (each step accepts what its tree holds, plus the model's own token) and prints:
  - tokens/step along those steps: today's tree, the budget's tree, every draft, each candidate;
  - where the tokens went: accepted, cut by the step cost, cut by the node budget, held by no source;
  - per source and match length: how often it held the next token, how far, and alone.

    .venv/bin/python benchmarks/acceptance_oracle.py [--corpus DIR ...] [--functions 2] [--lines 6]
        [--pause-ms 1000] [--model M] [--dtype T] [--max-new-tokens N] [--deps] [--deps-tokens 4000000]
        [--seed 0] [--out benchmarks/results/oracle.json]
    .venv/bin/python benchmarks/acceptance_oracle.py --report benchmarks/results/oracle.jsonl   (a recorded run)
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import sys
import sysconfig
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import RESULTS, python_files, write_json  # noqa: E402

CAP = 10  # the sources' continuation length (drafts.CONTINUATION_LENGTH, the datastore's continuation_length)


# -- the server side: hooks around the decoder ------------------------------------------------------------------

class _Recording(threading.local):
    job: str = "request"
    doc: str = ""
    steps_at: int = 0  # len(seq) at the step being drafted
    taught: int = 0  # successors observed in this step so far
    table = None  # the SuccessorTable of the decode under way
    observed: list | None = None  # [(position, token, ids, probs)] of the decode under way


def install_hooks(record: Path, deps_spec: dict | None, tag: str, model_name: str) -> None:
    """Wrap the decoder's generate (and what it teaches the recycle source) so that every decode with drafts is
    followed by the oracle over its continuation, one JSON line per decode in `record`."""
    from rest_lsp.drafting.drafts import SuccessorTable
    from rest_lsp.engine import decoding
    from rest_lsp.service import completion

    rec = _Recording()
    deps = _DepsStore(deps_spec) if deps_spec else None
    lock = threading.Lock()

    complete = completion.CompletionService._complete

    def _complete(self, job):
        rec.job = "guess" if job.guess else "speculative" if job.speculative else "request"
        rec.doc = job.doc_id
        if deps is not None:
            deps.start(self._model.loaded.tokenizer)
        return complete(self, job)

    draft = decoding.Decoder._draft

    def _draft(self, seq, drafts, config, clock):
        rec.steps_at, rec.taught = len(seq), 0
        return draft(self, seq, drafts, config, clock)

    observe = SuccessorTable.observe_successors

    def observe_successors(self, token, ids, probs):
        if rec.observed is not None and self is rec.table:
            rec.observed.append((rec.steps_at - 1 + rec.taught, int(token), list(ids), list(probs)))
            rec.taught += 1
        observe(self, token, ids, probs)

    generate = decoding.Decoder.generate

    def generate_and_replay(self, prompt, drafts, config, should_stop=None, cancelled=None):
        if config.budget <= 0 or "warmup-" in rec.doc:  # bench_replay's unmeasured warm-up request
            return generate(self, prompt, drafts, config, should_stop, cancelled)
        from rest_lsp.drafting.acceptance import AcceptanceModel

        table = _find(drafts, SuccessorTable)
        before = _snapshot(table)
        acceptance = AcceptanceModel.from_json(self.acceptance.to_json("oracle"), "oracle")
        rec.table, rec.observed = table, []
        try:
            result = generate(self, prompt, drafts, config, should_stop, cancelled)
        finally:
            observed, rec.observed, rec.table = rec.observed, None, None
        curve = self.costs.curve() if self.costs.learn else self.costs._seed.curve
        after = _snapshot(table)
        try:
            line = replay_decode(self, list(prompt), list(result.tokens), drafts, config.budget, acceptance, curve,
                                 table, before, observed, deps)
        except Exception:  # the oracle's own failure: said in a file beside the record, the decode still served
            import traceback

            with lock, open(record.with_suffix(".err"), "a") as f:
                f.write(traceback.format_exc())
            return result
        finally:
            _restore(table, after)
        line.update(corpus=tag, job=rec.job, steps=result.steps, finish=result.finish, model=model_name)
        with lock, open(record, "a") as f:
            f.write(json.dumps(line) + "\n")
        return result

    completion.CompletionService._complete = _complete
    decoding.Decoder._draft = _draft
    decoding.Decoder.generate = generate_and_replay
    SuccessorTable.observe_successors = observe_successors


def _find(drafts, kind):
    """The source of type `kind` inside a request's drafts (wrappers hold `inner`, a mix its sources)."""
    seen = [drafts]
    while seen:
        d = seen.pop()
        if isinstance(d, kind):
            return d
        if hasattr(d, "inner"):
            seen.append(d.inner)
        for _, s in getattr(d, "sources", []) + getattr(d, "fallback", []):
            seen.append(s)
    return None


def _snapshot(table):
    return None if table is None else (dict(table._ids), dict(table._probs))


def _restore(table, state) -> None:
    if table is not None and state is not None:
        table._ids, table._probs = dict(state[0]), dict(state[1])


class _DepsStore:
    """The candidate second datastore: the standard library and the installed packages the workspace imports,
    indexed once with the model's tokenizer in a thread of its own, capped at `tokens`."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.store = None
        self.info: dict = {}
        self._thread: threading.Thread | None = None

    def start(self, tokenizer) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._build, args=(tokenizer,), daemon=True)
            self._thread.start()

    def ready(self):
        if self._thread is not None:
            self._thread.join()
        return self.store

    def _build(self, tokenizer) -> None:
        from rest_lsp.datastore.store import Datastore, Source

        t0 = time.perf_counter()
        files = [Path(p) for p in self.spec["files"]]
        store = Datastore(background_merges=False)
        total, batch, puts = 0, [], []
        for path in files:
            try:
                batch.append((str(path), path.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError):
                continue
            if len(batch) == 64 or path == files[-1]:
                for (name, _), ids in zip(batch, tokenizer.encode_batch([t for _, t in batch])):
                    puts.append((name, ids, Source.WORKSPACE))
                    total += len(ids)
                batch = []
                if total >= self.spec["tokens"]:
                    break
        store.apply(puts)
        self.store = store
        self.info = {"files": len(puts), "tokens": total, "build_s": round(time.perf_counter() - t0, 1)}


def replay_decode(decoder, prompt, tokens, drafts, budget, acceptance, curve, table, before, observed, deps) -> dict:
    """The oracle over one decode: per position of its continuation, what each source and tree would accept."""
    from rest_lsp.drafting.draft_tree import build_tree, fit_to_cost
    from rest_lsp.drafting.drafts import DatastoreDrafts, DraftMix, propose

    _restore(table, before)
    mix = _find(drafts, DraftMix)
    extra = DatastoreDrafts(deps.ready()) if deps is not None and mix is not None else None
    positions = []
    j = 0
    for i in range(len(tokens)):
        seq = prompt + tokens[:i]
        while j < len(observed) and observed[j][0] <= len(seq) - 2:  # what the steps before this one taught
            _, token, ids, probs = observed[j]
            table.observe_successors(token, ids, probs)
            j += 1
        truth = tokens[i:]
        props = decoder._usable(propose(drafts, seq), len(seq))
        row = {"src": [[p.source, p.match_length, proposal_depth(p, truth)] for p in props],
               # the proposals themselves, so that other trees can be counted from the record alone
               "props": [[p.source, p.match_length, list(p.under), list(p.tokens), list(p.parents),
                          [round(r, 4) for r in p.ratios]] for p in props]}
        row.update(accepted_by(props, seq[-1], truth, budget, acceptance, curve, build_tree, fit_to_cost, ""))
        row["budget_raw"] = tree_depth(build_tree(seq[-1], props, budget, None), truth)
        # today's tree size, its nodes ranked by the sources' own ratios instead of the learned acceptance
        row["fit_raw"] = tree_depth(build_tree(seq[-1], props, row["fit_nodes"], None), truth)
        if extra is not None:
            mix.sources.append(("deps", extra))
            try:
                with_deps = decoder._usable(propose(drafts, seq), len(seq))
            finally:
                mix.sources.pop()
            deps_props = [p for p in with_deps if p.source == "deps"]
            row["deps"] = [[p.match_length, proposal_depth(p, truth)] for p in deps_props]
            # scored as a datastore: the learned acceptance of the workspace's proposals
            scored = [_renamed(p, "workspace") if p.source == "deps" else p for p in with_deps]
            row.update(accepted_by(scored, seq[-1], truth, budget, acceptance, curve, build_tree, fit_to_cost,
                                   "deps_"))
        positions.append(row)
    return {"prompt": len(prompt), "tokens": len(tokens), "positions": positions, "truth": tokens,
            "acceptance": acceptance.to_json("oracle"), "curve": list(curve),
            "deps_store": deps.info if deps is not None and deps.store is not None else None}


def _renamed(prop, source):
    import dataclasses

    return dataclasses.replace(prop, source=source)


def accepted_by(props, root, truth, budget, acceptance, curve, build_tree, fit_to_cost, prefix: str) -> dict:
    """Tokens of `truth` accepted by every draft (no budget), the budget's tree, and that tree cut to the cost."""
    full = build_tree(root, props, 1 << 20, acceptance)
    tree = build_tree(root, props, budget, acceptance)
    fitted = fit_to_cost(tree, curve)
    return {prefix + "all": tree_depth(full, truth), prefix + "budget": tree_depth(tree, truth),
            prefix + "fit": tree_depth(fitted, truth), prefix + "fit_nodes": len(fitted) - 1,
            prefix + "leaf": _ends_at_leaf(fitted, truth)}


def tree_depth(tree, truth) -> int:
    """How many tokens of `truth` the walk from the root accepts (the model's own next token not counted)."""
    kids = tree.children()
    node, depth = 0, 0
    for t in truth:
        node = kids[node].get(t)
        if node is None:
            break
        depth += 1
    return depth


def _ends_at_leaf(tree, truth) -> bool:
    """The accepted path ran out of drafts at CAP or deeper (a longer draft could have gone on)."""
    kids = tree.children()
    node, depth = 0, 0
    for t in truth:
        nxt = kids[node].get(t)
        if nxt is None:
            return False
        node, depth = nxt, depth + 1
        if not kids[node]:
            return depth >= CAP and depth < len(truth)
    return False


def proposal_depth(prop, truth) -> int:
    """How many tokens of `truth` one proposal holds on a path: its deepest node on the path (its `under` tokens
    count when they are right and one of its own nodes follows them); 0 when none of its own nodes is right."""
    k = len(prop.under)
    if tuple(truth[:k]) != tuple(prop.under):
        return 0
    depth = [-1] * len(prop)  # per node: its depth when it lies on the path, else -1
    best = 0
    for i, (t, parent) in enumerate(zip(prop.tokens, prop.parents)):
        d = k if parent < 0 else depth[parent]
        if 0 <= d < len(truth) and truth[d] == t:
            depth[i] = d + 1
            best = max(best, d + 1)
    return best


def serve(argv: list[str]) -> int:
    """`--serve --record FILE [--deps-spec FILE] -- <rest-lsp flags>`: the language server, hooked."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--deps-spec", type=Path, default=None)
    parser.add_argument("--tag", default="")
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    spec = json.loads(args.deps_spec.read_text()) if args.deps_spec else None
    model = rest[rest.index("--model") + 1] if "--model" in rest[:-1] else "the default model"
    install_hooks(args.record, spec, args.tag, Path(model).name)
    from rest_lsp.cli import main as cli_main

    return cli_main(["--stdio", *rest])


# -- the dependencies a workspace imports ------------------------------------------------------------------------

def imported_roots(folder: Path) -> set[str]:
    """Top-level module names the Python files under `folder` import (absolute imports only)."""
    names: set[str] = set()
    for path in python_files(folder):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def dependency_files(corpus: Path, tokens: int) -> list[str]:
    """The files of the candidate dependencies datastore for a workspace copied from `corpus`: the installed
    packages it imports first, then the standard library (tests, idle and tkinter left out), never the corpus
    itself nor a copy of it (a package vendoring it), up to about `tokens` tokens (4 characters a token)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    own = corpus.name
    roots = sorted(imported_roots(corpus) - {own})
    packages = [site / r for r in roots if (site / r).is_dir()] + [site / f"{r}.py" for r in roots
                                                                  if (site / f"{r}.py").is_file()]
    skip = {"test", "tests", "idlelib", "tkinter", "lib2to3", "site-packages", "__pycache__", "turtledemo",
            "ensurepip", "pydoc_data"}
    chosen: list[str] = []
    budget = tokens * 4
    resolved = corpus.resolve()
    for root in [*packages, stdlib]:
        files = [root] if root.is_file() else python_files(root)
        for path in files:
            rel = path.relative_to(root.parent if root != stdlib else stdlib).parts
            if skip.intersection(rel) or own in rel or path.resolve().is_relative_to(resolved):
                continue
            size = path.stat().st_size
            if size > 400_000:
                continue
            chosen.append(str(path))
            budget -= size
            if budget <= 0:
                return chosen
    return chosen


# -- the driver ------------------------------------------------------------------------------------------------

def run_replay(args: argparse.Namespace, record: Path) -> dict:
    """bench_replay's run with the one REST configuration, its server started through `serve`."""
    from benchmarks import bench_replay

    record.parent.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    spec_files: dict[str, Path] = {}
    if args.deps:
        for corpus in args.corpus:
            spec = {"files": dependency_files(corpus, args.deps_tokens), "tokens": args.deps_tokens}
            spec_files[corpus.name] = record.with_name(f"{record.stem}-deps-{corpus.name}.json")
            spec_files[corpus.name].write_text(json.dumps(spec))
    current = {}

    def server_command(*flags: str) -> list[str]:
        extra = ["--deps-spec", str(spec_files[current["corpus"]])] if current.get("corpus") in spec_files else []
        return [sys.executable, str(Path(__file__).resolve()), "--serve", "--record", str(current["record"]),
                "--tag", current["corpus"], *extra, "--", *flags]

    bench_replay.server_command = server_command
    argv = ["--configs", "rest", "--functions", str(args.functions), "--lines", str(args.lines),
            "--pause-ms", str(args.pause_ms), "--seed", str(args.seed)]
    for name in ("model", "dtype", "max_new_tokens"):
        if getattr(args, name) is not None:
            argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    results = {"replays": []}
    for corpus in args.corpus:  # one corpus a server, so that each gets its own dependencies datastore
        current.update(corpus=corpus.name, record=record)
        replay_args = bench_replay.parse_args([*argv, "--corpus", str(corpus)])
        out = asyncio.run(bench_replay.run(replay_args))
        bench_replay.add_summary(out, ["rest"])
        results["replays"].append({"corpus": corpus.name, "summary": out["summary"], "plans": out["plans"]})
    return results


# -- counting --------------------------------------------------------------------------------------------------

def load(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def _value(p: dict, key) -> int:
    return key(p) if callable(key) else p[key]


def ideal(p: dict) -> int:
    """What a tree of today's size accepts when its nodes are the right ones, as far as any source held them."""
    return min(p["all"], p["fit_nodes"])


def deps_fallback(key: str):
    """The dependencies datastore asked only where no other source matched more than WEAK_MATCH tokens (as the
    recycle source is)."""
    from rest_lsp.drafting.drafts import WEAK_MATCH

    def value(p: dict) -> int:
        weak = max((m for _, m, _ in p["src"]), default=0) <= WEAK_MATCH
        return p["deps_" + key] if weak else p[key]
    return value


def walk(positions: list[dict], key, cap_chain: bool = False) -> tuple[int, int]:
    """(steps, tokens) of REST over one continuation when each step accepts `key` drafts plus its own token.
    `cap_chain`: a step whose path ran out of drafts at CAP goes on into the next step's (longer drafts)."""
    i, steps, n = 0, 0, len(positions)
    while i < n:
        steps += 1
        while True:
            got = min(_value(positions[i], key), n - i - 1)
            leaf = cap_chain and positions[i].get("leaf") and got >= CAP
            i += got + 1
            if not leaf or i >= n:
                break
    return steps, n


def tokens_per_step(decodes: list[dict], key: str, cap_chain: bool = False) -> float:
    """Over every decode; NaN when a decode was recorded without `key`."""
    if not callable(key) and not all(key in p for d in decodes for p in d["positions"]):
        return float("nan")
    steps = tokens = 0
    for d in decodes:
        s, t = walk(d["positions"], key, cap_chain)
        steps, tokens = steps + s, tokens + t
    return tokens / steps if steps else float("nan")


def trajectory(positions: list[dict], key: str = "fit") -> list[int]:
    """The positions REST's steps start at when each accepts `key` drafts."""
    out, i, n = [], 0, len(positions)
    while i < n:
        out.append(i)
        i += min(positions[i][key], n - i - 1) + 1
    return out


def losses(decodes: list[dict]) -> dict:
    """Along today's steps: drafts accepted, cut by the step cost, by the node budget, and steps where no source
    held the next token (nor anything)."""
    c = defaultdict(int)
    for d in decodes:
        pos = d["positions"]
        for i in trajectory(pos):
            p, room = pos[i], len(pos) - i - 1
            fit, budget, every = (min(p[k], room) for k in ("fit", "budget", "all"))
            c["steps"] += 1
            c["accepted"] += fit
            c["cost_cut"] += budget - fit
            c["budget_cut"] += every - budget
            c["none"] += room > 0 and every == 0
            c["last"] += room == 0
            c["capped"] += bool(p.get("leaf"))
    return dict(c)


def bucket_name(m: int) -> str:
    return "0" if m <= 0 else str(m) if m <= 2 else "3-4" if m <= 4 else "5-8" if m <= 8 else "9+"


def per_source(decodes: list[dict]) -> dict:
    """At today's steps: per (source, match bucket): proposals, holding the next token, mean tokens held, holding
    the most alone."""
    table = defaultdict(lambda: [0, 0, 0, 0])
    for d in decodes:
        pos = d["positions"]
        for i in trajectory(pos):
            if i == len(pos) - 1:
                continue
            srcs = pos[i]["src"] + [["deps", m, h] for m, h in pos[i].get("deps", [])]
            best = max((h for _, _, h in pos[i]["src"]), default=0)
            top = [s for s, _, h in pos[i]["src"] if h == best and best > 0]
            for source, m, held in srcs:
                row = table[(source, bucket_name(m))]
                row[0] += 1
                row[1] += held > 0
                row[2] += held
                row[3] += source != "deps" and len(set(top)) == 1 and top[0] == source
    return table


def report(decodes: list[dict], label: str) -> str:
    n_tok = sum(d["tokens"] for d in decodes)
    real_steps = sum(d["steps"] for d in decodes)
    jobs = defaultdict(int)
    for d in decodes:
        jobs[d["job"]] += 1
    out = [f"### {label}: {len(decodes)} decodes ({', '.join(f'{k} {v}' for k, v in sorted(jobs.items()))}), "
           f"{n_tok} tokens", ""]
    rows = [("REST as it ran (server steps)", n_tok / real_steps if real_steps else float("nan")),
            ("oracle, today's tree (budget, learned acceptance, cut to the learned step cost)",
             tokens_per_step(decodes, "fit")),
            ("oracle, the budget's tree, no cost cut", tokens_per_step(decodes, "budget")),
            ("oracle, the budget's tree without learned acceptance", tokens_per_step(decodes, "budget_raw")),
            ("oracle, today's tree size without learned acceptance", tokens_per_step(decodes, "fit_raw")),
            ("oracle, today's tree size, its nodes the right ones where a source held them",
             tokens_per_step(decodes, ideal)),
            ("oracle, every draft of every source (no budget)", tokens_per_step(decodes, "all")),
            ("candidate: longer drafts where a path runs out at the cap (upper bound)",
             tokens_per_step(decodes, "fit", cap_chain=True))]
    if all("deps_fit" in p for d in decodes for p in d["positions"]) and decodes:
        rows += [("candidate: + dependencies datastore, today's tree", tokens_per_step(decodes, "deps_fit")),
                 ("candidate: + dependencies datastore, the budget's tree", tokens_per_step(decodes, "deps_budget")),
                 ("candidate: + dependencies datastore, every draft", tokens_per_step(decodes, "deps_all")),
                 ("candidate: + dependencies datastore where nothing else matched over 2 tokens, today's tree",
                  tokens_per_step(decodes, deps_fallback("fit"))),
                 ("candidate: + dependencies datastore where nothing else matched over 2 tokens, the budget's tree",
                  tokens_per_step(decodes, deps_fallback("budget")))]
    out += ["| tokens/step | |", "|---|---|"] + [f"| {name} | {v:.2f} |" for name, v in rows if v == v]
    c = losses(decodes)
    if c:
        out += ["", "Along today's steps (tokens of the continuation):", "",
                "| steps | drafts accepted | cut by the step cost | cut by the node budget | steps no source held "
                "| last-token steps | paths out of drafts at the cap |", "|---|---|---|---|---|---|---|",
                f"| {c['steps']} | {c['accepted']} | {c['cost_cut']} | {c['budget_cut']} | {c['none']} | "
                f"{c['last']} | {c['capped']} |"]
    table = per_source(decodes)
    out += ["", "Per source at today's steps (the step's last token left out):", "",
            "| source | match | proposed | held the next token | tokens held, mean | held the most, alone |",
            "|---|---|---|---|---|---|"]
    order = ["0", "1", "2", "3-4", "5-8", "9+"]
    for (source, b), (n, hit, held, alone) in sorted(table.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        out.append(f"| {source} | {b} | {n} | {hit} ({hit / n:.0%}) | {held / n:.2f} | {alone} |")
    stores = [d["deps_store"] for d in decodes if d.get("deps_store")]
    if stores:
        out += ["", f"Dependencies datastore: {stores[0]['files']} files, {stores[0]['tokens']} tokens, built in "
                    f"{stores[0]['build_s']} s."]
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, action="append", help="default: bench_replay's corpora")
    parser.add_argument("--functions", type=int, default=2)
    parser.add_argument("--lines", type=int, default=6)
    parser.add_argument("--pause-ms", type=float, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--deps", action="store_true", help="measure a dependencies datastore as a candidate")
    parser.add_argument("--deps-tokens", type=int, default=4_000_000)
    parser.add_argument("--report", type=Path, default=None, help="count a recorded run (its .jsonl) again")
    parser.add_argument("--out", type=Path, default=RESULTS / "oracle.json")
    args = parser.parse_args(argv)
    if args.corpus is None:
        from benchmarks.bench_replay import DEFAULT_CORPORA

        args.corpus = list(DEFAULT_CORPORA)
    args.corpus = [c.resolve() for c in args.corpus]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve":
        return serve(argv[1:])
    args = parse_args(argv)
    record = (args.report or args.out.with_suffix(".jsonl")).resolve()
    results = {} if args.report else run_replay(args, record)
    decodes = load(record)
    by_corpus = defaultdict(list)
    for d in decodes:
        by_corpus[d.get("corpus", "all")].append(d)
    model = decodes[0].get("model") if decodes else None
    model = model or (Path(args.model).name if args.model else "the default model")
    parts = [report(ds, f"{model}, {name}") for name, ds in sorted(by_corpus.items())]
    if len(by_corpus) > 1:
        parts.append(report(decodes, f"{model}, all corpora"))
    text = "\n\n".join(parts)
    print(text)
    if not args.report:
        write_json(args.out, {"oracle": text, **results}, ["benchmarks/acceptance_oracle.py", *argv])
        print(f"\nsaved {args.out} and {record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
