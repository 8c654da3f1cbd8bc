"""A decoding step that costs what the hardware needs, for Llama-family models (Llama, Qwen2, Mistral, SmolLM).

Eager transformers pays per step for a DynamicCache that concatenates every layer's cache (a copy of the whole
cache), a 4-D mask built per call and some fifteen small modules per layer. On a 2-core CPU that overhead is most of
a 135M model's step. This module runs the same weights (the model's own tensors, not copies; q/k/v and gate/up
fused into one matmul each, made once) over a KV cache of its own:

  - pre-allocated per layer, grown in blocks, written in place; a step's accepted rows are gathered into place;
  - attention for a 1-token step needs no mask; a tree step adds its [n, n] mask to the last n key columns only;
    in the q8 and gguf packings each row attends over its own keys alone (row_attention.py: REST = plain there);
  - RoPE angles computed once for every position, as transformers computes them (rotary.py, on one thread);
  - on a CPU the layers run as TorchScript (`LayerStack`): a small model's step is mostly tiny ops, and Python's
    own cost per op, about as much again, goes;
  - on a CPU the matmuls run on a packed copy of the weights (`Matmul`, the packing chosen by engine/runmode.py):
    in fp32 our panel kernel where a compiler builds it (panel_matmul.py: each row's result independent of the
    rows beside it), else oneDNN's layout; fbgemm's fp16 copy in float16-weights; a GGUF's Q8_0 blocks on our
    integer kernel in q8_0 (quant_matmul.py), its Q8_0, Q5_0, Q4_0, Q4_1 and K-quant blocks as they are in gguf.
    MKL behind F.linear runs 2+ rows as a GEMM that costs several times one row's GEMV, which a tree step cannot afford
    (benchmarks/RESULTS.md, "Kernels"). The price: a second copy of the linear weights (the model's own stay for
    the transformers path).

Models it does not know (another attention, a soft-capped head, sliding windows, scaled RoPE) keep the
transformers path: `unsupported(model)` says which. Numerics follow transformers' to rounding (RMSNorm in fp32,
the same rotation bit for bit, the attention scale moved into the weights only where that is exact), so fp32
outputs are token-identical to `model.generate` (the exactness tests).
"""

# no `from __future__ import annotations`: TorchScript reads the modules' attribute annotations as types
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from rest_lsp.engine import rotary
from rest_lsp.engine.cuda_graphs import STEP_BUCKETS, StepGraphs, StepInputs
from rest_lsp.engine.matmuls import Matmul, pick_packing
from rest_lsp.kernels.step_ops import layer_norm_rms

log = logging.getLogger(__name__)

KNOWN_TYPES = {"llama", "qwen2", "mistral"}
CACHE_BLOCK = 512  # cache rows are allocated in blocks: growth copies rarely, and memory follows the sequence


def unsupported(model) -> str | None:
    """Why this model cannot run lean (None: it can)."""
    cfg = model.config
    kind = getattr(cfg, "model_type", None)
    if kind not in KNOWN_TYPES:
        return f"model type {kind!r}"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) != "default":
        return "scaled RoPE"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", kind == "mistral"):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return "an MLP other than SiLU-gated"
    if getattr(cfg, "attention_bias", False) and kind == "llama":
        return "biased attention output"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "tensor-parallel pretraining slices"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or model.get_output_embeddings() is None:
        return "no decoder layers or LM head where Llama keeps them"
    return None


def query_scale(head_dim: int) -> float | None:
    """Attention's 1/sqrt(D) when it is a power of two (D = 4, 16, 64, 256...): multiplying the query weights by it
    is exact, and so scores come out bit for bit as transformers' scaled ones; None otherwise."""
    scale = head_dim**-0.5
    return scale if math.frexp(scale)[0] == 0.5 else None


