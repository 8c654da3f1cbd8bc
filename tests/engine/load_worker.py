"""A process that runs `rest-lsp generate` (cli.main, in process) on each .gguf path read from stdin and answers one
JSON line per path: the exit code, what went to stderr, the process's peak RSS so far and whether the load reached
transformers. test_hostile_gguf.py drives it, so that torch and transformers are imported once for many files.

Usage: python load_worker.py PROMPT_FILE; then one path per line on stdin."""

import contextlib
import io
import json
import logging
import resource
import sys
import traceback


def main() -> None:
    from rest_lsp import cli
    from rest_lsp.engine import model

    prompt = sys.argv[1]
    reached = []
    real = model._from_pretrained

    def watched(folder, gguf_file, dtype):
        reached.append(gguf_file)
        return real(folder, gguf_file, dtype)

    model._from_pretrained = watched
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        path = line.rstrip("\n")
        reached.clear()
        err, out = io.StringIO(), io.StringIO()
        logging.root.handlers.clear()  # cli.main's basicConfig then writes to this call's stderr
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                rc = cli.main(["generate", "--model", path, "--dtype", "float32", "--max-new-tokens", "2", prompt])
            except BaseException:  # noqa: BLE001 - what the test looks for: a traceback the CLI let through
                traceback.print_exc()
                rc = -1
        print(json.dumps({"rc": rc, "stderr": err.getvalue(), "reached_transformers": bool(reached),
                          "max_rss_mb": peak_rss_mb()}), flush=True)


def peak_rss_mb() -> float:
    """This process's own peak RSS: VmHWM of its address space. Not getrusage's ru_maxrss, which after a fork and
    exec starts from the parent's RSS at the fork (a large pytest process would count as this worker's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main()
