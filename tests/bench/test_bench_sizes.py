"""benchmarks/bench_sizes.py and llama_cpp_peer's counting: a child that runs out of its memory cap is reported as
such (one sentence), the table shows it, and speculation's tokens per pass (no llama.cpp needed)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from benchmarks.bench_sizes import classify_failure, parse_args, table  # noqa: E402
from benchmarks.llama_cpp_peer import PeerRun  # noqa: E402


def test_a_child_out_of_its_address_space_is_reported_as_out_of_memory():
    stderr = "Traceback (most recent call last):\n  ...\nRuntimeError: DefaultCPUAllocator: can't allocate memory"
    assert classify_failure(1, stderr, 20) == "out of memory (address space capped at 20.0 GB)"
    assert classify_failure(1, "terminate called after throwing an instance of 'std::bad_alloc'", 8).startswith(
        "out of memory")
    assert classify_failure(-9, "", 20) == "killed (signal 9)"
    assert classify_failure(2, "boom\nValueError: no such file\n", 20) == "failed (exit 2): ValueError: no such file"


def test_the_table_puts_both_sides_per_file_with_the_ratio_and_a_failed_load_as_its_reason():
    rows = [{"name": "m.gguf", "gb": 1.0, "sides": {
        "rest": {"error": "out of memory (address space capped at 20 GB)"},
        "llama.cpp": {"load_s": 1.5, "mode": "llama-cpp-python", "peak_rss_mb": 1536.0, "rss_anon_mb": 100.0,
                      "rss_file_mb": 1024.0, "prefill_ms": 300.0, "ms_per_token": 40.0}}},
            {"name": "n.gguf", "gb": 2.0, "sides": {
                "rest": {"load_s": 9.0, "mode": "gguf", "peak_rss_mb": 4096.0, "rss_anon_mb": 3072.0,
                         "rss_file_mb": 0.0, "prefill_ms": 500.0, "ms_per_token": 30.0},
                "llama.cpp": {"load_s": 1.0, "mode": "llama-server", "peak_rss_mb": 2048.0, "rss_anon_mb": 10.0,
                              "rss_file_mb": 2000.0, "prefill_ms": 200.0, "ms_per_token": 40.0}}}]
    text = table(rows, ["rest", "llama.cpp"], {"rest": "rest-lsp", "llama.cpp": "llama.cpp"})
    lines = text.splitlines()
    assert "| m.gguf | 1.00 | rest-lsp | out of memory (address space capped at 20 GB) |" in lines[2]
    assert "| 1.50 (1.5x) | 0.10 / 1.00 | 300 | 40.0 | 1.00x |" in lines[3]
    assert "rest-lsp (gguf) | 9.0 | 4.00 (2.0x) |" in lines[4] and lines[4].endswith("| 30.0 | 0.75x |")


def test_the_memory_cap_and_sides_are_checked():
    args = parse_args(["a.gguf", "--sides", "rest", "--mem-cap-gb", "8"])
    assert args.sides == ["rest"] and args.mem_cap_gb == 8.0
    import pytest

    with pytest.raises(SystemExit):
        parse_args(["a.gguf", "--sides", "vllm"])


def test_speculations_tokens_per_pass_count_the_tokens_after_the_first():
    assert PeerRun(10, 1.0, 1.0, list(range(11)), drafted=12, accepted=6).tokens_per_step == 10 / 4
    assert PeerRun(10, 1.0, 1.0, list(range(11))).tokens_per_step == 1.0
    assert PeerRun(10, 1.0, 1.0, [5]).tokens_per_step == 1.0


def test_children_wait_passively_only_on_a_loaded_machine():
    """OpenMP threads that sleep at every barrier cost a quiet machine's step (both sides); spinning beside a
    descheduled thread costs a loaded one far more."""
    from benchmarks.bench_sizes import wait_policy

    assert wait_policy(0.3, 2, 2) is None
    assert wait_policy(1.8, 2, 2) == "PASSIVE"
    assert wait_policy(8.0, 2, 1) is None  # one thread waits for no other
