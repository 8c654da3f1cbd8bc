"""Load a causal LM and its tokenizer: a hub id, a local folder or a .gguf file.

Nothing here ever touches the network: a hub id works only when it is already in the local Hugging Face cache.
A .gguf file is checked first (its header against its tensors and size: gguf_check), dequantized once (slow), and
the result kept under the user's cache folder, named by the file's content (cache_dir), so later loads read plain
safetensors. A weight the file does not hold is refused, never initialized at random.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from rest_lsp import cache_dir
from rest_lsp.engine import gguf_blocks, gguf_check, gguf_header, mode_choice, rotary, saved_tokenizer
from rest_lsp.errors import ModelLoadError
from rest_lsp.engine.model_source import DEFAULT_GGUF_NAME, DEFAULT_MODEL, cache_root
from rest_lsp.engine.model_source import gguf_cache_dir as _gguf_cache_dir
from rest_lsp.engine.model_source import hub_snapshot
from rest_lsp.engine.model_source import resolve as _resolve
from rest_lsp.engine.runmode import DTYPE_ENV, GGUF_WEIGHTS, decide, mode_name

__all__ = ["DEFAULT_GGUF_NAME", "DEFAULT_MODEL", "LoadedModel", "ModelLoadError", "Tokenizer", "cache_root",
           "load_model", "load_tokenizer"]

log = logging.getLogger(__name__)

SOURCE_FILE = "rest-lsp-source.txt"  # in a kept conversion: the path of the .gguf it was made from


@dataclass
class Tokenizer:
    """The model's fast tokenizer, as the rest of rest-lsp needs it: text <-> ids, no special tokens added."""

    hf: object
    key: str = field(init=False)
    eos_token_ids: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        backend = getattr(self.hf, "backend_tokenizer", None)
        blob = backend.to_str() if backend is not None else repr(sorted(self.hf.get_vocab().items()))
        self.key = saved_tokenizer.tokenizer_key(blob)
        if self.hf.eos_token_id is not None:
            self.eos_token_ids.add(int(self.hf.eos_token_id))

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.hf(texts, add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer | None
    device: torch.device
    dtype: torch.dtype
    name: str
    notes: list[str] = field(default_factory=list)  # sentences for the user: what was chosen instead of what was asked
    packing: str | None = None  # the lean engine's weight packing ("fp16": float16-weights); None: the engine's own

    @property
    def mode(self) -> str:
        """The numerics asked for at load time (a model the lean engine cannot run stays fp32: Decoder.mode)."""
        return mode_name(self.dtype, self.packing)

    @property
    def eos_token_ids(self) -> set[int]:
        ids = set(self.tokenizer.eos_token_ids) if self.tokenizer else set()
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
        return ids

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)


@contextlib.contextmanager
def _quiet():
    # transformers prints progress bars and warnings on stdout/stderr; the CLI's --json and the LSP's stdio
    # must stay clean.
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        hf_logging.set_verbosity(level)


def _from_pretrained(folder: str, gguf_file: str | None, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"local_files_only": True}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    tok = AutoTokenizer.from_pretrained(folder, **kwargs)
    # a tensor of another shape than the config's is reported here (not raised), then refused below
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, output_loading_info=True,
                                                       ignore_mismatched_sizes=True, **kwargs)
    if mismatched := sorted(info.get("mismatched_keys") or ()):
        key, found, wanted = (list(mismatched[0]) + [None, None])[:3]
        raise ModelLoadError(
            f"Model '{gguf_file or folder}' holds {len(mismatched)} weight tensor{'s' * (len(mismatched) > 1)} of "
            f"another shape than its config describes (first: {key}, {list(found or ())} where "
            f"{list(wanted or ())} is needed); the file is damaged."
        )
    if missing := gguf_check.missing_weights(info):
        # transformers initialized these at random: the model would write text from random numbers
        raise ModelLoadError(
            f"Model '{gguf_file or folder}' lacks {len(missing)} weight tensor{'s' * (len(missing) > 1)} "
            f"(first: {missing[0]}); the file is truncated or damaged, or made for another architecture."
        )
    return model, tok


def check_gguf(path: str | Path) -> gguf_header.Header:
    """The header of the .gguf at `path`; ModelLoadError (one sentence) unless it is a GGUF file whose header, tensor
    table and tokenizer fit each other and the file's size (gguf_check), read without building anything."""
    try:
        header = gguf_header.read(path)
        gguf_check.check(header)
        return header
    except gguf_header.BadGguf as err:
        raise ModelLoadError(f"Could not load model: {err}") from None
    except OSError as err:
        raise ModelLoadError(f"Could not read model file '{path}' ({err.strerror or err}).") from None


