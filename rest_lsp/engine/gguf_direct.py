"""A .gguf loaded straight from its blocks for the gguf mode: no fp32 transformers model in between.

The header and tensor table come from gguf_header (every claim checked against the file's size, gguf_check run on
them before this module is called), the config from the metadata the way transformers maps it
(transformers.integrations.ggml.GGUF_CONFIG_MAPPING), and each weight tensor, memory-mapped one at a time, goes into
the integer kernel's panels: blocks the kernel keeps (gguf_blocks.decode) as they are, any other type dequantized
alone (gguf.quants.dequantize, what transformers dequantizes with) and quantized to Q8_0 (quant_matmul.quantize_q8_0),
llama's q and k rows put back in transformers' order (gguf_blocks.llama_rows). So every matmul gets the panels the
gguf mode built from transformers' fp32 model, without that model: memory holds the panels, the norms and biases
(fp32) and one tensor's worth of work at a time. The panels built are kept in the models cache folder
(panel_cache); a later load of the same file maps them from there and decodes, checks and packs nothing.

The token embedding stays in the file: a step reads its rows (pread, not a mapping, so they never count as this
process's memory) and dequantizes just those, the values transformers' fp32 embedding holds.

Llama, Qwen2 and Mistral files without scaled RoPE, sliding windows or other head widths (what lean_llama runs);
`refusal` says why another file keeps transformers' path.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import torch

from rest_lsp.engine import gguf_blocks, huge_pages, panel_cache
from rest_lsp.engine.gguf_header import Header, Tensor

log = logging.getLogger(__name__)

ARCHS = ("llama", "qwen2", "mistral")  # GGUF architectures whose transformers model_type lean_llama runs
LAYER_WEIGHTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
LAYER_NORMS = ("attn_norm", "ffn_norm")
EXACT_KINDS = ("Q8_0", "Q5_0", "Q4_0")  # blocks whose d x q is transformers' dequantization by construction
EMBED_ROWS = 4096  # a lookup of more ids reads and dequantizes them this many rows at a time
CHUNK_BYTES = 1 << 24  # a large tensor goes into panels this many bytes of fp32 values at a time


def refusal(header: Header) -> str | None:
    """Why this (checked) file cannot be loaded straight from its blocks; None when it can."""
    arch, t = header.arch, header.tensors
    if arch not in ARCHS:
        return f"architecture {arch!r}"
    if "rope_freqs.weight" in t or header.get(f"{arch}.rope.scaling.type", str) not in (None, "none"):
        return "scaled RoPE"
    if header.get(f"{arch}.attention.sliding_window", int):
        return "sliding-window attention"
    if header.get(f"{arch}.expert_count", int):
        return "mixture of experts"
    heads = header.get(f"{arch}.attention.head_count", int)
    hidden = header.get(f"{arch}.embedding_length", int)
    layers = header.get(f"{arch}.block_count", int)
    if not heads or not hidden or not layers or hidden % heads:
        return "no head count, width or layer count it can use"
    for key in ("key_length", "value_length"):
        if header.get(f"{arch}.attention.{key}", int) not in (None, hidden // heads):
            return f"attention.{key} other than the width per head"
    names = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{part}.weight" for i in range(layers) for part in LAYER_WEIGHTS + LAYER_NORMS]
    if missing := [n for n in names if n not in t]:
        return f"no tensor {missing[0]}"
    if extra := [n for n in t if n.startswith("blk.") and int(n.split(".")[1]) >= layers]:
        return f"tensor {extra[0]} beyond its {layers} layers"
    return None


def config_of(header: Header):
    """The transformers config its from_pretrained(gguf_file=...) builds from this file's metadata."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    arch = header.arch
    model_type = "mistral" if arch == "llama" and header.get("general.name", str) == "mistral" else arch
    params = {}
    for key, name in GGUF_CONFIG_MAPPING.get(model_type, GGUF_CONFIG_MAPPING[arch]).items():
        value = header.fields.get(f"{arch}.{key}")
        if name not in (None, -1) and value is not None:
            params[name] = value
    params["tie_word_embeddings"] = "output.weight" not in header.tensors
    if "vocab_size" not in params and "tokenizer.ggml.tokens" in header.array_lengths:
        params["vocab_size"] = header.array_lengths["tokenizer.ggml.tokens"]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = header.get(f"tokenizer.ggml.{key.replace('pad_', 'padding_')}", int)
        if value is not None:
            params[key] = value
    config = AutoConfig.for_model(model_type, **params)
    config._name_or_path = header.get("general.name", str) or ""
    return config


