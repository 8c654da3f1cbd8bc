"""Tiny random llama .gguf files written with the gguf package's GGUFWriter, for the tests of loading and its caches
(no download, no real model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LAYER_TENSORS = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                 "ffn_down")


def tensor_names(layers: int = 1) -> list[str]:
    return ["token_embd.weight", "output_norm.weight", "output.weight"] + [
        f"blk.{i}.{n}.weight" for i in range(layers) for n in LAYER_TENSORS]


def write_gguf(path: Path, vocab: int = 97, hidden: int = 64, ffn: int = 128, heads: int = 4, kv: int = 2,
               layers: int = 1, seed: int = 0, skip: tuple[str, ...] = (), extra_tokens: int = 0,
               kinds: dict[str, str] | None = None, metadata: dict | None = None, eos: int | None = 0) -> Path:
    """A random llama model as a .gguf with a small BPE tokenizer (94 characters, 3 merges, `extra_tokens` more);
    tensors named in `skip` are left out; `kinds` maps a tensor kind (attn_q, token_embd...) to a GGML type (Q4_K,
    Q5_K and Q6_K ones are `random_raw` blocks);
    `metadata` adds or replaces header fields (key -> value, written with the writer's add_key_value); `eos` is the
    end-of-text token (None: no such token)."""
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "llama")
    fields = {"llama.block_count": layers, "llama.context_length": 256, "llama.embedding_length": hidden,
              "llama.feed_forward_length": ffn, "llama.attention.head_count": heads,
              "llama.attention.head_count_kv": kv, "llama.attention.layer_norm_rms_epsilon": 1e-6,
              "llama.rope.freq_base": 10000.0, **(metadata or {})}
    for key, value in fields.items():
        kind = (GGUFValueType.STRING if isinstance(value, str) else GGUFValueType.FLOAT32 if isinstance(value, float)
                else GGUFValueType.UINT64 if value >= 1 << 32 else GGUFValueType.UINT32)
        w.add_key_value(key, value, kind)
    toks = [chr(33 + i) for i in range(94)] + ["ab", "cd", "ef"] + [f"<x{i}>" for i in range(extra_tokens)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([1] * len(toks))
    w.add_token_merges(["a b", "c d", "e f"])
    if eos is not None:
        w.add_eos_token_id(eos)
    hd = hidden // heads
    shapes = {"token_embd": (vocab, hidden), "output_norm": (hidden,), "output": (vocab, hidden),
              "attn_norm": (hidden,), "ffn_norm": (hidden,), "attn_q": (heads * hd, hidden),
              "attn_k": (kv * hd, hidden), "attn_v": (kv * hd, hidden), "attn_output": (hidden, heads * hd),
              "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    for name in tensor_names(layers):
        part = name.split(".")[-2]
        a = (np.ones(shapes[part], np.float32) if part.endswith("norm")
             else (rng.standard_normal(shapes[part]) * 0.1).astype(np.float32))
        if name in skip:
            continue
        kind = (kinds or {}).get(part, "F32")
        if kind in ("F32", "F16"):
            w.add_tensor(name, a.astype(np.float16) if kind == "F16" else a)
        elif kind in ("Q4_K", "Q5_K", "Q6_K"):  # gguf-py does not quantize to these: random blocks of the shape
            k = GGMLQuantizationType[kind]
            w.add_tensor(name, random_raw(kind, *shapes[part], seed=len(name) + ord(name[-8]), scale=2e-4), raw_dtype=k)
        else:
            k = GGMLQuantizationType[kind]
            w.add_tensor(name, quantize(a, k), raw_dtype=k)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def random_raw(kind: str, rows: int, k: int, seed: int = 0, scale: float = 1e-3) -> np.ndarray:
    """A GGUF tensor [rows, k] of block type `kind` (Q8_0 ... Q6_K) as raw bytes [rows, k / block x block bytes]:
    every quant, 6-bit scale and min byte random (gguf-py writes no K-quants), the fp16 scales finite, near `scale`
    (and a Q4_1 block's fp16 min negative, near -8 scale), so each weight is a few tenths at most."""
    from rest_lsp.engine.gguf_blocks import BLOCK_BYTES, SUPERBLOCK

    rng = np.random.default_rng(seed)
    per, size = SUPERBLOCK.get(kind, 32), BLOCK_BYTES[kind]
    raw = rng.integers(0, 256, (rows, k // per, size), dtype=np.uint8)

    def put(at: int, values: np.ndarray) -> None:
        raw[..., at : at + 2] = values.astype(np.float16).view(np.uint8).reshape(rows, k // per, 2)

    draw = lambda: rng.uniform(0.5, 1.5, (rows, k // per)) * scale  # noqa: E731
    if kind == "Q6_K":
        put(208, draw() / 8)
    else:
        put(0, draw() / (4 if kind in ("Q4_K", "Q5_K") else 1))
    if kind == "Q4_1":
        put(2, -8 * draw())
    if kind in ("Q4_K", "Q5_K"):
        put(2, draw() / 8)
    return raw.reshape(rows, -1)
