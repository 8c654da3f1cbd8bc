"""A handle on the decoder for the cancellation tests: know that decoding has started, hold it there, and read
what each `Decoder.generate` call did (steps, tokens, why it finished).

The first decoding step of the process signals `started`, then waits for `release` before it runs; every
`generate` call then records its result. A cancellation test sets `release` only after the cancel went out, so
"decoding stopped because of the cancel" reads as: the first call finished "stopped" after one step.

- In the test process: `StepGate.in_process(monkeypatch)`, with threading events.
- In a server subprocess: run this file as the server (`python tests/step_gate.py --stdio`) with
  REST_LSP_TEST_GATE=<folder>; `started` and `release` are files there, results go to `results.jsonl`, and what
  the service decided for each cursor hint to `moved.jsonl` (read them with `FileGate`).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path

# A held step never waits longer than this for its release: a test that fails before releasing cannot leave
# a server hanging forever.
HOLD_LIMIT_S = 300.0
ENV = "REST_LSP_TEST_GATE"


class StepGate:
    def __init__(self, started, release, record):
        self.started, self.release, self._record = started, release, record
        self._lock = threading.Lock()
        self._held = False

    @classmethod
    def in_process(cls, monkeypatch) -> "StepGate":
        results: list = []  # the DecodeResult of each generate call, in order
        gate = cls(threading.Event(), threading.Event(), results.append)
        gate.results = results
        gate.install(monkeypatch.setattr)
        return gate

    def install(self, setattr_=setattr) -> None:
        from rest_lsp.engine.decoding import Decoder

        verify, generate = Decoder.verify, Decoder.generate
        gate = self

        def gated_verify(decoder, tree, *chain):
            with gate._lock:
                first, gate._held = not gate._held, True
            if first:
                gate.started.set()
                gate.release.wait(HOLD_LIMIT_S)
            return verify(decoder, tree, *chain)

        def recorded_generate(decoder, *args, **kwargs):
            result = generate(decoder, *args, **kwargs)
            gate._record(result)
            return result

        setattr_(Decoder, "verify", gated_verify)
        setattr_(Decoder, "generate", recorded_generate)


class FileEvent:
    """threading.Event's set/is_set/wait over a file, across processes."""

    def __init__(self, path: Path):
        self.path = path

    def set(self) -> None:
        self.path.touch()

    def is_set(self) -> bool:
        return self.path.exists()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.is_set():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


class FileGate:
    """The test's side of a gate in a server subprocess."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.started = FileEvent(folder / "started")
        self.release = FileEvent(folder / "release")
        self.results_file = folder / "results.jsonl"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, ENV: str(self.folder)}

    @staticmethod
    def command(*args: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), *args]

    def results(self) -> list[dict]:
        if not self.results_file.exists():
            return []
        return [json.loads(line) for line in self.results_file.read_text().splitlines()]

    def moves(self) -> list[dict]:
        """What the server's service decided for each cursor hint, in order: {"doc", "offset", "new"}, where
        "new" is CompletionService.moved's answer (False: the place last expected, nothing to start)."""
        path = self.folder / "moved.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]


def _serve() -> None:
    gate = FileGate(Path(os.environ[ENV]))
    write_lock = threading.Lock()

    def record(result) -> None:
        line = json.dumps({"steps": result.steps, "tokens": len(result.tokens), "finish": result.finish})
        with write_lock, gate.results_file.open("a") as f:
            f.write(line + "\n")

    StepGate(gate.started, gate.release, record).install()

    from rest_lsp.service.completion import CompletionService

    moved = CompletionService.moved

    def recorded_moved(service, doc_id: str, text: str, offset: int) -> bool:
        new = moved(service, doc_id, text, offset)
        with write_lock, (gate.folder / "moved.jsonl").open("a") as f:
            f.write(json.dumps({"doc": doc_id, "offset": offset, "new": new}) + "\n")
        return new

    CompletionService.moved = recorded_moved
    sys.argv = ["rest_lsp.cli", *sys.argv[1:]]
    runpy.run_module("rest_lsp.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _serve()


class WorkerIdle:
    """Knows when a CompletionService's decoding thread has nothing left to do, so that a test proves "this started
    no work" by an event instead of a sleep. The thread waits on its queue's condition only when no job is queued,
    no place is expected and no speculative work is wanted (scheduling.RequestQueue._work); those waits are
    counted here."""

    def __init__(self, svc):
        self._queue = svc._requests
        self._seen = threading.Condition()
        self.waits = 0
        cond, worker = self._queue._cond, self._queue.thread
        real = cond.wait

        def counted(timeout=None):
            if threading.current_thread() is worker:
                with self._seen:
                    self.waits += 1
                    self._seen.notify_all()
            return real(timeout)

        cond.wait = counted

    def after(self, action=lambda: None, timeout: float = 120.0):
        """Runs `action` under the queue's lock and returns its value once the decoding thread, having looked at
        the state `action` left, waits idle again (whatever work that state called for is done by then)."""
        cond = self._queue._cond
        with cond:
            value = action()
            with self._seen:
                seen = self.waits
            cond.notify_all()  # the thread looks again even where `action` left it nothing to do
        with self._seen:
            assert self._seen.wait_for(lambda: self.waits > seen, timeout), "the decoding thread never went idle"
        return value