def _conversion_dir(folder: str, gguf_file: str) -> Path | None:
    """Where this .gguf's conversion is kept; None when the models cache folder is not this user's alone."""
    models = cache_dir.folder("models")
    return None if models is None else models / _gguf_cache_dir(folder, gguf_file).name


def _read_conversion(cached: Path, dtype: torch.dtype):
    """(model, tokenizer) from the kept conversion `cached`, or (None, why it is not used) where it is missing
    (why: None), damaged, unreadable or not this user's alone."""
    try:
        problem = cache_dir.private_entry(cached)
        if problem is None and not (cached / "config.json").is_file() and not _tokenizer_only(cached):
            problem = "incomplete: no config.json"
    except FileNotFoundError:
        return None, None
    except OSError as err:
        problem = err.strerror or str(err)
    if problem is None and _tokenizer_only(cached):  # kept by a load from the file's blocks: converted over
        shutil.rmtree(cached, ignore_errors=True)
        return None, None
    if problem is None:
        try:
            loaded = _from_pretrained(str(cached), None, dtype)
            cache_dir.touch(cached)
            return loaded, None
        except Exception as err:  # a damaged cache is rebuilt, never fatal
            problem = f"unusable: {str(err).strip()[:200] or type(err).__name__}"
    return None, problem


def _tokenizer_only(cached: Path) -> bool:
    """Whether the kept entry `cached` holds a .gguf's tokenizer alone (a load from its blocks keeps no weights)."""
    return not (cached / "config.json").is_file() and (cached / "tokenizer_config.json").is_file()


def _load_gguf_cached(folder: str, gguf_file: str, dtype: torch.dtype):
    cached = _conversion_dir(folder, gguf_file)
    keep = cached is not None
    if cached is not None:
        loaded, problem = _read_conversion(cached, dtype)
        if loaded is not None:
            return loaded
        if problem is not None:
            shutil.rmtree(cached, ignore_errors=True)  # os.replace cannot write over a folder
            keep = not os.path.lexists(cached)
            log.warning("The cached conversion %s is not used (%s); converting the .gguf again%s.", cached, problem,
                        "" if keep else " without keeping it (it cannot be removed)")
    model, tok = _from_pretrained(folder, gguf_file, torch.float32)
    if keep:
        _keep_conversion(model, tok, cached, Path(folder) / gguf_file)
    return model.to(dtype), tok


def _keep_conversion(model, tok, cached: Path, source: Path) -> None:
    """Save the dequantized model (None: the tokenizer alone) of the .gguf `source` into `cached`, all or nothing; a
    failure only costs the next load a conversion. The conversions of earlier versions of that path go, and the
    least recently used ones beyond cache_dir.MODELS_BYTES."""
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".tmp-"))
        if model is not None:
            # The weights are already dequantized to fp32; only the gguf marker forbids saving them.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(str(source.resolve()), encoding="utf-8")
        os.replace(tmp, cached)  # atomic: a reader sees the whole folder or none
        tmp = None
        _forget_older_conversions(cached, source)
        cache_dir.prune(cached.parent, current=cached, max_bytes=cache_dir.MODELS_BYTES)
    except Exception as err:  # save_pretrained raises more than OSError (ValueError, RuntimeError, ...)
        log.warning("Could not keep the converted model in %s (%s); the next load converts again.", cached, err)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _forget_older_conversions(cached: Path, source: Path) -> None:
    """Removes the other conversions made from the path `source` (its earlier versions: the file was replaced)."""
    name = str(source.resolve())
    for other in cached.parent.iterdir():
        if other == cached or not cache_dir.ENTRY_NAMES["models"].fullmatch(other.name):
            continue
        try:
            if (other / SOURCE_FILE).read_text(encoding="utf-8") != name:
                continue
        except (OSError, UnicodeDecodeError):
            continue
        cache_dir.remove(other)


def _local(folder: str, gguf_file: str | None) -> tuple[str, str | None]:
    """(folder, gguf file) on this machine: a hub id becomes its snapshot folder in the local Hugging Face cache, so
    transformers reads a folder; given a hub id, huggingface_hub looks the hub up even with local_files_only."""
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True  # rest-lsp never downloads: none of its own fetches either
    if gguf_file or Path(folder).is_dir():
        return folder, gguf_file
    snapshot = hub_snapshot(folder)
    if snapshot is None:
        raise ModelLoadError(
            f"Could not load model '{folder}': it is not in the local Hugging Face cache "
            f"({huggingface_hub.constants.HF_HUB_CACHE}) and rest-lsp never downloads; fetch it once "
            f"(`hf download {folder}`) or point --model at a local folder or .gguf file."
        )
    return snapshot, None


