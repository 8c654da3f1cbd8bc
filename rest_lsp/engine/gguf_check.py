"""Whether a .gguf's header describes the tensors the file really holds, checked before transformers builds (and
allocates) the model the header claims.

transformers sizes the model from the metadata (layers, widths, vocabulary) and fills it from the tensor table; a
parameter the file does not hold is initialized at random without a word. So a header-only file claiming a big model
is allocated in full, and a file that lacks a tensor writes text from random numbers. The rules here compare each
claim with the tensor table (gguf_header checked the table against the file's size): the weights are there, every
layer has the same tensors, the widths the header states are the tensors' widths, and the tokenizer's ids fit the
embedding. What a rule cannot see from the header alone (a tensor missing from every layer of an architecture) is
caught after the load by `missing_weights`.
"""

from __future__ import annotations

import re

from rest_lsp.engine.gguf_header import BadGguf, Header

MAX_CONTEXT = 1 << 31  # a context_length past this is not a model's
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def check(header: Header) -> None:
    """BadGguf (one sentence naming the file) unless the header's model is the one its tensors hold."""
    name = f"'{header.path.rsplit('/', 1)[-1]}'"
    if not header.tensors:
        raise BadGguf(f"{name} holds no weight tensors (only a header); it cannot be loaded.")
    if not header.arch:
        raise BadGguf(f"{name} names no architecture (general.architecture); it cannot be loaded.")
    _check_types(header, name)
    embed = header.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise BadGguf(f"{name} lacks the token embeddings (token_embd.weight); it cannot be loaded.")
    _check_blocks(header, name)
    _check_widths(header, name, hidden=embed.shape[0])
    _check_vocabulary(header, name, rows=embed.shape[1])


# the header fields transformers sizes the model by: (key under the architecture, whether a per-layer list is allowed)
_SIZES = (("block_count", False), ("context_length", False), ("embedding_length", False), ("vocab_size", False),
          ("feed_forward_length", True), ("attention.head_count", True), ("attention.head_count_kv", True),
          ("attention.key_length", False), ("attention.value_length", False))


def _check_types(header: Header, name: str) -> None:
    for key, per_layer in _SIZES:
        full = f"{header.arch}.{key}"
        if full not in header.fields and full not in header.array_lengths:
            continue
        value = header.fields.get(full)
        values = value if per_layer and isinstance(value, list) else [value]
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            shown = type(value).__name__ if full in header.fields else "long list"
            raise BadGguf(f"{name} states {full} as a {shown}, not a whole number; the file is damaged.")


def _check_blocks(header: Header, name: str) -> None:
    arch = header.arch
    count = header.get(f"{arch}.block_count", int)
    if count is None or count < 1:
        raise BadGguf(f"{name} does not state its number of layers ({arch}.block_count).")
    layers: dict[int, set[str]] = {}
    for tensor in header.tensors:
        if m := _BLOCK.fullmatch(tensor):
            layers.setdefault(int(m[1]), set()).add(m[2])
    held = sum(1 for i in layers if i < count)  # never a list of `count`: the header may claim 2^60 layers
    if held < count:
        first = next(i for i in range(count) if i not in layers)  # within the first len(layers) + 1
        raise BadGguf(f"{name} claims {count} layers but holds no tensors for {count - held} of them (first: layer "
                      f"{first}); the file is truncated or damaged.")
    extra = sorted(i for i in layers if i >= count)
    if extra:
        raise BadGguf(f"{name} claims {count} layers but holds tensors of layer {extra[0]}; the file is damaged.")
    first = layers[0]
    for i in range(1, count):
        if layers[i] != first:
            lost = sorted(first ^ layers[i])[0]
            where = i if lost in first else 0
            raise BadGguf(f"{name} lacks the tensor blk.{where}.{lost} that its other layers have; the file is "
                          "truncated or damaged.")


