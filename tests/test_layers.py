"""The package's layers, as data: each module may import only its own layer and the layers below it.

The order is the README's data flow: shared helpers, the datastore, drafting, the native kernels, the engine, the settings, the
service, then what wires them for a person (the commands and the language server), then the entry point.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rest_lsp"

# (layer name, its modules or subpackages), lowest first. A module of one layer may import its own layer's
# modules and those of the layers listed before it, never one listed after it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("shared", ("rest_lsp", "rest_lsp.errors", "rest_lsp.priority", "rest_lsp.auth", "rest_lsp.cache_dir")),
    ("datastore", ("rest_lsp.datastore",)),
    ("drafting", ("rest_lsp.drafting",)),
    ("kernels", ("rest_lsp.kernels",)),
    ("engine", ("rest_lsp.engine",)),
    ("settings", ("rest_lsp.settings",)),
    ("service", ("rest_lsp.service",)),
    ("team", ("rest_lsp.team",)),
    ("lsp", ("rest_lsp.lsp",)),
    ("commands", ("rest_lsp.commands",)),
    ("cli", ("rest_lsp.cli",)),
]
# Layers at one height: neither imports the other (the server holds a service by its interface; the `lsp` command
# picks the team's one).
BESIDE: set[frozenset[str]] = {frozenset({"team", "lsp"})}
# Third-party packages a layer must never import (the service knows no LSP types; the datastore no model).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "datastore": ("torch", "transformers", "lsprotocol", "pygls"),
    "drafting": ("transformers", "lsprotocol", "pygls"),
    "kernels": ("transformers", "lsprotocol", "pygls"),
    "engine": ("lsprotocol", "pygls"),
    "service": ("lsprotocol", "pygls"),
    "team": ("lsprotocol", "pygls"),
}


def layer_of(module: str) -> int:
    """Index in LAYERS of the most specific entry that holds `module`."""
    best, best_len = None, -1
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if (module == m or module.startswith(m + ".")) and len(m) > best_len:
                best, best_len = i, len(m)
    if best is None:
        raise KeyError(module)
    return best


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, package: Path = PACKAGE) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, function-local ones included."""
    name = module_name(path, package)
    home = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = home.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, node.lineno))
            if target.split(".")[0] == "rest_lsp":
                # `from rest_lsp import server`, `from ..engine import decoding`: the names may be modules
                found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names
                          if (package.parent / (f"{target}.{alias.name}".replace(".", "/") + ".py")).exists()
                          or (package.parent / f"{target}.{alias.name}".replace(".", "/")).is_dir()]
    return found


def violations(package: Path = PACKAGE) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        src = module_name(path, package)
        src_layer = layer_of(src)
        for target, line in imports_of(path, package):
            where = f"{path.relative_to(package.parent)}:{line}"
            if target.split(".")[0] == "rest_lsp":
                src_name, target_name = LAYERS[src_layer][0], LAYERS[layer_of(target)][0]
                if layer_of(target) > src_layer:
                    out.append(f"{where}: {src} ({src_name}) imports {target} ({target_name}), a layer above it")
                elif frozenset({src_name, target_name}) in BESIDE:
                    out.append(f"{where}: {src} ({src_name}) imports {target} ({target_name}), a layer beside it")
            elif target.split(".")[0] in FORBIDDEN.get(LAYERS[src_layer][0], ()):
                out.append(f"{where}: {src} ({LAYERS[src_layer][0]}) imports {target}")
    return out


def test_every_module_has_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))  # raises KeyError for a module no layer holds


def test_no_module_imports_a_layer_above_its_own():
    assert violations() == []


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: a datastore module that imports the engine is reported, with its line."""
    fake = tmp_path / "rest_lsp"
    (fake / "datastore").mkdir(parents=True)
    (fake / "engine").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "engine" / "decoding.py").write_text("")
    (fake / "datastore" / "__init__.py").write_text("")
    (fake / "datastore" / "store.py").write_text("import os\n\ndef f():\n    from ..engine import decoding\n")
    assert violations(fake) == ["rest_lsp/datastore/store.py:4: rest_lsp.datastore.store (datastore) imports "
                                "rest_lsp.engine (engine), a layer above it",
                                "rest_lsp/datastore/store.py:4: rest_lsp.datastore.store (datastore) imports "
                                "rest_lsp.engine.decoding (engine), a layer above it"]


def test_an_import_between_layers_side_by_side_is_caught(tmp_path):
    """The language server may not import a team's module: the `lsp` command hands it the service."""
    fake = tmp_path / "rest_lsp"
    for folder in ("lsp", "team"):
        (fake / folder).mkdir(parents=True)
        (fake / folder / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "team" / "remote.py").write_text("")
    (fake / "lsp" / "server.py").write_text("from rest_lsp.team.remote import RemoteService\n")
    assert violations(fake) == ["rest_lsp/lsp/server.py:1: rest_lsp.lsp.server (lsp) imports rest_lsp.team.remote "
                                "(team), a layer beside it"]


@pytest.mark.parametrize("layer", [name for name, _ in LAYERS if (PACKAGE / name / "__init__.py").exists()])
def test_each_subpackage_says_what_it_knows(layer):
    init = PACKAGE / layer / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    assert "Knows:" in doc and "Never imports:" in doc


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """Cycles in the graph of module imports (function-local ones included), each as its modules in order."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    graph = {name: sorted({t for t, _ in imports_of(path, package) if t in modules and t != name})
             for name, path in modules.items()}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycle():
    assert import_cycles() == []


def test_an_import_cycle_is_caught(tmp_path):
    fake = tmp_path / "rest_lsp"
    (fake / "engine").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "engine" / "decoding.py").write_text("from rest_lsp.engine.calibration import calibrate\n")
    (fake / "engine" / "calibration.py").write_text("def f():\n    from rest_lsp.engine.decoding import g\n")
    assert import_cycles(fake) == [["rest_lsp.engine.calibration", "rest_lsp.engine.decoding",
                                    "rest_lsp.engine.calibration"]]