def _clause(err: BaseException) -> str:
    """Another library's error as a clause of our one sentence: its first line, its own sentence breaks made
    semicolons, at most 200 characters (its type's name where it says nothing)."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    return first.replace(". ", "; ")[:200]


def _load(spec: str | None, dtype: torch.dtype):
    folder, gguf_file = _local(*_resolve(spec))
    shown = spec or DEFAULT_MODEL
    try:
        with _quiet():
            if gguf_file:
                return _load_gguf_cached(folder, gguf_file, dtype)
            return _from_pretrained(folder, None, dtype)
    except ModelLoadError:
        raise
    except Exception as err:  # corrupt weights raise the safetensors library's own error type, among others
        where = ".gguf file" if gguf_file else "local folder" if Path(folder).is_dir() else "cached hub model"
        raise ModelLoadError(
            f"Could not load model '{shown}' as a {where} ({_clause(err)}); "
            "point --model at a local folder with config.json and weights, or at a .gguf file."
        ) from err


def load_tokenizer(spec: str | None = None) -> Tokenizer:
    folder, gguf_file = _local(*_resolve(spec))
    if gguf_file:
        check_gguf(Path(folder) / gguf_file)
    try:
        with _quiet():
            from transformers import AutoTokenizer

            if gguf_file:
                hf = _gguf_tokenizer(folder, gguf_file)
            else:
                hf = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as err:
        raise ModelLoadError(
            f"Could not load the tokenizer of '{spec or DEFAULT_MODEL}'; point --model at a local folder or .gguf file."
        ) from err
    saved_tokenizer.keep(spec, hf)
    return Tokenizer(hf)


def _gguf_tokenizer(folder: str, gguf_file: str, keep: bool = False):
    """The tokenizer of a .gguf: from its conversion cache, else (missing, damaged or not this user's there) from
    the file itself, putting it back into a conversion whose tokenizer alone was damaged, and (`keep`, where no
    entry is there) keeping it alone for the next load from the file's blocks."""
    from transformers import AutoTokenizer

    cached = _conversion_dir(folder, gguf_file)
    try:
        present = cached is not None and os.path.lexists(cached)
        usable = present and cache_dir.private_entry(cached) is None
        repair = usable and (cached / "config.json").is_file()
        usable = usable and (cached / "tokenizer_config.json").is_file()
    except OSError:
        present, usable, repair = True, False, False
    if usable:
        try:
            return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
        except Exception as err:
            log.warning("Cached tokenizer in %s is unusable (%s); reading it from the .gguf again.", cached, err)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)
    if repair:  # a conversion whose tokenizer alone was damaged: repair it
        try:
            tok.save_pretrained(cached)
        except Exception as err:
            log.warning("Could not repair the cached tokenizer in %s (%s).", cached, err)
    elif keep and cached is not None and not present:  # a load from the blocks: the next one reads this copy
        _keep_conversion(None, tok, cached, Path(folder) / gguf_file)
    return tok


def load_model(spec: str | None = None, device: str | None = None, dtype: str | None = None) -> LoadedModel:
    rotary.first_trig_calls()  # before anything computes a cos on several threads: transformers' rotary tables too
    folder, gguf_file = _resolve(spec)
    # a .gguf's header is checked before anything is built from what it claims
    header = check_gguf(Path(folder) / gguf_file) if gguf_file else None
    mode = decide(device, dtype, gguf=gguf_file is not None)
    unasked = dtype in (None, "", "auto") and not os.environ.get(DTYPE_ENV)
    if header is not None and (direct := _direct_mode(header, mode, device, unasked)) is not None:
        return _load_direct(spec, folder, gguf_file, header, direct)
    for note in mode.notes:
        log.warning(note)
    # no dtype asked for, a .gguf on a CPU the gguf mode cannot load from its blocks: the rule's mode or the gguf
    # mode, whichever steps faster here
    names = mode_choice.candidates(mode, gguf_file is not None) if unasked else []
    choice = key = None
    if names:
        key = mode_choice.choice_key(Path(folder) / gguf_file, mode.device, names)
        choice = mode_choice.read_cached(mode_choice.cache_file(cache_root(), key), key)
        if choice is not None:
            mode = decide(device, choice.mode, gguf=True)
    measuring = bool(names) and choice is None
    model, tok = _load(spec, torch.float32 if measuring else mode.dtype)
    model.to(mode.device).eval()
    if gguf_file:  # the gguf mode runs the file's own blocks
        gguf_blocks.attach(model, Path(folder) / gguf_file)
    if measuring:
        model, mode, choice = _measure_modes(model, mode, names, key)
    if choice is not None:
        log.info("Mode %s", mode_choice.describe(choice))
    notes = list(mode.notes)
    if (note := _lean_refusal(model, mode)) is not None:
        log.warning(note)
        notes.append(note)
    saved_tokenizer.keep(spec, tok)
    tokenizer = Tokenizer(tok)
    return LoadedModel(model=model, tokenizer=tokenizer, device=mode.device, dtype=mode.dtype,
                       name=spec or DEFAULT_MODEL, notes=notes, packing=mode.packing)