def _rope_theta(cfg) -> float:
    rope = getattr(cfg, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


@dataclass(frozen=True)
class Norm:
    """An RMSNorm's weight, and in fp32 the same weight twice (the layer-norm route of `rms_norm`) and whether the
    native op runs it (step_ops.rms_norm: on a CPU where the step's native ops are had)."""

    weight: torch.Tensor  # [H], the model's own tensor
    doubled: torch.Tensor | None  # [2H]
    native: bool = False

    @classmethod
    def of(cls, weight: torch.Tensor) -> "Norm":
        fp32 = weight.dtype == torch.float32
        doubled = torch.cat([weight.detach(), weight.detach()]) if fp32 else None
        return cls(weight, doubled, fp32 and weight.device.type == "cpu" and _native_step_ops())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, doubled: Optional[torch.Tensor], eps: float,
             native: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim of x [n, H], as transformers computes it (to rounding)."""
    if native and doubled is not None:  # one native call for a row's few ops (step_ops.rms_norm)
        return torch.ops.rest_lsp_step.rms_norm(x.contiguous(), weight, doubled, eps)
    if doubled is not None:  # fp32 without the native op: one layer norm (61 calls a step)
        return layer_norm_rms(x, doubled, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' x * cos + rotate_half(x) * sin, bit for bit: rotate_half(x) * sin is the two halves swapped
    (one roll) times sin with its first half negated (`sin` here)."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, -1) * sin


def _native_step_ops() -> bool:
    """Whether the step's kernel ops (rest_lsp/kernels/step_ops.py) are native here, registered on first ask."""
    from rest_lsp.kernels import step_ops

    return step_ops.ready()


class _Layer(torch.nn.Module):
    """One decoder layer over one layer of a KVCache (a module so that the stack can run as TorchScript)."""

    in_doubled: Optional[torch.Tensor]
    post_doubled: Optional[torch.Tensor]
    in_native: bool
    post_native: bool

    def __init__(self, norm_in: Norm, qkv: Matmul, o: Matmul, norm_post: Norm, gate_up: Matmul, down: Matmul,
                 source: int, shape: tuple[int, int, int], eps: float, score_scale: float, row_exact: bool = False):
        super().__init__()
        self.in_weight, self.in_doubled, self.in_native = norm_in.weight, norm_in.doubled, norm_in.native
        self.qkv = qkv  # [(Hq + 2 Hkv) D, H], the query rows scaled by 1/sqrt(D) when that is exact
        self.o = o  # [H, Hq D]
        self.post_weight, self.post_doubled, self.post_native = norm_post.weight, norm_post.doubled, norm_post.native
        self.gate_up = gate_up  # [2 I, H]
        self.down = down  # [H, I]
        self.source = source  # where the model's q/k/v weights are (fused): built from them while they stay there
        self.heads, self.kv_heads, self.head_dim = shape
        self.eps = eps
        self.score_scale = score_scale  # 1.0 where the query weights took the attention scale
        # attention on row_attention's kernel: each row over exactly its own keys, the same bits in any step
        self.row_exact = row_exact
        self.no_mask = torch.empty(0)  # step_ops' form of no mask
        self.no_rows = torch.empty(0, dtype=torch.long)  # and of no cache rows (rows past on)
        # the rotation and cache writes in one native op (step_ops.rope_cache, the same bits) on a CPU in fp32
        weight = norm_in.weight
        self.fused_rope = weight.dtype == torch.float32 and weight.device.type == "cpu" and _native_step_ops()
        if row_exact:
            _native_step_ops()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, rows: Optional[torch.Tensor], past: int, keys: int,
                mask: Optional[torch.Tensor], mask_from: int) -> torch.Tensor:
        """x [n, H] (updated in place and returned); cos, sin [1, n, D]; k_cache, v_cache [Hkv, capacity, D]. The n
        tokens' keys and values go into cache rows `rows` [n] (None: past..past+n), attention reads rows [:keys],
        and `mask` [n, keys - mask_from] is added to the scores of the key columns from `mask_from` on."""
        n = x.shape[0]
        Hq, Hkv, D = self.heads, self.kv_heads, self.head_dim
        h = rms_norm(x, self.in_weight, self.in_doubled, self.eps, self.in_native)
        qkv = self.qkv(h)  # [n, (Hq + 2 Hkv) D]
        if self.fused_rope:  # what the torch ops below do, in one call
            q = torch.ops.rest_lsp_step.rope_cache(qkv.contiguous(), cos, sin, k_cache, v_cache, past,
                                                   self.no_rows if rows is None else rows, Hq)
        else:
            heads = qkv.view(n, Hq + 2 * Hkv, D).transpose(0, 1)  # [Hq + 2 Hkv, n, D]
            qk = rotate(heads[: Hq + Hkv], cos, sin)  # q and k heads in one rotation (fewer small ops)
            q, k = qk[:Hq], qk[Hq:]  # [Hq, n, D], [Hkv, n, D]
            if rows is None:
                k_cache[:, past : past + n] = k
                v_cache[:, past : past + n] = heads[Hq + Hkv :]
            else:
                k_cache.index_copy_(1, rows, k)
                v_cache.index_copy_(1, rows, heads[Hq + Hkv :])
        if self.row_exact:  # the quantized modes: a row's attention the same bits alone or in a tree (REST = plain)
            out = torch.ops.rest_lsp_step.row_attn(q.contiguous(), k_cache, v_cache, keys,
                                                   self.no_mask if mask is None else mask, mask_from,
                                                   self.score_scale)
        else:
            out = self._attention(q, k_cache, v_cache, keys, mask, mask_from)
        x += self.o(out)  # x is the pass's own tensor (the embedding lookup copied it)
        h = rms_norm(x, self.post_weight, self.post_doubled, self.eps, self.post_native)
        gate_up = self.gate_up(h)  # [n, 2 I]
        inner = gate_up.shape[1] // 2
        x += self.down(F.silu(gate_up[:, :inner]) * gate_up[:, inner:])
        return x

    def _attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, keys: int,
                   mask: Optional[torch.Tensor], mask_from: int) -> torch.Tensor:
        """Attention on torch's ops: q [Hq, n, D] over cache rows [:keys] -> [n, Hq D]."""
        Hq, n, D = q.shape[0], q.shape[1], q.shape[2]
        Hkv = self.kv_heads
        group = Hq // Hkv
        K, V = k_cache[:, :keys], v_cache[:, :keys]  # [Hkv, S, D]
        # query heads grouped under their key head: no copy of the cache per query head
        q = q.reshape(Hkv, group * n, D)
        scores = torch.bmm(q, K.transpose(1, 2))  # [Hkv, group n, S]
        if self.score_scale != 1.0:
            scores *= self.score_scale
        if mask is not None:
            scores.view(Hkv, group, n, keys)[:, :, :, mask_from:].add_(mask)
        if scores.dtype == torch.float32:
            probs = torch.softmax(scores, dim=-1)
        else:
            probs = torch.softmax(scores.float(), dim=-1).to(scores.dtype)
        out = torch.bmm(probs, V)  # [Hkv, group n, D]
        out = out.view(Hq, n, D).transpose(0, 1).reshape(n, Hq * D)  # [n, Hq D]
        return out


