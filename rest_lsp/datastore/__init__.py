"""An incremental token index of a workspace, queried for REST draft continuations.

Datastore: segments + tombstones + merges, thread-safe, a DraftSource.
WorkspaceIndex: walks, watches and persists a workspace into a Datastore.

Knows: files, ignore rules, token ids (through a `tokenize` callable), segments on disk.
Never imports: `rest_lsp.drafting`, `rest_lsp.engine`, `rest_lsp.service`, `rest_lsp.commands`, `rest_lsp.lsp`,
`rest_lsp.cli`, torch or transformers.
"""

from .indexer import WorkspaceIndex
from .persist import default_cache_dir
from .store import Continuation, Datastore, Lookup, Source

__all__ = ["Continuation", "Datastore", "Lookup", "Source", "WorkspaceIndex", "default_cache_dir"]