def _direct_mode(header: gguf_header.Header, mode, device: str | None, unasked: bool):
    """The gguf mode, for a .gguf loaded straight from its blocks (gguf_direct), when it runs that way: asked for
    (`--dtype gguf`), or no dtype asked for on a CPU whose integer kernel builds (what a person pointing --model at
    their Q4_K_M or Q8_0 file expects: the file's blocks, memory near the file's size, no fp32 model first); None
    (transformers' path) for other dtypes and files the lean engine does not run (gguf_direct.refusal)."""
    from rest_lsp.engine import gguf_direct
    from rest_lsp.engine.matmuls import q8_packs

    if mode.packing != GGUF_WEIGHTS:
        if not unasked or mode.device.type != "cpu" or not q8_packs(torch.float32, mode.device):
            return None
        mode = decide(device, GGUF_WEIGHTS, gguf=True)
    why = gguf_direct.refusal(header)
    if why is not None:
        log.info("%s is loaded through transformers, not from its blocks (%s).", Path(header.path).name, why)
        return None
    return mode


def _load_direct(spec: str | None, folder: str, gguf_file: str, header: gguf_header.Header, mode) -> LoadedModel:
    """The .gguf loaded from its blocks into the gguf mode, its panels kept for the next load (panel_cache); its
    tokenizer from the file (kept for the next load)."""
    from rest_lsp.engine import gguf_direct

    for note in mode.notes:
        log.warning(note)
    try:
        with _quiet():
            tok = _gguf_tokenizer(folder, gguf_file, keep=True)
            # the tokenizer's serialized copies (its key, the saved copy) are made and freed before the weights
            # come in, their heap handed back: they never add to the peak the panels set
            saved_tokenizer.keep(spec, tok)
            tokenizer = Tokenizer(tok)
            gguf_direct.trim_heap()
            model = gguf_direct.load(header, gguf_direct.config_of(header), _panels_file(folder, gguf_file))
    except ModelLoadError:
        raise
    except Exception as err:
        raise ModelLoadError(f"Could not load model '{spec or DEFAULT_MODEL}' from the blocks of its .gguf file "
                             f"({_clause(err)}); --dtype float32 loads it through transformers instead.") from err
    return LoadedModel(model=model, tokenizer=tokenizer, device=mode.device, dtype=mode.dtype,
                       name=spec or DEFAULT_MODEL, notes=list(mode.notes), packing=mode.packing)


def _panels_file(folder: str, gguf_file: str) -> tuple[Path, str] | None:
    """(where this .gguf's packed panels are kept, the key they are kept under: panel_cache); None when the models
    cache folder is not this user's alone or the file cannot be hashed."""
    from rest_lsp.engine import panel_cache
    from rest_lsp.engine.model_source import panels_cache_name

    models = cache_dir.folder("models")
    if models is None:
        return None
    try:
        name, key = panels_cache_name(folder, gguf_file, panel_cache.PACK_FORMAT)
    except OSError as err:
        log.warning("The packed panels of %s are not kept (%s).", gguf_file, err.strerror or err)
        return None
    return models / name, key


def _lean_refusal(model, mode) -> str | None:
    """The sentence for a mode that only the lean engine runs (`--dtype gguf`) asked for a model it does not run;
    None otherwise."""
    if mode.packing != GGUF_WEIGHTS:
        return None
    from rest_lsp.engine.lean_llama import unsupported

    why = unsupported(model)
    if why is None:
        return None
    return (f"--dtype gguf runs a .gguf's own blocks on rest-lsp's lean engine, which does not run this model "
            f"({why}); it runs in float32 on transformers' path instead.")


def _measure_modes(model, rule, names: list[str], key: dict):
    """(the model in the fastest mode, that mode, the choice) from timing each candidate on the fp32 model; the
    choice is kept for the next load unless the timings were noisy."""
    log.info("Timing which mode decodes this model fastest here (%s; once per machine and model).",
             ", ".join(names))
    timings, noisy = mode_choice.measure(model, names, rule)
    choice, mode = None, rule  # no candidate ran: the rule's mode
    if timings:
        choice = mode_choice.Choice(mode_choice.choose(timings), timings, "measured")
        if not noisy and len(timings) == len(names):
            mode_choice.write_cached(mode_choice.cache_file(cache_root(), key), key, choice)
        mode = decide(rule.device.type, choice.mode, gguf=True)
    mode_choice.forget_packs(model, mode.packing, mode.dtype)  # a candidate that failed may have packed too
    return model.to(mode.dtype), mode, choice
