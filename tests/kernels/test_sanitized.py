"""The kernels built with AddressSanitizer and UndefinedBehaviorSanitizer (REST_LSP_KERNEL_SANITIZE=1, libasan
preloaded) in a process of their own: the call that corrupted the heap in issue 42, and prefill chunks of every
row count a step takes, run without a single report.

The regression of issue 42: row_attn gave each OpenMP thread scratch for the value rows (`vr`) sized by the first
task that grew it, and grew it only when a task's rows x score-row length grew; a later task of fewer rows with a
longer tail (the last, short block of 8 rows) wrote past its end. One thread and a mask whose last short block sees
every key makes it happen on every run; in the server it was a prefill chunk's last block taken by a thread whose
previous task was block 0 (a thread held back by a busy core). .ci/sanitize.sh runs the whole kernel suite and the
stress test under the sanitizers (this test builds only row_attention's sanitized library: the others' builds
cost too much for every run of the suite).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rest_lsp.kernels import loader

CALLS = r"""
import torch
from rest_lsp.kernels import row_attention
from rest_lsp.kernels.buffers import CALLS

MIN = -1e30
assert row_attention.library() is not None
gen = torch.Generator().manual_seed(0)

# issue 42: one thread, rows 0-7 see themselves, row 8 (a block of its own) every one of 40 keys
torch.set_num_threads(1)
q, k, v = torch.randn(1, 9, 16, generator=gen), torch.randn(1, 40, 16, generator=gen), torch.randn(1, 40, 16)
mask = torch.full((9, 40), MIN)
for i in range(8):
    mask[i, i] = 0
mask[8] = 0
row_attention.row_attn(q, k, v, 40, mask, 0, 0.25)

# prefill chunks of every size a step takes, at every offset of a block of 8, on two threads
torch.set_num_threads(2)
hq, hkv, d = 9, 3, 64
k, v = torch.randn(hkv, 300, d, generator=gen), torch.randn(hkv, 300, d, generator=gen)
for past in (0, 5, 200):
    for n in (*range(1, 18), 24, 25, 33, 41, 57):
        causal = torch.full((n, n), MIN).triu_(1)
        row_attention.row_attn(torch.randn(hq, n, d, generator=gen), k, v, past + n, causal, past, 0.125)
print("calls:", dict(CALLS))
"""


def asan_runtime() -> str | None:
    """The compiler's libasan, where there is one (what the sanitized kernels need loaded first)."""
    cc = loader._compiler()
    if cc is None:
        return None
    found = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return found if found and Path(found).is_file() else None


def test_the_kernels_run_their_calls_under_the_sanitizers_without_a_report(tmp_path):
    if loader.sanitizing():
        pytest.skip("this process runs its kernels under the sanitizers already (.ci/sanitize.sh)")
    runtime = asan_runtime()
    if runtime is None:
        pytest.skip("no compiler here with AddressSanitizer's runtime (libasan)")
    env = dict(os.environ, LD_PRELOAD=runtime, ASAN_OPTIONS="detect_leaks=0", REST_LSP_KERNEL_SANITIZE="1",
               REST_LSP_CACHE_DIR=os.environ.get("REST_LSP_CACHE_DIR", str(tmp_path)))
    done = subprocess.run([sys.executable, "-c", CALLS], capture_output=True, text=True, env=env, timeout=600)
    reports = [line for line in done.stderr.splitlines() if "ERROR: AddressSanitizer" in line or "runtime error" in line]
    assert done.returncode == 0 and not reports, (reports or done.stderr[-3000:])
    assert "'row_attn': 68" in done.stdout, done.stdout  # the library's own check, then 1 + 3 x 22 calls
