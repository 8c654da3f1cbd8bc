"""pytest plugin for .ci/sanitize.sh: how many kernel calls and stress steps ran under the sanitizers (summed over
pytest-xdist's workers where it runs on them: each worker counts its own calls, the controller none)."""

from collections import Counter

import pytest

_WORKERS: Counter = Counter()  # in xdist's controller: the calls its workers counted


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # an xdist worker: its counts go back to the controller
        from rest_lsp.kernels.buffers import CALLS

        output["kernel_calls"] = dict(CALLS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _WORKERS.update(getattr(node, "workeroutput", {}).get("kernel_calls", {}))


def pytest_terminal_summary(terminalreporter):
    from rest_lsp.kernels.buffers import CALLS
    from rest_lsp.kernels.loader import sanitizing

    calls = Counter(CALLS) + _WORKERS
    steps = sum(value for report in terminalreporter.stats.get("passed", [])
                for name, value in getattr(report, "user_properties", ()) if name == "stress_steps")
    each = ", ".join(f"{name} {count}" for name, count in sorted(calls.items()))
    terminalreporter.write_line(f"sanitize: {sum(calls.values())} kernel calls ({each}) and {steps} stress steps "
                                f"ran {'under the sanitizers' if sanitizing() else 'WITHOUT the sanitizers'}")
