"""Both services implement what the language server asks of one (rest_lsp/service/interface.py), with signatures
that fit, and the server never asks which service it holds."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from rest_lsp.service.completion import CompletionService, NoEvents
from rest_lsp.service.interface import CompletionTicket, Service
from rest_lsp.settings import Settings
from rest_lsp.team.remote import RemoteService

PACKAGE = Path(__file__).resolve().parents[2] / "rest_lsp"
IMPLEMENTATIONS = [CompletionService, RemoteService]
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def members(protocol: type) -> tuple[list[str], list[str]]:
    """(methods, data attributes) a protocol declares."""
    methods = [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]
    return methods, [n for n in protocol.__annotations__ if not n.startswith("_")]


def misfits(protocol: type, cls: type) -> list[str]:
    """Why `cls` does not implement `protocol`: a method missing, or one a caller of the protocol could not call
    as the protocol says (a parameter missing, moved or without the protocol's default, an extra one without a
    default, another annotation); a protocol's return type that is itself a protocol is checked the same way."""
    methods, _ = members(protocol)
    out = []
    for name in methods:
        impl = getattr(cls, name, None)
        if not callable(impl):
            out.append(f"{cls.__name__}.{name} is missing")
            continue
        out += [f"{cls.__name__}.{name}: {why}" for why in _signature_misfits(getattr(protocol, name), impl)]
    return out


def _signature_misfits(want_fn, got_fn) -> list[str]:
    want, got = inspect.signature(want_fn), inspect.signature(got_fn)
    got_list = list(got.parameters.values())
    want_hints, got_hints = typing.get_type_hints(want_fn), typing.get_type_hints(got_fn)
    out = []
    for i, p in enumerate(want.parameters.values()):
        q = got.parameters.get(p.name)
        if q is None:
            out.append(f"no parameter {p.name!r}")
            continue
        if p.kind in POSITIONAL and (q.kind not in POSITIONAL or got_list.index(q) != i):
            out.append(f"{p.name!r} is not positional parameter {i}")
        if p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
            out.append(f"{p.name!r} has no default")
        if p.name in want_hints and p.name in got_hints and want_hints[p.name] != got_hints[p.name]:
            out.append(f"{p.name!r} is {got_hints[p.name]}, not {want_hints[p.name]}")
    out += [f"extra parameter {q.name!r} has no default" for q in got_list
            if q.name not in want.parameters and q.default is inspect.Parameter.empty
            and q.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    want_return, got_return = want_hints.get("return"), got_hints.get("return")
    if getattr(want_return, "_is_protocol", False):
        found = misfits(want_return, got_return) if isinstance(got_return, type) else [f"returns {got_return}"]
        missing = [n for n in members(want_return)[1] if n not in typing.get_type_hints(got_return)]
        out += found + [f"its {got_return.__name__} declares no {n!r}" for n in missing]
    elif "return" in got_hints and want_return != got_return:
        out.append(f"returns {got_return}, not {want_return}")
    return out


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_service_has_every_member_with_a_fitting_signature(cls):
    assert misfits(Service, cls) == []


@pytest.fixture
def services(tmp_path):
    settings = Settings(index_workspace=False, cache_dir=str(tmp_path / "cache"))
    made = [CompletionService(settings, NoEvents()),
            RemoteService(settings, NoEvents(), "http://127.0.0.1:9", "t" * 32)]
    yield made
    for service in made:
        service.close()


def test_each_service_instance_is_a_service_and_its_tickets_are_tickets(services):
    """The data members too (`settings`), which only an instance has; a ticket of a service not yet connected."""
    for service in services:
        assert isinstance(service, Service)
    ticket = services[1].submit("file:///a.py", "x = ", 4)  # not connected: answered None at once
    assert isinstance(ticket, CompletionTicket) and ticket.future.result(5) is None


class NoFuture:
    def cancel(self) -> None: ...


class Half:
    def close(self, timeout: float = 10.0) -> None: ...

    def submit(self, doc_id: str, text: str, offset: int) -> NoFuture: ...

    def moved(self, doc_id: str, offset: int, text: str) -> bool: ...


def test_a_service_that_does_not_fit_is_caught():
    """The check itself: a close() without wait_for_loads (the remote one's before the interface), a submit whose
    ticket has no future, parameters swapped, a method missing."""
    found = misfits(Service, Half)
    assert "Half.close: no parameter 'wait_for_loads'" in found
    assert "Half.submit: its NoFuture declares no 'future'" in found
    assert "Half.moved: 'text' is not positional parameter 2" in found
    assert "Half.stats is missing" in found


def _asks_which_service(tree: ast.AST) -> list[int]:
    """Lines of `isinstance(<…service…>, …)`, `hasattr`/`getattr(<…service…>, …)`: asking which service it is."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "hasattr", "getattr") and node.args
            and "service" in ast.unparse(node.args[0])]


@pytest.mark.parametrize("path", sorted((PACKAGE / "lsp").glob("*.py")) + [PACKAGE / "commands" / "lsp.py"],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_server_never_asks_which_service_it_holds(path):
    assert _asks_which_service(ast.parse(path.read_text())) == []


def test_asking_which_service_is_caught():
    old = ("def _close(service):\n    if isinstance(service, CompletionService):\n        service.close(False)\n"
           "change = getattr(ls.service, 'change_roots', None)\n")
    assert sorted(_asks_which_service(ast.parse(old))) == [2, 4]
