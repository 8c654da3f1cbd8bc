"""pytest plugin for .ci/sanitize.sh: how many kernel calls and stress steps ran under the sanitizers."""


def pytest_terminal_summary(terminalreporter):
    from rest_lsp.kernels.buffers import CALLS
    from rest_lsp.kernels.loader import sanitizing

    steps = sum(value for report in terminalreporter.stats.get("passed", [])
                for name, value in getattr(report, "user_properties", ()) if name == "stress_steps")
    each = ", ".join(f"{name} {count}" for name, count in sorted(CALLS.items()))
    terminalreporter.write_line(f"sanitize: {sum(CALLS.values())} kernel calls ({each}) and {steps} stress steps "
                                f"ran {'under the sanitizers' if sanitizing() else 'WITHOUT the sanitizers'}")
