"""The command-line commands besides the server: `generate`, `index`, `complete`.

Each module has `add_arguments(parser)` and `run(args) -> int`.
Knows: arguments and printing; wires the layers below as the server does.
Never imports: `rest_lsp.server`, `rest_lsp.cli`.
"""
