"""The engine: load a model, run its forward pass cheaply, and decode with draft trees (REST) exactly.

Knows: the model, its tokenizer, a KV cache, the machine's kernels and step cost, the drafting layer's trees.
Never imports: `rest_lsp.service`, `rest_lsp.commands`, `rest_lsp.lsp`, `rest_lsp.cli` (no editor concepts).
"""
