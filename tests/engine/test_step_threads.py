"""The thread count steps run on is learned from the plain steps the decoder times (rest_lsp/engine/step_threads.py):
steps move to fewer threads where another process holds a core and back when it is gone, an idle machine probes
nothing, probes that lose grow rare, and greedy REST writes plain decoding's tokens while the count changes under
it."""

from __future__ import annotations

import json
import random

import pytest

from rest_lsp.engine import step_threads
from rest_lsp.engine.step_threads import PROBE_MAX, PROBE_STEPS, StepThreads, counts


def run(threads: StepThreads, step_ms, steps: int, seed: int = 0, cores=lambda n, step: n) -> list[int]:
    """The count each of `steps` plain steps ran on, each timed step_ms(count, step) with 5% noise, in which the
    process got cores(count, step) cores."""
    rnd = random.Random(seed)
    ran = []
    for step in range(steps):
        threads.apply()
        ran.append(threads.running)
        seconds = step_ms(threads.running, step) * rnd.uniform(0.95, 1.05) / 1e3
        threads.record(seconds, seconds * cores(threads.running, step))
    return ran


def test_the_counts_tried_are_the_cores_one_fewer_half_and_one():
    assert counts(1) == [1]
    assert counts(2) == [2, 1]
    assert counts(8) == [8, 7, 4, 1]
    assert counts(3) == [3, 2, 1]


def test_steps_move_to_fewer_threads_while_another_process_holds_a_core_and_back_after():
    """2 cores: 17.5 ms on 2 threads, 30 on 1, while idle; beside a busy process 2 threads take 60 ms and get 1.4
    cores."""
    set_to = []
    threads = StepThreads(2, set_to.append)
    busy = range(200, 800)
    ms = lambda n, step: (60.0 if n == 2 else 31.0) if step in busy else (17.5 if n == 2 else 30.0)  # noqa: E731
    got = lambda n, step: 1.4 if n == 2 and step in busy else n  # noqa: E731
    ran = run(threads, ms, 1400, cores=got)
    assert set(ran[:200]) == {2} and set_to[0] == 2  # an idle machine: no probe down
    assert ran[220:800].count(1) > 0.9 * 580  # starved: down within a few steps, up-probes rare and short
    assert ran[-100:].count(2) > 90  # the load is gone: back on both cores
    assert threads.switches >= 2 and threads.current == 2


def test_an_idle_machine_probes_nothing():
    threads = StepThreads(2, lambda n: None)
    assert set(run(threads, lambda n, step: 17.5 if n == 2 else 30.0, 5000)) == {2} and threads.probes == 0


def test_probes_up_that_lose_grow_rare():
    """On 1 thread, 2 threads stay slower (a load that does not leave): the probes up back off to PROBE_MAX."""
    threads = StepThreads(2, lambda n: None)
    threads.current = 1
    ran = run(threads, lambda n, step: 60.0 if n == 2 else 31.0, 5000, cores=lambda n, step: 1.4 if n == 2 else 1)
    assert threads.switches == 0 and threads.wait["up"] == PROBE_MAX
    assert ran.count(2) == threads.probes * PROBE_STEPS and threads.probes <= 7


def test_a_count_about_as_fast_is_probed_less_and_less():
    """Starved on 2 threads, but 1 thread is no faster: the count stays, and the probes down back off."""
    threads = StepThreads(2, lambda n: None)
    ran = run(threads, lambda n, step: 20.0 if n == 2 else 21.0, 1000, cores=lambda n, step: 1.5 if n == 2 else 1)
    assert threads.switches == 0 and 3 <= threads.probes <= 8 and ran.count(1) == threads.probes * PROBE_STEPS


def test_the_count_is_set_only_when_it_changes():
    """4 cores, starved (3 got): each count's probe down loses clearly, and the count is set at each probe's start
    and end alone."""
    set_to = []
    threads = StepThreads(4, set_to.append)
    run(threads, lambda n, step: 10.0 * 4 / n, 300, cores=lambda n, step: 3.0 if n == 4 else n)
    assert set_to[0] == 4 and all(a != b for a, b in zip(set_to, set_to[1:]))
    assert threads.probes > 2 and len(set_to) == 1 + 2 * threads.probes