class RowEmbedding(torch.nn.Module):
    """The token embedding left in the file: `embedding[ids]` reads those rows and dequantizes them to fp32 [n, H]
    (gguf.quants.dequantize: transformers' values bit for bit)."""

    def __init__(self, tensor: Tensor):
        super().__init__()
        self.num_embeddings, self.embedding_dim = tensor.shape[1], tensor.shape[0]
        self.kind = tensor.tensor_type
        self.offset, self.row_bytes = tensor.offset, tensor.nbytes // tensor.shape[1]
        self.path = tensor.path
        self._fd = os.open(tensor.path, os.O_RDONLY)

    def __del__(self):
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:  # ids [n] -> [n, H]
        from gguf.quants import dequantize

        flat = [int(i) for i in ids.reshape(-1).tolist()]
        if any(not 0 <= i < self.num_embeddings for i in flat):
            raise IndexError(f"token id out of range for an embedding of {self.num_embeddings} rows")
        out = torch.empty((len(flat), self.embedding_dim), dtype=torch.float32)
        for start in range(0, len(flat), EMBED_ROWS):
            chunk = flat[start : start + EMBED_ROWS]
            raw = b"".join(os.pread(self._fd, self.row_bytes, self.offset + i * self.row_bytes) for i in chunk)
            rows = np.frombuffer(raw, dtype=np.uint8).reshape(len(chunk), self.row_bytes)
            out[start : start + len(chunk)] = torch.from_numpy(np.array(dequantize(rows, self.kind),
                                                                          dtype=np.float32))
        return out.reshape(*ids.shape, self.embedding_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self[ids]


class GgufModel(torch.nn.Module):
    """What the decoder reads of a model, for a .gguf loaded from its blocks: the config, the generation config's
    end-of-text ids, the embedding (RowEmbedding), the norms (fp32 parameters) and the lean engine's layers and
    head built once (`lean_parts`). It runs only on the lean engine in the gguf packing; there is no transformers
    forward."""

    lean_only = True

    def __init__(self, config, embed: RowEmbedding, norm: torch.Tensor, layers: list, head, path: str):
        super().__init__()
        from transformers import GenerationConfig

        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config)
        self.embed_tokens = embed
        self.norm = torch.nn.Parameter(norm, requires_grad=False)  # [H] fp32
        self.__dict__["_lean_gguf"] = (layers, head, {})  # (layers, head, {script: stack}), as LeanLlama keeps it
        gguf_blocks.attach(self, path)

    def get_input_embeddings(self) -> RowEmbedding:
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.__dict__["_lean_gguf"][1]

    def get_decoder(self):
        return None

    def lean_parts(self, packing: str):
        """(embedding, final norm weight, (layers, head, {script: stack})) for LeanLlama; only the gguf packing."""
        if packing != "gguf":
            raise ValueError(f"a .gguf loaded from its blocks runs in the gguf packing, not {packing!r}")
        return self.embed_tokens, self.norm, self.__dict__["_lean_gguf"]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("a .gguf loaded from its blocks runs on rest-lsp's lean engine only")


class _Mismatch(Exception):
    """The file's blocks of a kind not known exact here do not dequantize as gguf does."""


