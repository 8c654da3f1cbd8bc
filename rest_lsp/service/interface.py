"""The interface between the language server and a completion service, both ways.

`Service` is what the server asks of a service: the CompletionService (completion.py) decodes in this process, the
RemoteService (rest_lsp/team/remote.py) asks a team's server. The server holds one behind this interface and never
asks which it is: where they differ, a member says so. `ServiceEvents` is what a service tells its owner.
`tests/service/test_interface.py` checks that both services have every member with a signature that fits.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

from rest_lsp.service.scheduling import Completion
from rest_lsp.settings import Settings

__all__ = ["BadText", "Completion", "CompletionTicket", "Service", "ServiceEvents", "ServiceFactory"]


class BadText(ValueError):
    """A document text no prompt can be built from; str(err) is one sentence for the user."""


class ServiceEvents(Protocol):
    """What the service tells its owner; called from the service's threads."""

    def message(self, level: str, text: str) -> None: ...  # level: "error" | "warning" | "info"
    def index_begin(self, root: str) -> None: ...
    def index_progress(self, root: str, done: int, total: int) -> None: ...
    def index_end(self, root: str, stats: dict) -> None: ...


@runtime_checkable
class CompletionTicket(Protocol):
    """A submitted completion: `future` resolves to a Completion or None (nothing to show)."""

    future: Future

    def cancel(self) -> None:
        """Give up this request: its future gives None, and the work stops unless another request shares it."""


@runtime_checkable
class Service(Protocol):
    """What the language server calls. Documents are named by the editor's URI (`cancel`, `expect`, `moved`,
    `submit`, `close_document`) or by the datastore's id (`change_buffer`, `close_buffer`); offsets count
    characters of `text`. Every call returns soon: the work runs on the service's own threads."""

    settings: Settings  # what the service kept of the last update_settings (a value it cannot take is refused)

    def start(self, roots: list[Path] | None = None) -> None:
        """Begin: load the model (or reach the team's server) and index the workspace folders `roots`."""

    def update_settings(self, settings: Settings) -> None:
        """New settings from the editor; `self.settings` then holds what the service kept of them."""

    def change_roots(self, added: list[Path], removed: list[Path]) -> None:
        """Workspace folders added and removed: indexed, or dropped from the datastore. May join threads."""

    def change_buffer(self, doc_id: str, text: str) -> None:
        """An open document's whole text, into the datastore (it replaces the indexed file of the same id)."""

    def close_buffer(self, doc_id: str) -> None:
        """A document closed: its text leaves the datastore (the file on disk stays indexed)."""

    def close_document(self, doc_id: str) -> None:
        """A document closed: what the service kept for it (caches, suggestions) goes."""

    def cancel(self, doc_id: str) -> None:
        """The document changed: a completion under way for its older text is wasted, stop it."""

    def expect(self, doc_id: str, text: str, offset: int) -> None:
        """A hint: the user types at `offset`, so the next request will likely come there."""

    def moved(self, doc_id: str, text: str, offset: int) -> bool:
        """A hint: the cursor rests at `offset`; True when it is a place not hinted before."""

    def submit(self, doc_id: str, text: str, offset: int) -> CompletionTicket:
        """A completion at `offset`; raises BadText for a text no prompt can be built from."""

    def accept(self, completion_id: int | None, text: str) -> bool:
        """The user accepted `text` (of completion `completion_id`, when known); True when it was learned from."""

    def drafts(self, text: str, limit: int = 10) -> list[tuple[str, float]]:
        """What the workspace's datastore proposes after `text`, with weights (debugging)."""

    def stats(self) -> dict:
        """The counters of `rest-lsp.stats`; never waits on the caller's event loop."""

    def close(self, timeout: float = 10.0, wait_for_loads: bool = True) -> None:
        """Stop all work, joining threads for up to `timeout` each. `wait_for_loads=False` leaves a model load under
        way running (nothing can stop one): for a process about to end (a service that loads none ignores it)."""


# What builds a service for the server: (settings, the server's events) -> a Service.
ServiceFactory = Callable[[Settings, ServiceEvents], Service]
