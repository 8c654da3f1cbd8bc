"""The server's settings: one typed dataclass, filled from CLI flags, then from the
editor (`initializationOptions`, `workspace/didChangeConfiguration`).

Editors send JSON with camelCase keys (`maxNewTokens`); Python callers may use
snake_case. A null value means the default: the CLI flag when one was given, else
the built-in value (an editor clearing `model` gets the `--model` of the command
line, not the bundled model). A bad value is reported in one sentence and the previous value is kept,
so a typo in an editor config never takes completions away.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

# Keys an editor may wrap our settings in (VS Code sends {"rest-lsp": {...}} for a section).
SECTION_NAMES = ("rest-lsp", "restLsp", "rest_lsp")


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # HF hub id, local folder or .gguf file; None = the bundled default
    device: str | None = None  # "cpu", "cuda", "cuda:1", "mps"; None = best available
    dtype: str | None = None  # "float32", "bfloat16", "float16", "float16-weights", "q8_0", "gguf"; None: runmode's
    max_new_tokens: int = 64
    # lines a suggestion holds at most where several may come (an empty line, a block opener); the next ones come as
    # the person accepts (the server computes them while the suggestion is shown). Set by text alone, a
    # suggestion's length is the same however fast the server decodes. 0 = as many as the time budgets allow.
    max_lines: int = 1
    draft_budget: int = 16  # draft-tree nodes verified per step; 0 = plain decoding (no REST)
    draft_exclude: tuple[str, ...] = ()  # draft sources left out (drafts.SOURCE_NAMES), for comparisons
    context_tokens: int = 1024  # prompt budget, prefix + suffix
    suffix_fraction: float = 0.25  # share of context_tokens kept for the suffix (FIM models only)
    # other files' chunks before the file's window (service/extra_context.py), on top of context_tokens; 0 = none
    extra_context_tokens: int = 0
    debounce_ms: int = 20  # wait this long before decoding; a newer request in the meantime wins
    document_cache_mb: int = 256  # KV caches kept for recently used documents besides the current one; 0 = none
    debounce_max_ms: int = 250  # the debounce follows the typing speed up to this (<= debounce_ms: fixed)
    time_budget_ms: int = 1000  # after this long a completion keeps its whole lines (or ends its first); 0 = none
    # ... and this long after a person began waiting for it (a request that must decode, or joins work begun
    # ahead); 0 = only time_budget_ms
    wait_budget_ms: int = 250
    suggestion_cache_size: int = 250  # suggestions kept by the text around their cursor; 0 = no cache
    prefetch: bool = True  # while idle, compute the suggestion that follows accepting the shown one
    ignore: tuple[str, ...] = ()  # extra gitignore-style patterns the indexer skips
    index_workspace: bool = True
    max_file_bytes: int = 1_000_000
    cache_dir: str | None = None  # where the index persists; None = the platform cache dir

    def update(self, values: Mapping[str, Any] | None,
               defaults: "Settings | None" = None) -> tuple["Settings", list[str]]:
        """A copy with the valid entries of `values` applied, and one sentence per bad entry.

        A null entry takes its value from `defaults` (the built-in values when None).
        """
        if not values:
            return self, []
        if not isinstance(values, Mapping):
            return self, [f"Settings must be an object, got {type(values).__name__}."]
        for section in SECTION_NAMES:
            if isinstance(values.get(section), Mapping):
                values = values[section]
                break
        changes: dict[str, Any] = {}
        errors: list[str] = []
        known = {f.name: f for f in dataclasses.fields(self)}
        for key, value in values.items():
            name = _snake(key)
            if name not in known:
                errors.append(f"Unknown setting {key!r}.")
                continue
            if value is None:
                changes[name] = getattr(defaults if defaults is not None else Settings(), name)
                continue
            try:
                changes[name] = _check(name, value)
            except ValueError as err:
                errors.append(f"Setting {key!r}: {err}")
        return dataclasses.replace(self, **changes), errors

    @property
    def model_key(self) -> tuple[str | None, str | None, str | None]:
        """The settings that need a model reload when they change."""
        return (self.model, self.device, self.dtype)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Settings":
        values = {
            name: getattr(args, name)
            for name in (f.name for f in dataclasses.fields(cls))
            if getattr(args, name, None) is not None
        }
        settings, errors = cls().update(values)
        if errors:
            raise SystemExit("rest-lsp: " + " ".join(errors))
        return settings


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", str(key)).lower().replace("-", "_")


_RANGES = {
    "max_new_tokens": (1, 4096),
    "max_lines": (0, 10_000),
    "draft_budget": (0, 1024),
    "context_tokens": (16, 1 << 20),
    "extra_context_tokens": (0, 1 << 20),
    "debounce_ms": (0, 10_000),
    "document_cache_mb": (0, 1 << 20),
    "debounce_max_ms": (0, 10_000),
    "time_budget_ms": (0, 600_000),
    "wait_budget_ms": (0, 600_000),
    "suggestion_cache_size": (0, 100_000),
    "max_file_bytes": (1, 1 << 34),
}
_DTYPES = ("float32", "float16", "bfloat16", "float16-weights", "q8_0", "gguf", "auto")


def _check(name: str, value: Any) -> Any:
    """`value` converted to the field's type, or ValueError saying what is wrong."""
    if name in _RANGES:
        low, high = _RANGES[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer from {low} to {high}, got {value!r}.")
        if not low <= value <= high:
            raise ValueError(f"expected an integer from {low} to {high}, got {value}.")
        return value
    if name == "suffix_fraction":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"expected a number from 0 up to (not including) 1, got {value!r}.")
        return float(value)
    if name in ("index_workspace", "prefetch"):
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}.")
        return value
    if name == "ignore":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"expected a list of gitignore patterns, got {value!r}.")
        from rest_lsp.datastore.ignore import bad_patterns

        if bad := bad_patterns(value):
            raise ValueError(f"invalid gitignore pattern(s): {', '.join(map(repr, bad))}.")
        return tuple(value)
    if name == "draft_exclude":
        from rest_lsp.drafting.drafts import SOURCE_NAMES

        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(v in SOURCE_NAMES for v in value):
            raise ValueError(f"expected a list of draft sources out of {', '.join(SOURCE_NAMES)}, got {value!r}.")
        return tuple(value)
    if name == "dtype":
        if value is not None and value not in _DTYPES:
            raise ValueError(f"expected one of {', '.join(_DTYPES)}, got {value!r}.")
        return value
    # model, device, cache_dir: free-form strings (null, handled by `update`, is the default)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string or null, got {value!r}.")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings as CLI flags; they are the defaults the editor's settings override."""
    g = parser.add_argument_group("model and decoding")
    g.add_argument("--model", help="HF hub id, local model folder or .gguf file (default: bundled SmolLM2-135M)")
    g.add_argument("--device", help="torch device, e.g. cpu or cuda (default: best available)")
    g.add_argument("--dtype", choices=_DTYPES, help="weights dtype (default: the loader's choice)")
    g.add_argument("--max-new-tokens", type=int, help="most tokens per completion (default: 64)")
    g.add_argument("--max-lines", type=int, help="most lines per suggestion at a line start or block opener; "
                   "0 = as many as the time budgets allow (default: 1)")
    g.add_argument("--draft-budget", type=int, help="draft-tree nodes per step; 0 disables REST (default: 16)")
    from rest_lsp.drafting.drafts import SOURCE_NAMES  # numpy only, as the settings' own check imports it

    g.add_argument("--draft-exclude", help=f"comma-separated draft sources to leave out: {', '.join(SOURCE_NAMES)} "
                   "(default: none)")
    g.add_argument("--context-tokens", type=int, help="prompt budget in tokens (default: 1024)")
    g.add_argument("--suffix-fraction", type=float, help="share of the budget for the suffix, FIM only (default: 0.25)")
    g.add_argument("--extra-context-tokens", type=int, help="tokens of other files' chunks (recently used files, the "
                   "file's folder) before the file's window; 0 = none (default: 0)")
    g.add_argument("--debounce-ms", type=int, help="wait before decoding (default: 20)")
    g.add_argument("--document-cache-mb", type=int, help="memory for the KV caches of recently used documents, so "
                   "switching back to one prefills only what changed; 0 keeps none (default: 256)")
    g.add_argument("--debounce-max-ms", type=int, help="the wait follows the typing speed up to this (default: 250)")
    g.add_argument("--time-budget-ms", type=int,
                   help="after this long a completion keeps the whole lines it has (or ends its first line); "
                        "0 = none (default: 1000)")
    g.add_argument("--wait-budget-ms", type=int,
                   help="a completion someone waits for stops so this long after they asked; "
                        "0 = only --time-budget-ms (default: 250)")
    g.add_argument("--suggestion-cache-size", type=int,
                   help="suggestions kept for reuse by the text around the cursor; 0 = none (default: 250)")
    g.add_argument("--no-prefetch", dest="prefetch", action="store_false", default=None,
                   help="do not compute, while idle, the suggestion that follows accepting the shown one")
    w = parser.add_argument_group("workspace")
    w.add_argument("--ignore", action="append", help="extra gitignore pattern to skip (repeatable)")
    w.add_argument("--no-index", dest="index_workspace", action="store_false", default=None,
                   help="do not index the workspace folders")
    w.add_argument("--max-file-bytes", type=int, help="skip larger files (default: 1000000)")
    w.add_argument("--cache-dir", help="where the workspace index persists")
