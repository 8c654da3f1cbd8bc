"""The peer a CPU user would run instead: llama.cpp's plain greedy decoding of the same GGUF, same prompts, threads.

    .venv/bin/python benchmarks/llama_cpp_peer.py [--gguf FILE] [--corpus DIR] [--prompts 12] [--n-new 64]
                                                  [--context 512] [--threads 2] [--llama-tokenizer]

Needs llama-cpp-python (`pip install -e .[bench]`; it builds llama.cpp from source), or else the llama-server
that `benchmarks/build_llama_server.sh` builds (the same sources; timed by the server's own clock). Prompts are the completion
points of bench_rest.py, tokenized by rest-lsp's tokenizer and fed to llama.cpp as token ids, so both sides
decode exactly the same prompts; --llama-tokenizer tokenizes the text with llama.cpp's own tokenizer instead and
reports how many prompts tokenize identically. Prints a markdown table: per prompt, prefill + first token, then
ms per later token (the same split as bench_rest's plain column).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass
class PeerRun:
    prompt_tokens: int
    first_ms: float  # prefill and the first new token
    ms_per_token: float  # each later token
    tokens: list[int]
    drafted: int = 0  # llama-server's speculation: draft tokens proposed
    accepted: int = 0  # and accepted

    @property
    def tokens_per_step(self) -> float:
        """New tokens after the first per decoding pass (1 without speculation)."""
        after_first = max(0, len(self.tokens) - 1)
        passes = after_first - self.accepted
        return after_first / passes if passes > 0 else 1.0


def _llama(gguf_path: str | Path, n_ctx: int, threads: int):
    try:
        from llama_cpp import Llama
    except ImportError as err:
        raise SystemExit(f"llama-cpp-python is not installed ({err}); install the bench extra: pip install -e .[bench]")
    return Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                 verbose=False)


def _greedy(llm, prompt: Sequence[int], n_new: int) -> PeerRun:
    """Plain greedy decoding from a cold cache; EOS does not stop it (as min_new_tokens in bench_rest)."""
    llm.reset()  # n_tokens = 0: generate() then finds no prefix to reuse and prefills the whole prompt
    out: list[int] = []
    t0 = time.perf_counter()
    first = None
    for token in llm.generate(list(prompt), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        out.append(int(token))
        if first is None:
            first = time.perf_counter()
        if len(out) == n_new:
            break
    end = time.perf_counter()
    return PeerRun(len(prompt), (first - t0) * 1e3, (end - first) * 1e3 / max(1, len(out) - 1), out)


def _server_runs(binary: Path, gguf_path: str | Path, prompts: Sequence[Sequence[int]], n_new: int,
                 threads: int, extra: tuple[str, ...] = ()) -> list[PeerRun]:
    """The same greedy decoding through llama-server's `/completion` (token ids in, its own timings out: prompt_ms
    is the prefill, predicted_per_token_ms each new token after the first), no prompt cache between prompts;
    `extra`: more server flags (llama_vim.SPEC_FLAGS' speculation)."""
    import asyncio
    import tempfile

    from llama_vim import LlamaServer

    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    server = asyncio.run(LlamaServer.start(binary, Path(gguf_path), threads, log, extra=extra))
    runs = []
    try:
        for i, prompt in enumerate([list(prompts[0][:16])] + [list(p) for p in prompts]):
            status, reply = server.post("/completion", {
                "prompt": prompt, "n_predict": n_new, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"],
                "ignore_eos": True, "cache_prompt": False, "return_tokens": True})
            if status != 200:
                raise SystemExit(f"llama-server answered {status}: {reply}\n{server.log_tail()}")
            t = reply["timings"]
            if i:  # the first is the warm-up: it pages the weights in
                runs.append(PeerRun(len(prompt), t["prompt_ms"] + t["predicted_per_token_ms"],
                                    t["predicted_per_token_ms"], list(reply.get("tokens", [])),
                                    int(t.get("draft_n", 0) or 0), int(t.get("draft_n_accepted", 0) or 0)))
    finally:
        server.stop()
        log.unlink(missing_ok=True)
    return runs


def llama_cpp_runs(
    gguf_path: str | Path, prompts: Sequence[Sequence[int]] | Sequence[str], n_new: int, threads: int
) -> list[PeerRun]:
    """llama.cpp's plain greedy decoding of each prompt (token ids as given, or text tokenized by llama.cpp): in
    this process through llama-cpp-python where it is installed, else through the llama-server that
    build_llama_server.sh built (token ids only)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        from llama_vim import find_binary

        binary = find_binary()
        if binary is not None and all(not isinstance(p, str) for p in prompts):
            return _server_runs(binary, gguf_path, prompts, n_new, threads)
    llm = _llama(gguf_path, n_ctx=8, threads=threads)  # only to tokenize; the real context is sized below
    ids = [llm.tokenize(p.encode("utf-8"), add_bos=False) if isinstance(p, str) else list(p) for p in prompts]
    del llm
    llm = _llama(gguf_path, n_ctx=max(len(p) for p in ids) + n_new + 16, threads=threads)
    _greedy(llm, ids[0][:16], 4)  # warm-up: first calls allocate and page the weights in
    return [_greedy(llm, p, n_new) for p in ids]


def llama_server_runs(gguf_path: str | Path, prompts: Sequence[Sequence[int]], n_new: int, threads: int,
                      spec: str | None = None) -> list[PeerRun] | None:
    """Greedy decoding of token-id prompts by llama-server ($LLAMA_SERVER or what build_llama_server.sh built),
    with llama_vim.SPEC_FLAGS[spec]'s speculation when `spec` is given; None where no llama-server is built."""
    from llama_vim import SPEC_FLAGS, find_binary

    binary = find_binary()
    if binary is None:
        return None
    return _server_runs(binary, gguf_path, prompts, n_new, threads, SPEC_FLAGS[spec] if spec else ())


def llama_cpp_plain(
    gguf_path: str | Path, prompts: Sequence[Sequence[int]] | Sequence[str], n_new: int, threads: int
) -> list[float]:
    """Per-prompt ms per new token (after the first) of llama.cpp's plain greedy decoding."""
    return [run.ms_per_token for run in llama_cpp_runs(gguf_path, prompts, n_new, threads)]


def llama_tokenize(gguf_path: str | Path, texts: Sequence[str]) -> list[list[int]]:
    llm = _llama(gguf_path, n_ctx=8, threads=1)
    return [llm.tokenize(t.encode("utf-8"), add_bos=False) for t in texts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="the GGUF file (default: the model rest-lsp ships)")
    ap.add_argument("--corpus", type=Path, action="append", help="a folder of Python code (default: stdlib asyncio)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--n-new", type=int, default=64)
    ap.add_argument("--context", type=int, default=512, help="prompt tokens kept (the tail)")
    ap.add_argument("--threads", type=int, default=None, help="default: torch's thread count, as bench_rest runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-tokenizer", action="store_true", help="tokenize the prompt text with llama.cpp")
    args = ap.parse_args()

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.harness import completion_points, python_files, stdlib_corpora

    from rest_lsp.engine.model import DEFAULT_MODEL, load_tokenizer

    gguf = args.gguf or DEFAULT_MODEL
    threads = args.threads or torch.get_num_threads()
    corpora = args.corpus or stdlib_corpora("asyncio")
    tok = load_tokenizer(gguf)
    names, texts, ids = [], [], []
    for corpus in corpora:
        files = python_files(corpus)
        for path, offset in completion_points(files, args.prompts, args.seed):
            text = path.read_text(encoding="utf-8", errors="replace")[:offset]
            prompt = tok.encode(text)[-args.context:]
            names.append(f"{corpus.name}/{path.relative_to(corpus)}")
            ids.append(prompt)
            texts.append(tok.decode(prompt))
    if args.llama_tokenizer:
        theirs = llama_tokenize(gguf, texts)
        same = sum(a == b for a, b in zip(theirs, (tok.encode(t) for t in texts)))
        print(f"llama.cpp's tokenizer gives rest-lsp's token ids for {same}/{len(texts)} prompts")
        prompts: list = texts
    else:
        prompts = ids
    runs = llama_cpp_runs(gguf, prompts, args.n_new, threads)
    print(f"llama.cpp plain greedy decoding of {gguf}, {threads} threads, {args.n_new} new tokens")
    print("| completion point | prompt tok | prefill + first token ms | ms/token | tokens/s |")
    print("|---|---|---|---|---|")
    for name, run in zip(names, runs):
        print(f"| {name} | {run.prompt_tokens} | {run.first_ms:.0f} | {run.ms_per_token:.1f} | "
              f"{1e3 / run.ms_per_token:.0f} |")
    med = statistics.median(r.ms_per_token for r in runs)
    print(f"| median | | {statistics.median(r.first_ms for r in runs):.0f} | {med:.1f} | {1e3 / med:.0f} |")
    warn_if_busy(threads)


def busy(threads: int, load: float, cores: int) -> bool:
    """Whether `threads` OpenMP threads share cores with other work at this load: each spins at every barrier, so a
    multi-threaded step waits for a descheduled thread (here 2 threads at load 3 on 2 cores: 427 ms/token;
    OMP_WAIT_POLICY=PASSIVE: 35)."""
    return threads > 1 and load > cores * 0.75


def warn_if_busy(threads: int) -> None:
    """A note where the timings just taken mostly measure OpenMP spin-waits (`busy`)."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if busy(threads, load, cores) and os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print(f"note: load average {load:.1f} on {cores} cores; with {threads} threads these timings mostly measure "
              "OpenMP spin-waits: rerun on an idle machine or with OMP_WAIT_POLICY=PASSIVE.")


if __name__ == "__main__":
    main()
