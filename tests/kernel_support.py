"""What the kernel tests share: each level's library, or a skip that names why it is not run here."""

import pytest

from rest_lsp.kernels import levels

PATHS = {"portable": "portable C", "avx2": "AVX2", "avx-vnni": "AVX-VNNI", "avx512-vnni": "AVX-512 VNNI",
         "amx": "AVX-512 VNNI"}  # the dot products a level's quantized build runs (amx adds tiles for many rows)


def library_of(module, level):
    """`module`'s library of `level`, or a skip naming the level this CPU does not execute (no test ever runs an
    instruction the CPU lacks) or that this compiler does not build."""
    if level not in levels.runnable():
        pytest.skip(f"this CPU does not execute the {level} level")
    lib = module.library(level)
    if lib is None:
        pytest.skip(f"this compiler does not build the {level} level")
    return lib