class _Builder:
    """Turns one file's tensors into the lean engine's matmuls, one tensor (and of a large one, CHUNK_BYTES of it) in
    memory at a time."""

    def __init__(self, header: Header):
        self.header, self.t = header, header.tensors
        arch = header.arch
        self.heads = header.get(f"{arch}.attention.head_count", int)
        kv = header.get(f"{arch}.attention.head_count_kv", int)
        self.kv_heads = kv or self.heads
        # transformers un-permutes llama's q and k rows only when the file states both head counts
        self.permuted = arch == "llama" and kv is not None
        self.kept: dict[str, int] = {}  # tensor name -> the bits of its panels, for the ones on their own blocks
        self.arena: huge_pages.Arena | None = None  # where `panels` packs, in the order it is asked (`arena_for`)

    def arena_for(self, specs: dict[str, tuple[list[str], list[str] | None]]) -> None:
        """Packs from now on into one Arena sized for `specs`' tensors on their own blocks (or Q8_0 where not
        kept), so that the panels lie in the order the matmuls are built: a step's order, as a warm load reads
        them (where a tensor falls back to Q8_0 the arena runs short: the tensors that no longer fit get memory of
        their own)."""
        from rest_lsp.kernels import quant_matmul

        total = 0
        for names, _ in specs.values():
            for name in names:
                n, k = self.t[name].shape[1], self.t[name].shape[0]
                bits = gguf_blocks.BITS.get(self.t[name].tensor_type.name) or 8
                total += math.prod(quant_matmul.panels_shape(n, k, bits))
        self.arena = huge_pages.Arena(total)

    def _empty(self, shape: tuple[int, int]) -> torch.Tensor:
        return self.arena.take(shape) if self.arena is not None else huge_pages.empty(shape)

    def _give_back(self, panels: list[torch.Tensor]) -> None:
        """Returns panels packed but not used to the arena, the last taken first."""
        if self.arena is not None:
            for p in reversed(panels):
                self.arena.give_back(p)

    def matmul(self, names: list[str], biases: list[str] | None = None, stored: list | None = None):
        """One GgufMatmul over the tensors `names` (their rows one after the other: a fused q/k/v or gate/up),
        neighbours of one width in one part, as GgufMatmul.of_blocks makes it; from the parts `stored` (format code,
        first row, rows, panels: panel_cache) when an earlier load kept them."""
        from rest_lsp.engine.matmuls import GgufMatmul, QuantMatmul
        from rest_lsp.kernels.quant_matmul import PANEL

        bias = torch.cat([self.vector(b) for b in biases]) if biases and all(b in self.t for b in biases) else None
        if stored is not None:
            return GgufMatmul([QuantMatmul(panels, rows, None if bias is None else bias[first : first + rows]
                                           .contiguous(), bits) for bits, first, rows, panels in stored])
        runs: list[list] = []  # [bits, [panels], first row, rows]
        start = 0
        for name in names:
            bits, panels = self.panels(name)
            rows = self.t[name].shape[1]
            if runs and runs[-1][0] == bits:
                if runs[-1][3] % PANEL:  # the run's last panel is partly empty: its blocks are packed together
                    self._give_back([p for run in runs for p in run[1]] + [panels])
                    shape_only = torch.empty((sum(self.t[n].shape[1] for n in names), 0), device="meta")
                    return GgufMatmul.of_blocks(shape_only, bias, [(self.t[n].shape[1], self.blocks(n))
                                                                   for n in names])
                runs[-1][1].append(panels)
                runs[-1][3] += rows
            else:
                runs.append([bits, [panels], start, rows])
            start += rows
        return GgufMatmul([QuantMatmul(huge_pages.cat(p), rows,
                                       None if bias is None else bias[first : first + rows].contiguous(), bits)
                           for bits, p, first, rows in runs])

    def panels(self, name: str) -> tuple[int, torch.Tensor]:
        """(bits, the kernel's panels) of tensor `name` [N, K] in transformers' row order: its own blocks where
        gguf_blocks keeps that kind (and, a kind not known exact here, they dequantize as gguf does), else Q8_0."""
        from rest_lsp.kernels import quant_matmul

        tensor = self.t[name]
        n, k = tensor.shape[1], tensor.shape[0]
        heads = self._heads(name)
        own = gguf_blocks.BITS.get(tensor.tensor_type.name)
        for bits, mine in ([(own, True)] if own else []) + [(8, False)]:
            out = self._empty(quant_matmul.panels_shape(n, k, bits))
            try:
                # llama's q and k rows move within each head: those (small) tensors are packed whole
                step = n if heads else max(quant_matmul.PANEL, CHUNK_BYTES // (4 * k) // quant_matmul.PANEL
                                           * quant_matmul.PANEL)
                for first in range(0, n, step):
                    blocks = self._chunk(tensor, first, min(n, first + step), mine)
                    if heads:
                        blocks = gguf_blocks.llama_rows(blocks, heads)
                    out[first // quant_matmul.PANEL : -(-(first + blocks.quants.shape[0]) // quant_matmul.PANEL)] = (
                        quant_matmul.pack_blocks(**blocks.fields(), bits=bits))
                    del blocks
            except _Mismatch:
                self._give_back([out])
                log.warning("The %s blocks of %s do not dequantize as gguf does; they run requantized to Q8_0.",
                            tensor.tensor_type.name, name)
                continue
            if mine:
                self.kept[name] = bits
            trim_heap()
            return bits, out
        raise AssertionError("unreachable: Q8_0 always packs")

    def blocks(self, name: str) -> gguf_blocks.Blocks:
        """Tensor `name` whole as Blocks in transformers' row order (the rare fused matmul packed in one piece)."""
        tensor = self.t[name]
        own = gguf_blocks.BITS.get(tensor.tensor_type.name)
        try:
            found = self._chunk(tensor, 0, tensor.shape[1], bool(own))
        except _Mismatch:
            found = self._chunk(tensor, 0, tensor.shape[1], False)
        heads = self._heads(name)
        return gguf_blocks.llama_rows(found, heads) if heads else found

    def _heads(self, name: str) -> int | None:
        """The head count a llama q or k tensor's rows are permuted by in the file; None for every other tensor."""
        if not self.permuted or not name.endswith(("attn_q.weight", "attn_k.weight")):
            return None
        return self.heads if name.endswith("attn_q.weight") else self.kv_heads

    @staticmethod
    def _chunk(tensor: Tensor, first: int, stop: int, own: bool) -> gguf_blocks.Blocks:
        """Rows [first, stop) of `tensor` as Blocks: its own (`own`: gguf_blocks.decode) or Q8_0 made from its
        values (gguf.quants.dequantize, transformers' dequantization, then quant_matmul.quantize_q8_0)."""
        from gguf.quants import dequantize
        from rest_lsp.kernels import quant_matmul

        k, kind = tensor.shape[0], tensor.tensor_type
        raw = tensor.data[first:stop]  # memory-mapped [rows, bytes per row]; unmapped when this returns
        if own:
            try:
                found = gguf_blocks.decode(raw, kind.name, k)
            except (KeyError, ValueError, NotImplementedError):
                raise _Mismatch from None
            if kind.name not in EXACT_KINDS:
                want = torch.from_numpy(np.array(dequantize(raw, kind), dtype=np.float32)).reshape(stop - first, k)
                if not torch.equal(found.dequantized(), want):
                    raise _Mismatch
            return found
        w = torch.from_numpy(np.array(dequantize(raw, kind), dtype=np.float32)).reshape(stop - first, k)
        return gguf_blocks.Blocks(8, *quant_matmul.quantize_q8_0(w))

    def vector(self, name: str) -> torch.Tensor:
        """A norm's or bias's tensor as fp32 [N]."""
        from gguf.quants import dequantize

        tensor = self.t[name]
        return torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(-1))


