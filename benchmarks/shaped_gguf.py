"""GGUF files with the exact shapes of Qwen2.5-Coder-1.5B and 7B, random weights, in llama.cpp's Q4_K_M and Q8_0
layouts: the sizes llama.vim's presets run, for measuring load time, memory and speed without the real weights.

    .venv/bin/python benchmarks/shaped_gguf.py --out /work/shaped                     # 1.5b and 7b, both layouts
    .venv/bin/python benchmarks/shaped_gguf.py --out DIR --sizes 1.5b --layouts q8_0 [--tokenizer-from Q.gguf]

Each file is named qwen2.5-coder-<size>-shaped-<layout>.gguf. Shapes (hidden size, layers, heads, KV heads, FFN,
vocabulary, RoPE base, norm epsilon, tied embeddings) are those of the published config.json of each model. The
tokenizer (tokens, merges, token types, special ids, chat template) is copied from a real Qwen2.5 .gguf (by default
the Qwen2.5-Coder-0.5B file that /work/shared/models/get_qwen_coder.sh prints or $REST_LSP_QWEN_GGUF names), the
vocabulary padded with [PAD<i>] tokens to the 7B's embedding rows as llama.cpp's converter pads it.

Which tensor gets which type follows llama.cpp's quantizer (src/llama-quant.cpp) for a Q4_K_M of a Qwen2 model
whose rows all divide by 256: the output projection (or, tied, the token embedding) Q6_K; attn_v and ffn_down Q6_K
in the layers where `use_more_bits` holds (the first and last eighth, every third in between), Q4_K elsewhere;
every other matrix Q4_K; norms and biases F32. Q8_0: every matrix Q8_0.

Weights: Q8_0 blocks come from gguf.quants.quantize of Gaussian rows (std 0.02, as a trained model's); the gguf
package cannot quantize K-quants, so Q4_K and Q6_K blocks are random bits with block scales chosen so the
dequantized weights have about the same spread (checked by tests/bench/test_shaped_gguf.py with
gguf.quants.dequantize). The text such a model writes is noise; its speed and memory are a real model's.
Files are written tensor by tensor (never the whole model in memory). Model files never go into git.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WEIGHT_STD = 0.02
GET_QWEN = Path("/work/shared/models/get_qwen_coder.sh")


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    rope_theta: float = 1e6
    rms_eps: float = 1e-6
    context: int = 32768

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# config.json of Qwen/Qwen2.5-Coder-1.5B and Qwen/Qwen2.5-Coder-7B
SHAPES = {
    "1.5b": Shape("Qwen2.5-Coder-1.5B", hidden=1536, layers=28, heads=12, kv_heads=2, ffn=8960, vocab=151936,
                  tied=True),
    "7b": Shape("Qwen2.5-Coder-7B", hidden=3584, layers=28, heads=28, kv_heads=4, ffn=18944, vocab=152064,
                tied=False),
}
LAYOUTS = {"q4_k_m": 15, "q8_0": 7}  # general.file_type: LLAMA_FTYPE_MOSTLY_Q4_K_M, LLAMA_FTYPE_MOSTLY_Q8_0


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's rule for the layers whose attn_v and ffn_down get more bits in a *_K_M file."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def tensor_plan(shape: Shape, layout: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape: rows x columns, type name) of every tensor, in file order."""
    from gguf import GGMLQuantizationType as T

    def matrix(kind: str, layer: int | None) -> str:
        if layout == "q8_0":
            return T.Q8_0.name
        if kind == "output" or (kind == "token_embd" and shape.tied):
            return T.Q6_K.name
        if kind in ("attn_v", "ffn_down") and use_more_bits(layer, shape.layers):
            return T.Q6_K.name
        return T.Q4_K.name

    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    plan = [("token_embd.weight", (shape.vocab, h), matrix("token_embd", None)),
            ("output_norm.weight", (h,), "F32")]
    if not shape.tied:
        plan.append(("output.weight", (shape.vocab, h), matrix("output", None)))
    for i in range(shape.layers):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (h,), "F32"),
            (b + "attn_q.weight", (h, h), matrix("attn_q", i)), (b + "attn_q.bias", (h,), "F32"),
            (b + "attn_k.weight", (kv, h), matrix("attn_k", i)), (b + "attn_k.bias", (kv,), "F32"),
            (b + "attn_v.weight", (kv, h), matrix("attn_v", i)), (b + "attn_v.bias", (kv,), "F32"),
            (b + "attn_output.weight", (h, h), matrix("attn_output", i)),
            (b + "ffn_norm.weight", (h,), "F32"),
            (b + "ffn_gate.weight", (shape.ffn, h), matrix("ffn_gate", i)),
            (b + "ffn_up.weight", (shape.ffn, h), matrix("ffn_up", i)),
            (b + "ffn_down.weight", (h, shape.ffn), matrix("ffn_down", i)),
        ]
    return plan


# -- random blocks -------------------------------------------------------------------------------------------------

