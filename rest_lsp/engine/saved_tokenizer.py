"""The model's tokenizer as transformers builds it, kept as one file that the `tokenizers` library reads back.

Commands that need only tokens (`rest-lsp index`, its --query) would spend seconds importing torch and
transformers for a tokenizer. So whenever transformers loads a tokenizer here, the Rust tokenizer it built (not
the model's tokenizer.json, which transformers may rebuild on load) is saved under the cache folder, keyed by the
files it came from and the library versions. Read back, it gives the very ids and key of the transformers one, so
an index the command writes is the one the server loads. Torch-free and transformers-free by design.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from importlib import metadata
from pathlib import Path
from typing import Sequence

from rest_lsp import cache_dir
from rest_lsp.engine.model_source import cache_root, resolve

log = logging.getLogger(__name__)

FORMAT = 1
# Files that hold weights: their changes do not change the tokenizer, and stat-ing them is all we would do.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")


def tokenizer_key(blob: str) -> str:
    """The key that names a tokenizer's persisted indexes: a hash of its serialized Rust tokenizer."""
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class SavedTokenizer:
    """model.Tokenizer's interface (key, encode, encode_batch, decode) on the `tokenizers` library alone.

    It does what transformers' TokenizersBackend does for a call with add_special_tokens=False: no truncation, no
    padding, special tokens split or not as the transformers tokenizer says, and no clean-up when decoding."""

    def __init__(self, blob: str, split_special_tokens: bool):
        from tokenizers import Tokenizer as RustTokenizer

        self.key = tokenizer_key(blob)
        self._tok = RustTokenizer.from_str(blob)
        self._tok.no_truncation()
        self._tok.no_padding()
        self._tok.encode_special_tokens = split_special_tokens

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def load(spec: str | None) -> SavedTokenizer | None:
    """The saved tokenizer of the model `spec` names, or None when transformers has not loaded it here since its
    files last changed. A bad `spec` raises ModelLoadError, with the sentence the full loader would give."""
    path = saved_path(*resolve(spec))
    if path is None:
        return None
    try:
        saved = json.loads(cache_dir.read_bytes(path))  # only a file of this user's alone
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            return None
        return SavedTokenizer(saved["tokenizer"], bool(saved["split_special_tokens"]))
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - a damaged file only costs the slow path, which writes it again
        log.info("Saved tokenizer %s is unusable (%s); loading the tokenizer with transformers.", path, err)
        return None


def keep(spec: str | None, hf) -> None:
    """Save the Rust tokenizer that transformers built for `spec` (`hf`: its tokenizer), unless the same is saved.

    Never fails a load: a tokenizer without a Rust backend, or a cache that cannot be written, only keeps the
    next `rest-lsp index` on the slow path."""
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return
    try:
        path = saved_path(*resolve(spec))
        if path is None or cache_dir.folder(path.parent.name) is None:  # no cache of this user's alone: said once
            return
        text = json.dumps({"format": FORMAT, "split_special_tokens": bool(getattr(hf, "split_special_tokens", False)),
                           "tokenizer": backend.to_str()}).encode("utf-8")
        try:
            if cache_dir.read_bytes(path) == text:
                cache_dir.touch(path)
                return
        except OSError:
            pass
        cache_dir.write_bytes(path, text)  # atomic: a reader sees the old file or the whole new one
        cache_dir.prune(path.parent, cache_dir.KEPT["tokenizers"], path)  # the least recently used beyond the cap
    except Exception as err:  # noqa: BLE001 - see the docstring
        log.warning("Could not save the tokenizer for quick loading (%s); `rest-lsp index` stays slow.", err)


def saved_path(folder: str, gguf_file: str | None) -> Path | None:
    """Where the tokenizer of this model source is saved; None when its files cannot be told apart without
    transformers (a hub id that is not in the local cache)."""
    source = _source_signature(folder, gguf_file)
    if source is None:
        return None
    stem, signature = source
    versions = ":".join(f"{lib}={_version(lib)}" for lib in ("transformers", "tokenizers"))
    tag = hashlib.sha256(f"{signature}:{versions}".encode()).hexdigest()[:16]
    return cache_root() / "tokenizers" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', stem)[:60]}-{tag}.json"


def _source_signature(folder: str, gguf_file: str | None) -> tuple[str, str] | None:
    """(a readable name, a string that changes whenever the files the tokenizer is built from change)."""
    if gguf_file:  # by what the file holds, not its path or times (cache_dir.content_digest)
        return Path(gguf_file).stem, f"gguf:{cache_dir.content_digest(Path(folder) / gguf_file)}"
    root = Path(folder)
    if root.is_dir():
        root = root.resolve()
        files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir()
                       if p.is_file() and not p.name.lower().endswith(WEIGHT_SUFFIXES))
        return root.name, f"folder:{root}:{files}"
    revision = _hub_revision(folder)
    return (folder, f"hub:{folder}:{revision}") if revision else None


def _hub_revision(repo_id: str) -> str | None:
    """The commit of `repo_id`'s main branch in the local Hugging Face cache (what transformers loads offline)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    ref = Path(HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text("utf-8").strip() or None
    except OSError:
        return None


def _version(lib: str) -> str:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return "none"