def test_one_core_has_nothing_to_choose():
    threads = StepThreads(1, lambda n: None)
    assert set(run(threads, lambda n, step: 10.0, 500)) == {1} and threads.probes == 0


def test_greedy_rest_is_plain_decoding_while_the_thread_count_changes(monkeypatch, tmp_path, two_threads):
    """The gguf mode on a CPU: a probe after every plain step, each one won, so the count moves between 2 threads
    and 1 all through the walks of perfect, useless, partly right and branchy drafts; every step's tokens are plain
    decoding's."""
    from test_exactness import assert_rest_is_plain_decoding
    from test_gguf_mode import needs_kernel, write_gguf

    from rest_lsp.engine.decoding import Decoder
    from rest_lsp.engine.model import load_model

    needs_kernel()
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(step_threads, "PROBE_EVERY", 1)
    monkeypatch.setattr(step_threads, "WINDOW", 1)
    monkeypatch.setattr(step_threads, "PROBE_STEPS", 1)
    monkeypatch.setattr(step_threads, "STARVED", -10.0)  # always starved: a probe down whenever one may start
    # every probe wins, however long its steps took beside a busy core (a 2-thread step of a tiny model can wait out
    # a whole time slice there): the count flips after each
    monkeypatch.setattr(step_threads, "MARGIN", 1e9)
    decoder = Decoder(load_model(str(write_gguf(tmp_path / "tiny.gguf", "qwen2", True)), "cpu", "gguf"))
    assert decoder.threads is not None and decoder.threads.counts == [2, 1]
    assert_rest_is_plain_decoding(decoder, decoder.vocab_size, budgets=(4, 16), seeds=range(2))
    assert decoder.threads.switches > 10


def test_each_thread_count_sizes_trees_by_its_own_steps(monkeypatch, tmp_path, two_threads):
    """Rows nearly free on 2 threads, dearer than a plain step on 1: after a switch to 1 thread trees shrink to plain
    steps, and back on 2 they are whole chains again at once, from the curve the 2-thread steps taught; what is kept
    for the next start is the curve of all the cores."""
    import torch
    from test_gguf_mode import needs_kernel, write_gguf
    from test_step_cost import FLAT, STEEP, _Oracle

    from rest_lsp.engine.decoding import DecodeConfig, Decoder
    from rest_lsp.engine.model import load_model
    from rest_lsp.engine.step_cost import from_learned_json

    needs_kernel()
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(step_threads, "STARVED", 100.0)  # never starved, and no probe up: the test switches
    monkeypatch.setattr(step_threads, "PROBE_EVERY", 10**9)
    decoder = Decoder(load_model(str(write_gguf(tmp_path / "tiny.gguf", "qwen2", True)), "cpu", "gguf"))
    decoder.calibrate(tmp_path / "kept", measure=False)
    now = [0.0]
    real = decoder.verify

    def verify(tree, chain=()):
        cost = FLAT if torch.get_num_threads() == 2 else STEEP
        now[0] += 0.01 * cost(len(tree) + len(chain))
        return real(tree, chain)

    decoder.verify, decoder.clock = verify, lambda: now[0]
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38] * 3
    truth = decoder.generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=60, budget=0)).tokens
    config = DecodeConfig(max_new_tokens=60, budget=8)

    def per_step(n: int = 1) -> float:
        for _ in range(n):
            result = decoder.generate(prompt, _Oracle(prompt + truth), config)
            assert result.tokens == truth
            decoder.reset()
        return result.tokens_per_step

    assert per_step(8) > 3
    on_two = decoder.costs
    # StepThreads moves to 1 thread in the third step of a request, as it decides beside a busy process
    timed, seen = decoder.verify, []

    def switch_in_the_third(tree, chain=()):
        seen.append((on_two.steps, on_two.trees))
        if len(seen) == 3:
            decoder.threads.current = 1
        return timed(tree, chain)

    decoder.verify = switch_in_the_third
    per_step()
    decoder.verify = timed
    # no step after the switch was sized by or taught to the 2 threads' curve
    assert len(seen) > 4 and (on_two.steps, on_two.trees) == seen[3]
    assert decoder.costs is not on_two and decoder.costs.source == "other thread count" and decoder.costs.steps
    assert on_two.reference_s() is None  # its plain steps are no reference when steps come back to it
    assert per_step(12) < 1.3
    assert on_two.cost(8) < 1.2 < 2.0 < decoder.costs.cost(2)
    decoder.save_learned()
    decoder.threads.current = 2
    assert per_step() > 3 and decoder.costs is on_two
    kept = json.loads(next((tmp_path / "kept").rglob("learned-*.json")).read_text())
    assert from_learned_json(kept)[8] < 1.2  # the 2-thread curve, saved while steps ran on 1


