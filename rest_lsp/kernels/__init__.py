"""Our native kernels: C sources (*.c), built per instruction-set level and dispatched by the CPU, and the C++ shim
that registers the step's calls of them as native torch ops (step_ops.cpp).

levels.py: the levels, what the CPU must report for each, which one runs (REST_LSP_KERNEL_LEVEL forces one).
loader.py: the one path a kernel is built, cached, checksummed, loaded, bound, checked and registered as a torch op.
buffers.py: what a native call may touch (each buffer's length beside its pointer) and its error codes' sentences.
panel_matmul.py, quant_matmul.py, row_attention.py: each kernel's Python side (packing, binding, reference, op).
step_ops.py: the ops a lean step calls quant_mm and row_attn through, native where step_ops.cpp builds.

Knows: torch tensors, the CPU's instruction sets, the C compiler, the cache folder.
Never imports: `rest_lsp.engine` and every layer above it (no model, no tokenizer, no editor).
"""
