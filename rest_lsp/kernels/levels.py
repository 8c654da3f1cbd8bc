"""Instruction-set levels: what each kernel build targets, what the CPU must report to run it, which one runs.

Every kernel is built once per level, never for `-march=native`: a level's flags name exactly the instructions the
compiler may use, so a library runs on every CPU that reports the level's features, and the dispatcher
(`chosen`) picks the highest level this CPU reports, as ggml's CPU variants are picked. `REST_LSP_KERNEL_LEVEL`
forces a lower one (to test or benchmark every level on one machine); a forced level the CPU does not execute is
refused with one warning and the best one runs instead: no code path ever executes an instruction the CPU lacks.

| level | compiler flags | CPU features required (Linux /proc/cpuinfo names) |
|---|---|---|
| portable | the ISA's baseline | none |
| avx2 | -march=haswell | avx2, fma, f16c, bmi1, bmi2, movbe, popcnt |
| avx-vnni | -march=haswell -mavxvnni | avx2's, avx_vnni |
| avx512-vnni | -march=skylake-avx512 -mavx512vnni | avx2's, avx512f/bw/vl/dq/cd, avx512_vnni |
| amx | avx512-vnni's, -mamx-tile -mamx-int8 | avx512-vnni's, amx_tile, amx_int8 |
"""

from __future__ import annotations

import functools
import logging
import os
import platform

log = logging.getLogger(__name__)

ENV = "REST_LSP_KERNEL_LEVEL"
LEVELS = ("portable", "avx2", "avx-vnni", "avx512-vnni", "amx")  # lowest first

_AVX2 = frozenset({"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "popcnt"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni"}
NEEDS: dict[str, frozenset[str]] = {
    "portable": frozenset(),
    "avx2": _AVX2,
    "avx-vnni": _AVX2 | {"avx_vnni"},
    "avx512-vnni": _AVX512,
    "amx": _AVX512 | {"amx_tile", "amx_int8"},
}
_X86_FLAGS: dict[str, tuple[str, ...]] = {
    "portable": ("-march=x86-64",),
    "avx2": ("-march=haswell",),
    "avx-vnni": ("-march=haswell", "-mavxvnni"),
    "avx512-vnni": ("-march=skylake-avx512", "-mavx512vnni"),
    "amx": ("-march=skylake-avx512", "-mavx512vnni", "-mamx-tile", "-mamx-int8"),
}


class LevelUnavailable(ValueError):
    """A level this CPU does not execute (or an unknown name) was asked for."""


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def cpu_flags() -> frozenset[str]:
    """The features this CPU reports (the `flags` line of /proc/cpuinfo); empty where there is none to read. Read
    once a process: every kernel call asks which level runs (`chosen`), and the CPU does not change."""
    return _cpuinfo_flags()


@functools.cache
def _cpuinfo_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        line = ""
    return frozenset(line.partition(":")[2].split())


def runnable(flags: frozenset[str] | None = None, x86: bool | None = None) -> tuple[str, ...]:
    """The levels a CPU reporting `flags` executes, lowest first (this CPU's by default). Off x86 only the
    portable build, which targets the compiler's default for the machine."""
    if not (is_x86() if x86 is None else x86):
        return ("portable",)
    flags = cpu_flags() if flags is None else flags
    return tuple(level for level in LEVELS if NEEDS[level] <= flags)


def compiler_flags(level: str) -> tuple[str, ...]:
    """The flags that make a build of `level` (LevelUnavailable for a name that is not a level)."""
    if level not in LEVELS:
        raise LevelUnavailable(f"{level!r} is not a kernel level: use one of {', '.join(LEVELS)}")
    if not is_x86():
        if level != "portable":
            raise LevelUnavailable(f"the {level} level is for x86 CPUs only")
        return ()
    return _X86_FLAGS[level]


def chosen(flags: frozenset[str] | None = None, env: dict[str, str] | None = None, x86: bool | None = None) -> str:
    """The level the kernels run at: `REST_LSP_KERNEL_LEVEL` where it names a level this CPU executes, else the
    highest level it executes."""
    can = runnable(flags, x86)
    forced = (os.environ if env is None else env).get(ENV, "").strip().lower()
    if forced:
        if forced in can:
            return forced
        why = "is not a kernel level" if forced not in LEVELS else "is not executed by this CPU"
        log.warning("%s=%s %s: the kernels run at the %s level.", ENV, forced, why, can[-1])
    return can[-1]


def check_runnable(level: str, flags: frozenset[str] | None = None) -> None:
    """LevelUnavailable unless this CPU executes `level`: nothing built for it may run here."""
    compiler_flags(level)
    if level not in runnable(flags):
        raise LevelUnavailable(f"this CPU does not execute the {level} level (it lacks "
                               f"{', '.join(sorted(NEEDS[level] - (cpu_flags() if flags is None else flags)))})")