def trim_heap() -> None:
    """Hands the heap's free pages back (glibc's malloc_trim): a tensor's temporaries, freed between tensors that
    stay, would otherwise keep the process's memory at its peak."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


def load(header: Header, config, kept_file: tuple[Path, str] | None = None):
    """The GgufModel of a checked .gguf whose `refusal` is None, built tensor by tensor; `kept_file` (path, key):
    where its packed panels are kept (panel_cache), read from there when they are and written there when not."""
    from rest_lsp.engine.lean_llama import Norm, _Layer
    from rest_lsp.kernels import row_attention

    b = _Builder(header)
    specs = _matmuls(header, config.num_hidden_layers)
    stored = kept = None
    if kept_file is not None:
        shapes = {name: (sum(b.t[n].shape[1] for n in names), b.t[names[0]].shape[0])
                  for name, (names, _) in specs.items()}
        found = panel_cache.read(kept_file[0], kept_file[1], shapes)
        if found is not None:
            stored, kept = found
    if stored is None:
        b.arena_for(specs)
    built = {name: b.matmul(names, biases, None if stored is None else stored[name])
             for name, (names, biases) in specs.items()}  # the head first, the largest, while nothing else is built
    if stored is None:
        kept = {bits: sum(1 for v in b.kept.values() if v == bits) for bits in sorted(set(b.kept.values()))}
        if kept_file is not None:
            panel_cache.write(kept_file[0], kept_file[1], {name: _parts(m) for name, m in built.items()}, kept)
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = []
    for i in range(config.num_hidden_layers):
        p = f"blk.{i}."
        layers.append(_Layer(
            norm_in=Norm.of(b.vector(p + "attn_norm.weight")),
            qkv=built[p + "qkv"],
            o=built[p + "o"],
            norm_post=Norm.of(b.vector(p + "ffn_norm.weight")),
            gate_up=built[p + "gate_up"],
            down=built[p + "down"],
            source=0,
            shape=(heads, kv, dim),
            eps=config.rms_norm_eps,
            score_scale=dim**-0.5,  # the gguf packing never scales the query weights
            row_exact=row_attention.available(),
        ))
    log.info("gguf mode, loaded from the file's blocks%s: %d of %s's weight tensors run on their own blocks (by "
             "bits: %s); the others are requantized to Q8_0.", "" if stored is None else " (panels kept from an "
             "earlier load)", sum(kept.values()), Path(header.path).name, kept)
    embed = RowEmbedding(header.tensors["token_embd.weight"])
    return GgufModel(config, embed, b.vector("output_norm.weight"), layers, built["head"], header.path)


def _matmuls(header: Header, layers: int) -> dict[str, tuple[list[str], list[str] | None]]:
    """{matmul name: (its tensors, its biases)} in the order they are built: the head, then each layer's."""
    out = {"head": (["output.weight" if "output.weight" in header.tensors else "token_embd.weight"], None)}
    for i in range(layers):
        p = f"blk.{i}."
        out[p + "qkv"] = ([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
                          [p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"])
        out[p + "o"] = ([p + "attn_output.weight"], None)
        out[p + "gate_up"] = ([p + "ffn_gate.weight", p + "ffn_up.weight"], None)
        out[p + "down"] = ([p + "ffn_down.weight"], None)
    return out


def _parts(matmul) -> list[tuple[int, int, int, torch.Tensor]]:
    """A GgufMatmul's parts as panel_cache keeps them: (format code, first row, rows, panels)."""
    out, first = [], 0
    for part in matmul.parts:
        out.append((part.bits, first, part.out_features, part.panels))
        first += part.out_features
    return out
