"""rest-lsp: a code-completion language server with REST speculative decoding."""

__version__ = "0.1.0"