def _with_scale(blocks: np.ndarray, offset: int, scale: np.ndarray) -> np.ndarray:
    blocks[:, offset:offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks


def random_rows(rows: int, cols: int, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """`rows` x `cols` random weights as the bytes of `qtype` blocks (rows x bytes per row), their dequantized values
    spread about WEIGHT_STD around 0."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quantize

    t = GGMLQuantizationType[qtype]
    if t == GGMLQuantizationType.F32:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * WEIGHT_STD)
    if t == GGMLQuantizationType.Q8_0:
        return quantize(rng.standard_normal((rows, cols), dtype=np.float32) * WEIGHT_STD, t)
    block, size = GGML_QUANT_SIZES[t]
    n = rows * cols // block
    blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    jitter = rng.uniform(0.75, 1.25, n).astype(np.float32)
    if t == GGMLQuantizationType.Q4_K:
        # {d, dmin: f16; 12 bytes of 6-bit scales and mins; 128 bytes of 4-bit q}: w = d*sc*q - dmin*m; sc, m
        # uniform on 0..63 and q on 0..15 give std ~271 d; dmin = 7.5 d centres w on 0
        d = jitter * (WEIGHT_STD / 271)
        _with_scale(blocks, 0, d)
        _with_scale(blocks, 2, d * 7.5)
    elif t == GGMLQuantizationType.Q6_K:
        # {128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8 scales, d: f16}: w = d*sc*(q-32); scales kept to
        # -16..15 (std ~9.2), q-32 std ~18.5
        blocks[:, 192:208] = (rng.integers(-16, 16, size=(n, 16), dtype=np.int8)).view(np.uint8)
        _with_scale(blocks, 208, jitter * (WEIGHT_STD / (9.2 * 18.5)))
    else:
        raise ValueError(f"no random blocks for {qtype}")
    return blocks.reshape(rows, cols // block * size)


# -- the tokenizer ----------------------------------------------------------------------------------------------

def real_qwen_gguf() -> Path:
    """The real Qwen2.5-Coder-0.5B .gguf whose tokenizer the shaped files copy."""
    if env := os.environ.get("REST_LSP_QWEN_GGUF"):
        return Path(env)
    if GET_QWEN.is_file():
        out = subprocess.run(["bash", str(GET_QWEN)], capture_output=True, text=True, check=False)
        lines = out.stdout.strip().splitlines()
        if out.returncode == 0 and lines and Path(lines[-1]).is_file():
            return Path(lines[-1])
    raise SystemExit("shaped_gguf: no Qwen2.5 .gguf to copy the tokenizer from; name one with --tokenizer-from.")


def tokenizer_fields(source: Path, vocab: int) -> list[tuple[str, object, object, object]]:
    """(key, value, value type, array element type) of every tokenizer.* field of `source`, the token list padded to
    `vocab` entries ([PAD<i>], UNUSED) as llama.cpp's converter pads a vocabulary smaller than the embedding."""
    from gguf import GGUFReader, GGUFValueType, TokenType

    reader = GGUFReader(str(source))
    fields = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        if key == "tokenizer.ggml.tokens" and len(value) < vocab:
            value = list(value) + [f"[PAD{i}]" for i in range(len(value), vocab)]
        elif key == "tokenizer.ggml.token_type" and len(value) < vocab:
            value = list(value) + [int(TokenType.UNUSED)] * (vocab - len(value))
        elif key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type") and len(value) > vocab:
            raise SystemExit(f"shaped_gguf: {source} holds {len(value)} tokens, more than the {vocab} rows asked for.")
        fields.append((key, value, vtype, sub))
    if not any(k == "tokenizer.ggml.tokens" for k, *_ in fields):
        raise SystemExit(f"shaped_gguf: {source} holds no tokenizer.")
    return fields


# -- the file ----------------------------------------------------------------------------------------------------

def file_name(size: str, layout: str) -> str:
    return f"qwen2.5-coder-{size}-shaped-{layout}.gguf"


def write(path: Path, shape: Shape, layout: str, tokenizer: Path, seed: int = 0, plan=None) -> Path:
    """Write the shaped file at `path` (through a temporary name: a file that exists is whole)."""
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    rng = np.random.default_rng(seed)
    plan = plan or tensor_plan(shape, layout)
    tmp = path.with_name(path.name + ".part")
    w = GGUFWriter(str(tmp), "qwen2")
    w.add_name(f"{shape.name} (shaped, random weights, {layout.upper()} layout)")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_file_type(LAYOUTS[layout])
    w.add_quantization_version(2)
    for key, value, vtype, sub in tokenizer_fields(tokenizer, shape.vocab):
        w.add_key_value(key, value, vtype, sub_type=sub) if sub is not None else w.add_key_value(key, value, vtype)
    for name, dims, qtype in plan:
        t = GGMLQuantizationType[qtype]
        if qtype == "F32":
            w.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        else:
            from gguf import GGML_QUANT_SIZES
            block, size = GGML_QUANT_SIZES[t]
            rows, cols = dims
            w.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), rows * cols // block * size,
                              raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, dims, qtype in plan:
        if qtype == "F32":
            data = np.ones(dims, np.float32) if name.endswith("norm.weight") else \
                rng.standard_normal(dims, dtype=np.float32) * WEIGHT_STD
        else:
            data = random_rows(dims[0], dims[1], qtype, rng)
        w.write_tensor_data(data)
        del data
    w.close()
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the folder to write into (outside git)")
    ap.add_argument("--sizes", default="1.5b,7b", help="comma-separated, from: " + ", ".join(SHAPES))
    ap.add_argument("--layouts", default="q4_k_m,q8_0", help="comma-separated, from: " + ", ".join(LAYOUTS))
    ap.add_argument("--tokenizer-from", type=Path, default=None, help="a real Qwen2.5 .gguf (default: the 0.5B's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="write files that exist again")
    args = ap.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SHAPES] + [s for s in layouts if s not in LAYOUTS]
    if bad:
        ap.error(f"unknown size or layout: {', '.join(bad)}")
    tokenizer = args.tokenizer_from or real_qwen_gguf()
    args.out.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        for layout in layouts:
            path = args.out / file_name(size, layout)
            if path.exists() and not args.force:
                print(f"{path} exists ({path.stat().st_size / 1e9:.2f} GB)")
                continue
            t0 = time.perf_counter()
            write(path, SHAPES[size], layout, tokenizer, args.seed)
            print(f"{path}: {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
