#!/usr/bin/env bash
# The native kernels under AddressSanitizer and UndefinedBehaviorSanitizer (issue 42): the kernel tests and the
# concurrency stress test, every kernel built with REST_LSP_KERNEL_SANITIZE=1 (the kernels' own build flags, their
# own cache entries) and libasan loaded first. Fails on any report (the sanitizers abort at the first; the log is
# searched as well); prints how many kernel calls and stress steps ran under them. Called by ./dev.sh test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
CC=${CC:-$(command -v cc || command -v gcc)}
runtime=$("$CC" -print-file-name=libasan.so)
if [ ! -f "$runtime" ]; then
    echo "sanitize: $CC has no AddressSanitizer runtime (libasan.so): install it (gcc's libasan) to run this." >&2
    exit 1
fi
# the kernels' tests that run them (not the loader's: its trust checks build many libraries and run none of them
# on data), and the stress test
TESTS=(tests/kernels/test_kernel_bounds.py tests/kernels/test_panel_matmul.py tests/kernels/test_quant_matmul.py
       tests/kernels/test_quant_tiles.py tests/kernels/test_row_attention.py tests/kernels/test_logit_scan.py
       tests/engine/test_stress.py)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# detect_leaks=0: CPython itself leaks at exit by design; every other finding aborts the run
export LD_PRELOAD="$runtime${LD_PRELOAD:+:$LD_PRELOAD}" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 REST_LSP_KERNEL_SANITIZE=1 \
    PYTHONPATH=".ci${PYTHONPATH:+:$PYTHONPATH}"
set +e
# (nor the tests that build a deliberately wrong library or none: they run no kernel on data either; nor the
# comparison of every level's bits over large shapes, minutes under the sanitizers: test_quant_tiles runs every
# format, row count and level through the kernels here, and the comparison runs in the main pass)
"$PY" -m pytest -q -p sanitize_report --durations=5 -k "not computes_wrong_results and not without_a_compiler and not each_level_computes_the_same_bits" \
    "${TESTS[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if grep -q -E "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer" "$log"; then
    echo "sanitize: the sanitizers reported the error above." >&2
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "sanitize: the tests under the sanitizers failed (exit $status)." >&2
    exit "$status"
fi
grep -q "^sanitize: .* kernel calls" "$log" || { echo "sanitize: no count of the calls was printed." >&2; exit 1; }
echo "sanitize: 0 sanitizer reports."