def test_a_count_that_lost_a_probe_is_tried_again_once_the_current_one_is_slower_than_it_was():
    """Starved on 2 threads from the start, but 1 thread is no faster at first (both 30 ms) and the probes down back
    off; then the load grows and 2 threads take 60 ms: 1 thread (31 ms) is tried again within a few plain steps, not
    after the doubled wait."""
    threads = StepThreads(2, lambda n: None)
    starved = lambda n, step: 1.5 if n == 2 else 1  # noqa: E731
    run(threads, lambda n, step: 30.0 if n == 2 else 31.0, 300, cores=starved)
    assert threads.switches == 0 and threads.wait["down"] > 4 * step_threads.WINDOW  # the probes down lost
    # the process's other threads fill the cores its steps do not get: it looks fed, its steps say otherwise
    ran = run(threads, lambda n, step: 60.0 if n == 2 else 31.0, 30, cores=lambda n, step: n)
    assert ran.count(1) >= 20 and threads.current == 1  # switched within 10 plain steps of the change


def test_a_moments_slow_steps_do_not_hold_a_quiet_machine_on_one_thread():
    """2 cores, 22 ms a plain step on 2 threads and 41 on 1; for ten steps the host slows the 2-thread steps to 80 ms
    and the process gets 1.2 cores: the steps move to 1 thread, and back to 2 within a few plain steps once 1 thread
    is seen slower than 2 usually were, not after the back-off's wait (PROBE_EVERY plain steps); once back, no more
    probes than a quiet machine's."""
    threads = StepThreads(2, lambda n: None)
    slow = range(100, 110)
    ms = lambda n, step: (80.0 if step in slow else 22.0) if n == 2 else 41.0  # noqa: E731
    got = lambda n, step: 1.2 if n == 2 and step in slow else n  # noqa: E731
    ran = run(threads, ms, 1000, cores=got)
    assert 1 in ran[100:120] and threads.switches == 2  # down in the slow moment, back up once
    assert set(ran[130:]) == {2} and threads.probes == 2


def test_noisy_steps_of_two_counts_about_as_fast_make_no_more_probes(monkeypatch):
    """Starved on 2 threads, both counts 30 ms a plain step with 25% noise each way: the evidence for a probe again
    (a change of load: the current count's median a quarter slower than when the probe lost, checked once a fresh
    window) seldom comes from noise alone, so there are about as many probes as the back-off alone would run."""

    def probes(seed: int) -> int:
        rnd = random.Random(seed)
        threads = StepThreads(2, lambda n: None)
        for _ in range(5000):
            threads.apply()
            seconds = 0.030 * rnd.uniform(0.75, 1.25)
            threads.record(seconds, seconds * (1.5 if threads.running == 2 else 1.0))
        return threads.probes

    with_evidence = sum(probes(seed) for seed in range(6))
    monkeypatch.setattr(StepThreads, "_looks_faster", lambda self, other: False)
    assert with_evidence <= 1.5 * sum(probes(seed) for seed in range(6))


