"""The completion service: prompts, stop rules, scheduling, caches and feeding, without LSP types.

Knows: documents as text, cursors, settings, the engine's decoder, the drafting sources, the datastore.
Never imports: `rest_lsp.commands`, `rest_lsp.lsp`, `rest_lsp.cli`, `lsprotocol`, `pygls`.
"""
