"""The language server: pygls handlers (server.py), the `--tcp` listener (tcp.py), who may connect (admission.py),
and LSP positions as character offsets (positions.py).

Knows: LSP and pygls, documents and cursors, the service interface (rest_lsp.service.interface), settings.
Never imports: `rest_lsp.commands`, `rest_lsp.cli`, `rest_lsp.team` (the `lsp` command picks the service).
"""