class LayerStack(torch.nn.Module):
    """Every decoder layer and the final norm: the hidden states [n, H] after the final norm.

    On a CPU it runs as TorchScript: a step of a small model is some 25 small ops per layer, and eager mode pays
    about as much again in Python per op (docs/how-it-works.md, "The decoding step"); the same ops and the same
    results bit for bit."""

    norm_doubled: Optional[torch.Tensor]
    norm_native: bool

    def __init__(self, layers: list[_Layer], norm: Norm, eps: float):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.norm_weight, self.norm_doubled, self.norm_native = norm.weight, norm.doubled, norm.native
        self.eps = eps

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                rows: Optional[torch.Tensor], past: int, keys: int, mask: Optional[torch.Tensor],
                mask_from: int) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, k[i], v[i], rows, past, keys, mask, mask_from)
        return rms_norm(x, self.norm_weight, self.norm_doubled, self.eps, self.norm_native)  # [n, H]


def scripted(stack: LayerStack) -> torch.jit.ScriptModule | None:
    """The stack as TorchScript, run without the profiling executor's re-optimisations (the same ops as eager);
    None where this torch cannot script it (then the stack runs eagerly)."""
    try:
        with warnings.catch_warnings():
            # torch.jit is deprecated for torch.compile, which did not pay on a CPU (docs/LOG.md); it still runs here
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(stack)
    except Exception as exc:  # noqa: BLE001 - any failure to script leaves the eager stack, which always works
        log.warning("The decoder layers run in eager mode: TorchScript could not compile them (%s).",
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        return None


def _fused(linears, name: str) -> torch.Tensor:
    """The `name` tensors of `linears` concatenated along dim 0; each module's parameter becomes a view into it."""
    whole = torch.cat([getattr(m, name).detach() for m in linears]).contiguous()
    start = 0
    for m in linears:
        rows = getattr(m, name).shape[0]
        setattr(m, name, torch.nn.Parameter(whole[start : start + rows], requires_grad=False))
        start += rows
    return whole


class KVCache:
    """Keys and values of one sequence, every layer: [L, Hkv, capacity, D] each, the first `length` rows valid."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.shape = (layers, kv_heads, 0, head_dim)
        self.dtype, self.device = dtype, device
        self.k = torch.empty(self.shape, dtype=dtype, device=device)
        self.v = torch.empty(self.shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def reserve(self, rows: int) -> None:
        """Room for `rows` rows; growing copies the valid rows once per block."""
        if rows <= self.capacity:
            return
        cap = -(-rows // CACHE_BLOCK) * CACHE_BLOCK
        L, Hkv, _, D = self.shape
        # zeros, not empty: a static step reads every row (weighted 0 beyond the length), and 0 x NaN is NaN
        k = torch.zeros((L, Hkv, cap, D), dtype=self.dtype, device=self.device)
        v = torch.zeros((L, Hkv, cap, D), dtype=self.dtype, device=self.device)
        k[:, :, : self.length] = self.k[:, :, : self.length]
        v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def keep_rows(self, base: int, rows: list[int]) -> None:
        """Rows base+rows[i] move to base+i (the accepted path of a tree step); everything after is dropped."""
        if rows != list(range(len(rows))):
            src = torch.tensor(rows, device=self.device) + base
            end = base + len(rows)
            self.k[:, :, base:end] = self.k[:, :, src]  # [L, Hkv, len(rows), D]
            self.v[:, :, base:end] = self.v[:, :, src]
        self.length = base + len(rows)


class LeanLlama:
    """The forward pass of a Llama-family model over a KVCache; returns hidden states (the head is the caller's)."""

    def __init__(self, model, max_positions: int, pack: str | bool | None = None, static: bool | None = None,
                 script: bool | None = None):
        cfg = model.config
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.packing = pick_packing(pack, self.dtype, self.device)
        # Q8_0 weights keep their blocks as they are: attention takes the scale (in fp16 a scaled block scale can round)
        scale = query_scale(self.head_dim) if self.packing not in ("q8", "gguf") else None
        # the attention scale, where the query weights could not take it exactly
        self.score_scale = 1.0 if scale is not None else self.head_dim**-0.5
        # Verification steps run static (see `step`) on a GPU, where launches cost more than the arithmetic; on a
        # CPU the eager step reads only the valid rows, which is cheaper.
        self.static = self.device.type == "cuda" if static is None else static
        # The layers run as TorchScript on a CPU (Python costs as much as the small ops there); a GPU replays
        # captured graphs of the eager stack instead.
        script = self.device.type == "cpu" if script is None else script
        # fused (and packed) once per model and shared by every LeanLlama over it (each Decoder builds one)
        key = f"_lean_{self.packing}"
        parts = getattr(model, "lean_parts", None)
        if parts is not None:  # a .gguf loaded from its blocks (gguf_direct): its layers and head are built already
            self.embed, norm, built = parts(self.packing)  # embed: ids [n] -> rows [n, H] on indexing
            self.norm = Norm.of(norm)
        else:
            self.embed = model.get_input_embeddings().weight  # [V, H]
            self.norm = Norm.of(model.model.norm.weight)
            built = self._built(model, key, scale)
        self.layers = built[0]
        self.head = built[1]  # logits [n, V] from final hidden states [n, H]
        stacks = built[2]
        if script not in stacks:
            stack = LayerStack(self.layers, self.norm, self.eps)
            stacks[script] = (scripted(stack) if script else None) or stack
        self.stack = stacks[script]
        self.theta, self.max_positions = _rope_theta(cfg), max_positions
        self._causal: torch.Tensor | None = None  # [n, n] additive causal mask, kept for the next prefill chunk
        self.cos, self.sin = self._rope_table(min(max_positions, 2 * CACHE_BLOCK))  # [P, D] each, grown on demand
        self.graphs = StepGraphs(self) if self.static and self.device.type == "cuda" else None
        if self.static:  # a captured graph reads the table where it was: allocate it whole, once
            self.cos, self.sin = self._rope_table(max_positions)

    def _built(self, model, key: str, scale: float | None) -> tuple:
        """(layers, head, {script: stack}) of a transformers model: fused and packed once, kept on the model."""
        built = model.__dict__.get(key)  # (layers, head, {script: stack})
        q = model.model.layers[0].self_attn.q_proj.weight
        if built is None or built[0][0].source != q.data_ptr():  # never built, or moved/cast since
            head = model.get_output_embeddings()
            shape = (self.heads, self.kv_heads, self.head_dim)
            weights = self._gguf_weights(model) if self.packing == "gguf" else None
            layers = [self._fuse(layer, self.packing, shape, scale, self.eps, self.score_scale, weights, i)
                      for i, layer in enumerate(model.model.layers)]
            head_blocks = None if weights is None else [
                (head.weight.shape[0], weights.blocks(weights.head_name(), head.weight))]
            built = model.__dict__[key] = (layers, Matmul.of(head.weight, head.bias, self.packing, head_blocks), {})
            if weights is not None:
                weights.report()
        return built

    @property
    def scripted(self) -> bool:
        return isinstance(self.stack, torch.jit.ScriptModule)

    @staticmethod
    def _gguf_weights(model):
        """The blocks of the .gguf the model was loaded from (gguf_blocks), for the gguf packing."""
        from rest_lsp.engine import gguf_blocks

        path = gguf_blocks.source(model)
        if path is None:
            raise ValueError("the gguf packing runs the blocks of a .gguf file, and this model was not loaded "
                             "from one")
        return gguf_blocks.GgufWeights(path)

    @staticmethod
    @torch.no_grad()
    def _fuse(layer, pack: str, shape: tuple[int, int, int], scale: float | None, eps: float,
              score_scale: float, weights=None, index: int = 0) -> _Layer:
        """One matmul for q, k and v, one for gate and up. The modules' own weights become views into the fused
        tensors, so the model holds its weights once and the transformers path keeps working on them. With a
        `scale`, the matmul's query rows are a scaled copy: attention then needs no scaling op per layer."""
        from rest_lsp.kernels import row_attention

        at, mlp = layer.self_attn, layer.mlp
        q_rows = shape[0] * shape[2]
        fused = getattr(layer, "_lean_fused", None)
        if fused is None or fused[0].data_ptr() != at.q_proj.weight.data_ptr():
            qkv = _fused([at.q_proj, at.k_proj, at.v_proj], "weight")
            bias = _fused([at.q_proj, at.k_proj, at.v_proj], "bias") if at.q_proj.bias is not None else None
            fused = layer.__dict__["_lean_fused"] = (qkv, bias, _fused([mlp.gate_proj, mlp.up_proj], "weight"))
        qkv, bias, gate_up = fused
        if scale is not None:
            qkv, bias = qkv.clone(), None if bias is None else bias.clone()
            qkv[:q_rows] *= scale
            if bias is not None:
                bias[:q_rows] *= scale

        def blocks(*parts):  # the gguf packing: each module's rows, with the file's blocks where they are kept
            if weights is None:
                return None
            return [(m.weight.shape[0], weights.blocks(f"blk.{index}.{name}.weight", m.weight)) for name, m in parts]

        return _Layer(
            norm_in=Norm.of(layer.input_layernorm.weight),
            qkv=Matmul.of(qkv, bias, pack,
                          blocks(("attn_q", at.q_proj), ("attn_k", at.k_proj), ("attn_v", at.v_proj))),
            o=Matmul.of(at.o_proj.weight, None, pack, blocks(("attn_output", at.o_proj))),
            norm_post=Norm.of(layer.post_attention_layernorm.weight),
            gate_up=Matmul.of(gate_up, None, pack, blocks(("ffn_gate", mlp.gate_proj), ("ffn_up", mlp.up_proj))),
            down=Matmul.of(mlp.down_proj.weight, None, pack, blocks(("ffn_down", mlp.down_proj))),
            source=fused[0].data_ptr(),
            shape=shape,
            eps=eps,
            score_scale=score_scale,
            row_exact=pack in ("q8", "gguf") and row_attention.available(),
        )

    def _rope_table(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary.table(self.theta, self.head_dim, positions, self.dtype, self.device)  # [P, D] each

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    def _rms(self, x: torch.Tensor, norm: Norm) -> torch.Tensor:
        return rms_norm(x, norm.weight, norm.doubled, self.eps, norm.native)

    _rotate = staticmethod(rotate)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids, positions [n]; tree_mask [n, n] additive (None: causal among the n new tokens). Appends the n
        tokens' keys and values at cache.length and returns the last hidden states [n, H] after the final norm."""
        n = ids.shape[0]
        past = cache.length
        total = past + n
        cache.reserve(total)
        if total > self.cos.shape[0]:
            self.cos, self.sin = self._rope_table(max(total, min(self.max_positions, 2 * self.cos.shape[0])))
        mask = self._mask(n, tree_mask)  # [n, n] over the new tokens only (every new token sees the whole cache)
        hidden = self._layers(ids, positions, cache, slice(past, total), total, mask, past)
        cache.length = total
        return hidden

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, rows, keys: int,
                mask: torch.Tensor | None, mask_from: int) -> torch.Tensor:
        """The decoder layers over n new tokens: their keys and values go into cache rows `rows` (a slice, or a
        [n] index tensor), attention reads rows [:keys], and `mask` [n, keys - mask_from] is added to the scores
        of the key columns from `mask_from` on. Returns the hidden states [n, H] after the final norm."""
        cos, sin = self.cos[positions][None], self.sin[positions][None]  # [1, n, D]
        x = self.embed[ids]  # [n, H]
        past, slots = (rows.start, None) if isinstance(rows, slice) else (0, rows)
        # scripted, the ops as written: no re-optimisation per new shape (no effect on the Python stack)
        with torch.jit.optimized_execution(False):
            return self.stack(x, cos, sin, cache.k, cache.v, slots, past, keys, mask, mask_from)

    # -- the static step -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
             tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """A verification step: what `forward` computes, as a static step when `self.static` (the rows padded to
        a bucket of STEP_BUCKETS, attention over the cache's whole capacity), which a GPU replays from a CUDA
        graph: one launch instead of some twenty kernels per layer, each of which eager mode pays in Python."""
        n = ids.shape[0]
        bucket = next((b for b in STEP_BUCKETS if b >= n), None)
        if not self.static or bucket is None:
            return self.forward(ids, positions, cache, tree_mask)
        past = cache.length
        cache.reserve(past + bucket)  # the padding rows are written too, past the length, and weighted 0 later
        mask = self._mask(n, tree_mask)

        def fill(inputs: StepInputs) -> None:
            inputs.fill(ids, positions, past, mask)

        if self.graphs is not None:
            hidden = self.graphs.replay(cache, bucket, fill)[:n].clone()  # the graph's output is overwritten next step
        else:
            inputs = StepInputs.empty(bucket, cache.capacity, self.dtype, self.device)
            fill(inputs)
            hidden = self._static(inputs, cache)[:n]
        cache.length = past + n
        return hidden

    def _static(self, inputs: "StepInputs", cache: KVCache) -> torch.Tensor:
        """The static step: every shape fixed by the bucket and the cache's capacity, no host-side decision."""
        return self._layers(inputs.ids, inputs.positions, cache, inputs.slots, cache.capacity, inputs.mask, 0)

    def _mask(self, n: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        if n == 1:
            return None  # one query sees the whole cache
        if tree_mask is not None:
            return tree_mask
        if self._causal is None or self._causal.shape[0] < n:  # prefill chunks: one buffer, sliced per chunk
            self._causal = torch.full((n, n), torch.finfo(self.dtype).min, dtype=self.dtype,
                                      device=self.device).triu_(1)
        return self._causal[:n, :n]