def _truth_and_two_thread_decoder(tmp_path, new_tokens: int):
    """A tiny gguf model's prompt, its plain continuation, and a fresh decoder on 2 threads (the one that computed
    the continuation may have chosen 1 on this machine)."""
    import torch
    from test_gguf_mode import write_gguf
    from test_step_cost import _Oracle

    from rest_lsp.engine.decoding import DecodeConfig, Decoder
    from rest_lsp.engine.model import load_model

    model = load_model(str(write_gguf(tmp_path / "tiny.gguf", "qwen2", True)), "cpu", "gguf")
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38] * 3
    truth = Decoder(model).generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=new_tokens, budget=0)).tokens
    torch.set_num_threads(2)
    return prompt, truth, Decoder(model)


def test_a_decoder_whose_steps_all_draft_moves_off_a_busy_core(monkeypatch, tmp_path, two_threads):
    """A REST server runs few plain steps: beside a busy process, where 2 threads step 4x slower than 1, steps that
    all verify trees still move it to 1 thread within a few requests (its tree steps count as the plain steps they
    are worth), and it writes plain decoding's tokens throughout."""
    import torch
    from test_gguf_mode import needs_kernel
    from test_step_cost import FLAT, _Oracle

    from rest_lsp.engine.decoding import DecodeConfig

    needs_kernel()
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    prompt, truth, decoder = _truth_and_two_thread_decoder(tmp_path, 60)
    assert decoder.threads.counts == [2, 1]
    decoder.calibrate(tmp_path / "kept", measure=False)
    now = [0.0]
    real = decoder.verify

    def verify(tree, chain=()):  # the process gets far less CPU time than the wall time: starved on 2 threads
        busy = 4.0 if torch.get_num_threads() == 2 else 1.0
        now[0] += 0.01 * busy * FLAT(len(tree) + len(chain))
        return real(tree, chain)

    decoder.verify, decoder.clock = verify, lambda: now[0]
    for _ in range(6):
        result = decoder.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=60, budget=8))
        assert result.tokens == truth
        assert result.tokens_per_step > 3  # the trees pay: few plain steps to time
        decoder.reset()
    assert decoder.threads.current == 1 and decoder.threads.switches == 1, decoder.threads.describe()


def test_a_tree_step_counts_as_the_plain_steps_it_is_worth(monkeypatch, tmp_path, two_threads):
    """Tree steps dearer than plain ones by the curve the decoder learned: each counts as one plain step's time, so
    a count whose steps happen to draft more is not taken for a slower one."""
    from test_gguf_mode import needs_kernel
    from test_step_cost import CONVEX, _Oracle

    from rest_lsp.engine.decoding import DecodeConfig
    from rest_lsp.engine.step_cost import StepCosts

    needs_kernel()
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(step_threads, "STARVED", 100.0)  # no probe: every step on 2 threads
    monkeypatch.setattr(step_threads, "PROBE_EVERY", 10**9)
    prompt, truth, decoder = _truth_and_two_thread_decoder(tmp_path, 80)
    decoder.costs = decoder._costs_by_threads[2] = StepCosts([0.0] + [CONVEX(k) for k in range(1, 65)],
                                                              "measured", learn=False)
    now = [0.0]
    real = decoder.verify

    def verify(tree, chain=()):
        now[0] += 0.01 * CONVEX(len(tree) + len(chain))
        return real(tree, chain)

    decoder.verify, decoder.clock = verify, lambda: now[0]
    result = decoder.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=80, budget=8))
    assert result.tokens == truth and result.tokens_per_step > 3  # tree steps of 9 rows, 1.7x a plain one
    assert list(decoder.threads.times[2]) == pytest.approx([0.01] * len(decoder.threads.times[2]))
    assert len(decoder.threads.times[2]) == step_threads.WINDOW
