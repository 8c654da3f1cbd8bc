"""What the benchmarks share: picking real code, percentiles, and writing a result JSON that says where and when it
was measured (machine, commit, date). No benchmark logic here.
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import platform
import random
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"  # git-ignored
STDLIB = Path(sysconfig.get_paths()["stdlib"])


# -- real code ---------------------------------------------------------------------------------------------------

def stdlib_corpora(*names: str) -> list[Path]:
    """Folders of the running Python's standard library (real code every machine has), e.g. "json", "email"."""
    return [STDLIB / name for name in names]


def python_files(root: Path) -> list[Path]:
    """The .py files under `root`, sorted, caches left out."""
    return sorted(p for p in Path(root).rglob("*.py") if p.is_file() and "__pycache__" not in p.parts)


def corpus_files(root: Path) -> dict[str, str]:
    """Relative path -> text of the Python files under `root` that parse and use "\\n" line breaks only."""
    files = {}
    for path in python_files(root):
        try:
            text = path.read_bytes().decode("utf-8")  # line breaks as they are (read_text would turn \r\n into \n)
            ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        if "\r" not in text:
            files[path.relative_to(root).as_posix()] = text
    return files


def function_starts(text: str) -> list[int]:
    """Offsets just after each `def ...:` header line (where its body starts), at least 400 characters into the
    file and 200 before its end (some file above the cursor, some below)."""
    return [m.end() for m in re.finditer(r"^[ \t]*(?:async )?def \w+\(.*?\).*?:[ \t]*\n", text, flags=re.M | re.S)
            if 400 < m.end() < len(text) - 200]


def completion_points(files: list[Path], count: int, seed: int) -> list[tuple[Path, int]]:
    """`count` function starts of `files` (a seeded choice), at most two per file so that none dominates."""
    points = [(path, offset) for path in files
              for offset in function_starts(path.read_text(encoding="utf-8", errors="replace"))]
    random.Random(seed).shuffle(points)
    chosen, per_file = [], {}
    for path, offset in points:
        if per_file.get(path, 0) < 2:
            chosen.append((path, offset))
            per_file[path] = per_file.get(path, 0) + 1
        if len(chosen) == count:
            break
    return chosen


def text_after_function(text: str, body_start: int) -> str:
    """The file after the function whose body starts at `body_start`: what an editor holds below the cursor while
    the body is being written (the body itself does not exist yet)."""
    header = text.rfind("\n", 0, text.rfind("\n", 0, body_start)) + 1
    line = text[header:body_start]
    indent = len(line) - len(line.lstrip())
    for m in re.finditer(r"^([ \t]*)\S", text[body_start:], flags=re.M):
        if len(m.group(1)) <= indent:
            return text[body_start + m.start():]
    return ""


# -- statistics --------------------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), interpolating linearly between the closest ranks (numpy's default); None for
    no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- where and when ----------------------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The machine a result was measured on; the load average says whether its cores were shared."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    info = {"cpu": _cpu_model(), "cores": cores, "system": platform.platform(),
            "python": platform.python_version()}
    try:
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    torch = sys.modules.get("torch")  # only when the benchmark already imported it
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


def commit() -> dict:
    """The checkout's commit, and whether its tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD") or None,
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def run_info(command: list[str] | None = None) -> dict:
    """Date (UTC), commit, machine and the command line of this run."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **commit(),
            "machine": machine(), "command": " ".join(command if command is not None else sys.argv)}


def write_json(path: Path, results: dict, command: list[str] | None = None) -> Path:
    """`results` with a "run" entry (date, commit, machine, command) written to `path` (its folder made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": run_info(command), **results}, indent=2, default=str))
    return path