def _width_rules(header: Header, hidden: int):
    """(tensor name, its shape in GGUF order, what the header says the shape is, the keys it comes from)."""
    arch, t = header.arch, header.tensors
    ffn = header.get(f"{arch}.feed_forward_length", int)
    heads = header.get(f"{arch}.attention.head_count", int)
    kv = header.get(f"{arch}.attention.head_count_kv", int) or heads
    head_dim = header.get(f"{arch}.attention.key_length", int)
    for i in range(header.get(f"{arch}.block_count", int) or 0):
        if ffn is not None:
            for part in ("ffn_up", "ffn_gate"):
                if (w := t.get(f"blk.{i}.{part}.weight")) is not None:
                    yield w.name, w.shape, (hidden, ffn), "embedding_length, feed_forward_length"
            if (w := t.get(f"blk.{i}.ffn_down.weight")) is not None:
                yield w.name, w.shape, (ffn, hidden), "feed_forward_length, embedding_length"
        q = t.get(f"blk.{i}.attn_q.weight")
        if heads and q is not None and len(q.shape) == 2:
            # the head width: stated, else the query's rows per head (some configs default it, e.g. Qwen3's 128)
            dim = head_dim or (q.shape[1] // heads if q.shape[1] % heads == 0 else 0)
            yield q.name, q.shape, (hidden, heads * dim), "embedding_length, attention.head_count"
            for part in ("attn_k", "attn_v"):
                if kv and (w := t.get(f"blk.{i}.{part}.weight")) is not None:
                    yield w.name, w.shape, (hidden, kv * dim), "attention.head_count, attention.head_count_kv"
            if (w := t.get(f"blk.{i}.attn_output.weight")) is not None:
                yield w.name, w.shape, (heads * dim, hidden), "attention.head_count, embedding_length"
        for part in ("attn_norm", "ffn_norm"):
            if (w := t.get(f"blk.{i}.{part}.weight")) is not None:
                yield w.name, w.shape, (hidden,), "embedding_length"
    if (w := t.get("output_norm.weight")) is not None:
        yield w.name, w.shape, (hidden,), "embedding_length"


def _check_widths(header: Header, name: str, hidden: int) -> None:
    arch = header.arch
    stated = header.get(f"{arch}.embedding_length", int)
    if stated is not None and stated != hidden:
        raise BadGguf(f"{name} states {arch}.embedding_length {stated} but its token embeddings are {hidden} wide; "
                      "the file is damaged.")
    if header.get(f"{arch}.attention.head_count", int) == 0:
        raise BadGguf(f"{name} states 0 attention heads; the file is damaged.")
    context = header.get(f"{arch}.context_length", int)
    if context is not None and not 0 < context <= MAX_CONTEXT:
        raise BadGguf(f"{name} states a context of {context} tokens; the file is damaged.")
    for tensor, shape, want, keys in _width_rules(header, hidden):
        if tuple(shape) != want:
            raise BadGguf(f"Tensor {tensor} of {name} has the shape {list(shape)} where its header ({keys}) says "
                          f"{list(want)}; the file is damaged.")


def _check_vocabulary(header: Header, name: str, rows: int) -> None:
    tokens = header.array_lengths.get("tokenizer.ggml.tokens")
    if tokens is not None and tokens > rows:
        raise BadGguf(f"The tokenizer of {name} has {tokens} tokens but its embedding only {rows} rows, so ids from "
                      f"{rows} up would have no weights; the file is damaged or mismatched.")
    stated = header.get(f"{header.arch}.vocab_size", int)
    if stated is not None and stated != rows:
        raise BadGguf(f"{name} states a vocabulary of {stated} tokens but its embedding has {rows} rows; the file "
                      "is damaged.")
    head = header.tensors.get("output.weight")
    if head is not None and tuple(head.shape) != tuple(header.tensors["token_embd.weight"].shape):
        raise BadGguf(f"The output.weight of {name} has the shape {list(head.shape)}, not the embedding's "
                      f"{list(header.tensors['token_embd.weight'].shape)}; the file is damaged.")


def missing_weights(info: dict) -> list[str]:
    """The parameters transformers found no tensor for (its loading info), ties resolved: a non-empty list means
    the model would run with random weights there."""
    return sorted(str(k) for k in info.get("missing_keys", ()) if not str(k).endswith("inv_freq"))
