"""Drafting: what the model will likely write next, proposed from token ids, merged into one tree.

Knows: token ids, the datastore's query API, the acceptance statistics it learns. Proposers never see a model.
Never imports: `rest_lsp.engine`, `rest_lsp.service`, `rest_lsp.commands`, `rest_lsp.lsp`, `rest_lsp.cli`.
"""
