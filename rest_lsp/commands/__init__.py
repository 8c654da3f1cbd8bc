"""The command-line commands: `lsp` (the language server process, the default), `generate`, `index`, `complete`,
`serve`.

Each module has `add_arguments(parser)` and `run(args) -> int`.
Knows: arguments, printing, the process's exit; wires the layers below (the language server among them).
Never imports: `rest_lsp.cli`.
"""
