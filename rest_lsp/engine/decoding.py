"""REST decoding: draft a tree from retrieval, verify it in one forward pass, keep what the model agrees with.

Invariant between steps: the KV cache holds every token of the sequence but the last one. A step feeds that last
token (the tree's root) together with the draft tree; the root's logits judge the first draft level, each draft
node's logits judge its children. With an empty tree a step is exactly one plain decoding step.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from transformers import DynamicCache

from rest_lsp.drafting.acceptance import AcceptanceModel
from rest_lsp.engine import mode_choice
from rest_lsp.cache_dir import read_bytes
from rest_lsp.engine.calibration import (Calibration, cache_file, calibrate, calibration_key, measure_head,
                                         write_json)
from rest_lsp.drafting.draft_tree import (DraftTree, build_tree, cost_at, tree_attention_mask,
                                          tree_position_ids, under_chain)
from rest_lsp.drafting.drafts import ContextLookup, DraftMix, DraftSource, Proposal, mix_of, propose
from rest_lsp.engine.lean_llama import KVCache, LeanLlama, unsupported
from rest_lsp.engine.model import LoadedModel, ModelLoadError, cache_root
from rest_lsp.engine.runmode import run_mode
from rest_lsp.engine import step_cost
from rest_lsp.engine.draft_gate import COLD, COPYING, FULL, LITE, DraftGate
from rest_lsp.engine.step_cost import StepCosts, seed_from_two
from rest_lsp.engine.step_threads import StepThreads
from rest_lsp.kernels import logit_scan

log = logging.getLogger(__name__)


@dataclass
class DecodeConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    # Most draft nodes per step; GPUs can afford 64.
    budget: int = 16
    seed: int | None = None
    # Cut each tree to the size that pays for itself on the decoder's step-cost curve.
    fit_to_cost: bool = True


@dataclass
class DecodeResult:
    tokens: list[int]
    steps: int  # forward passes after the prefill
    prefill_ms: float
    decode_ms: float
    finish: str  # "length" | "eos" | "stopped"
    prefill_tokens: int = 0  # tokens the prefill actually ran (less than the prompt when the cache was reused)
    draft_ms: float = 0.0  # of decode_ms: retrieval and tree building, the price of drafting

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / self.steps if self.steps else 0.0

    @property
    def ms_per_token(self) -> float:
        return self.decode_ms / len(self.tokens) if self.tokens else 0.0


@dataclass
class Timers:
    """Where one generate() call's time goes (perf_counter seconds)."""

    start: float
    prefill_end: float = 0.0
    end: float = 0.0
    draft: float = 0.0  # of the decoding: asking the sources and building trees

    def prefilled(self, device: torch.device) -> None:
        sync_device(device)
        self.prefill_end = self.end = time.perf_counter()

    def decoded(self, device: torch.device) -> None:
        sync_device(device)
        self.end = time.perf_counter()

    def result(self, tokens: list[int], steps: int, finish: str, prefill_tokens: int) -> DecodeResult:
        return DecodeResult(tokens=tokens, steps=steps, prefill_ms=(self.prefill_end - self.start) * 1e3,
                            decode_ms=(self.end - self.prefill_end) * 1e3, finish=finish,
                            prefill_tokens=prefill_tokens, draft_ms=self.draft * 1e3)


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _copied(tree: DraftTree, path: list[int], accepted_drafts: int) -> bool:
    """Whether the deepest of a step's `accepted_drafts` accepted drafts (path[accepted_drafts]) is one the context
    source proposed: the output is copying the prompt's text."""
    return accepted_drafts > 0 and any(key[0] == ContextLookup.name for key, _ in tree.votes[path[accepted_drafts]])


def _memo(logits_at: Callable[[int], torch.Tensor]) -> Callable[[int], torch.Tensor]:
    """Logits at a node computed once, however often the walk and the learners ask."""
    done: dict[int, torch.Tensor] = {}

    def at(node: int) -> torch.Tensor:
        if node not in done:
            done[node] = logits_at(node)
        return done[node]

    return at


def _restore_on_error(method):
    """A pass that fails part-way (an out-of-memory in a middle layer, say) leaves cache layers of unequal length:
    cut every layer back to the tokens the decoder knows it holds (or start over), so the next call is exact."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self._restore()
            raise

    return wrapper


def _sliding_window(config) -> tuple[int | None, list[str] | None]:
    """(window, per-layer attention types or None when every layer has the window); (None, None): no window."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None and not set(types) <= {"full_attention", "sliding_attention"}:
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        raise ModelLoadError(f"rest-lsp cannot decode models with {', '.join(unknown)} layers; pick another model.")
    if not window or (types is not None and "sliding_attention" not in types):
        return None, None
    return int(window), (list(types) if types is not None else None)


def _longrope_switch(config) -> int | None:
    """The position from which a long-RoPE model (Phi-3) rotates with its long factors, else None."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type")) != "longrope":
        return None
    switch = rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
    return int(switch) if switch else None


def _outside_window(mask: torch.Tensor, positions: torch.Tensor, past: int, window: int) -> torch.Tensor:
    """`mask` [1, 1, n, past+n] with every key `window` or more positions behind its query masked out."""
    keys = torch.cat([torch.arange(past, device=positions.device), positions])  # [past+n]
    far = positions[:, None] - keys[None, :] >= window  # [n, past+n]
    return mask.masked_fill(far[None, None], torch.finfo(mask.dtype).min)


def _cache_keyword(model) -> str:
    """The forward argument that takes a cache: `cache` in recent transformers (5.24), `past_key_values` in earlier
    5.x releases (5.17), which recent ones still accept with a warning. A model ignores the other name silently."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cached_length(cache: DynamicCache | KVCache) -> int:
    return cache.length if isinstance(cache, KVCache) else cache.get_seq_length()


def below(tree: DraftTree, node: int, rows: int, skip) -> list[int]:
    """Up to `rows` nodes under `node` (not in `skip`), likeliest first."""
    if rows <= 0 or len(tree.shares) != len(tree):
        return []
    under = [False] * len(tree)
    under[node] = True
    found = []
    for i in range(node + 1, len(tree)):  # parents come first
        if under[tree.parents[i]]:
            under[i] = True
            if i not in skip:
                found.append(i)
    return sorted(found, key=lambda i: -tree.shares[i])[:rows]


def head_rows(tree: DraftTree, cost: Sequence[float], largest: int, miss_rows: int) -> list[int]:
    """The nodes a step's first head call takes, root first: the k likeliest (k <= `largest`) whose expected cost
    is least, cost(k) + P(the walk leaves them) * cost(miss_rows), `cost` the head's cost by rows over one row.

    The walk goes into at most one child of each node it reaches, so it leaves the k likeliest through exactly one
    child outside them, or not at all: that chance is the sum of those children's shares (each node's at most its
    own: siblings are calibrated one by one, so theirs can add up to more). Where rows are cheap
    (AVX-512 tiles, a GPU) the likely ones come in one call; where each costs more (AVX2), a few, and a walk that
    leaves them brings its node and the likeliest below it. Without shares: the root alone."""
    if len(tree) == 1 or len(tree.shares) != len(tree):
        return [0]
    # a child is never likelier than its parent and comes after it on a tie: every prefix holds its nodes' parents
    order = sorted(range(len(tree)), key=lambda i: (-tree.shares[i], i))[: max(1, largest)]
    kids = tree.children()
    miss = cost_at(cost, miss_rows)
    outside: dict[int, float] = {}  # per node taken: the shares of its children not taken (yet)
    best, best_k = math.inf, 1
    for k, node in enumerate(order, start=1):
        if node:
            outside[tree.parents[node]] -= tree.shares[node]
        outside[node] = sum(tree.shares[c] for c in kids[node].values())
        expected = cost_at(cost, k) + sum(min(tree.shares[v], rest) for v, rest in outside.items()) * miss
        if expected < best - 1e-9:
            best, best_k = expected, k
    return order[:best_k]


SUCCESSORS = 8  # the model's likeliest next tokens kept per visited node (Token Recycling)
TOPK_BLOCK = 128  # logits per block in `top_successors`' first pass


LITE_SOURCES = frozenset({ContextLookup.name})  # what a lite step asks (draft_gate: the cheapest source)
# A step after one that accepted nothing, where such steps do not draft, is "copying" (draft_gate) where the
# context's match is at least this long: its last tokens stand in the prompt already, and the model is likely
# writing them again (acceptance.LONG_MATCH's bucket, 5-8 tokens). Otherwise a plain step never leads into copying.
# Where steps after a miss draft, they keep their kind: another source may know the text (the model's own output).
ECHO_MATCH = 5


def _asked(drafts: DraftSource, seq: Sequence[int], lite: DraftMix | None = None) -> list[Proposal]:
    """The proposals after `seq` of every source of `drafts`, or with `lite` (its mix) of LITE_SOURCES alone."""
    if lite is None:
        return propose(drafts, seq)
    lite.only = LITE_SOURCES
    try:
        return propose(drafts, seq)
    finally:
        lite.only = None


def top_successors(logits: torch.Tensor, k: int = SUCCESSORS) -> tuple[list[list[int]], list[list[float]]]:
    """Per row of logits [n, V]: its k likeliest tokens, likeliest first, and their softmax probabilities.

    The same set as topk(softmax(row), k) (ties aside), without a full softmax or a top-k over V: the k largest lie
    in the k blocks of TOPK_BLOCK with the largest maxima, so a max per block, a top-k over those maxima and one over
    k blocks find them; the normaliser is one fused log-sum-exp. Rule: fp32 in, probabilities as softmax's up to
    rounding."""
    n, v = logits.shape
    if v <= 4 * k * TOPK_BLOCK:  # a small vocabulary: one top-k is as cheap
        top = torch.topk(logits, min(k, v), dim=-1)  # [n, k]
        ids, values = top.indices, top.values
    else:
        pad = -v % TOPK_BLOCK  # a copy only where the last block needs filling
        padded = torch.nn.functional.pad(logits, (0, pad), value=float("-inf")) if pad else logits
        blocks = padded.reshape(n, -1, TOPK_BLOCK)  # [n, B, G]
        best = torch.topk(blocks.amax(dim=-1), k, dim=-1).indices  # [n, k] blocks holding the k largest
        candidates = torch.gather(blocks, 1, best[:, :, None].expand(-1, -1, TOPK_BLOCK)).view(n, -1)  # [n, k*G]
        top = torch.topk(candidates, k, dim=-1)  # [n, k]
        ids = best.gather(1, top.indices // TOPK_BLOCK) * TOPK_BLOCK + top.indices % TOPK_BLOCK
        values = top.values
    return ids.tolist(), (values - torch.logsumexp(logits, dim=-1, keepdim=True)).exp().tolist()  # [n, k] each


def _kept_learned(path: Path, key: dict) -> dict | None:
    """What an earlier decoder of this `key` learned and kept in `path` (save_learned); None when there is none, or
    it is unreadable or another key's (then with one log line)."""
    try:
        data = json.loads(read_bytes(path))  # only a file of this user's alone (cache_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        log.warning("The learned step cost %s is not used (%s); the steps run teach it again.", path, err)
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        log.warning("The learned step cost %s is another machine's, model's or mode's; the steps run teach it again.",
                    path)
        return None
    return data


def _learned_costs(path: Path, kept: dict) -> list[float] | None:
    """The step-cost curve in what was kept (None when it holds none; a damaged one with one log line)."""
    if "curve" not in kept:
        return None
    curve = step_cost.from_learned_json(kept)
    if curve is None:
        log.warning("The learned step cost %s is not a curve; the steps run teach it again.", path)
    return curve


def _mode_choice_steps(name: str, device: torch.device, mode: str, cache_dir: Path) -> tuple[float, float] | None:
    """(ms of a plain step, ms of a mode_choice.TREE-token step) of `mode` that the mode choice measured for this
    model on this machine and kept, else None (not a .gguf, never chosen here, or its timings were noisy)."""
    from rest_lsp.engine.model_source import resolve
    from rest_lsp.engine.runmode import decide

    try:
        folder, gguf = resolve(name)
        if gguf is None:
            return None
        names = mode_choice.candidates(decide(device.type, None, gguf=True), True)
        key = mode_choice.choice_key(Path(folder) / gguf, device, names)
        choice = mode_choice.read_cached(mode_choice.cache_file(cache_dir, key), key)
    except (OSError, ModelLoadError):
        return None
    timing = choice.timings.get(mode) if choice is not None else None
    return (timing.step_ms, timing.tree_ms) if timing is not None else None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# Tokens per prefill pass: a long prompt can be given up between passes (a request cancelled meanwhile).
PREFILL_CHUNK = 256
# An uncached prompt tail up to this long (what an editor's keystrokes or a new line add to the last request's
# prompt) is computed in the first verification step's pass instead of a prefill pass of its own: one pass less
# per request, and a multi-row pass costs far less than two (lean engine).
CHAIN_TAIL = 64
# A request's first tree is cut with its nodes' shares weighed at this much: over a cold replay's first steps their
# promises came true half as often as the calibration says (it pools every step; most are later ones), and requests
# whose first step drafted nothing took as many steps in all (docs/LOG.md, 2026-12-07 (evening)). Strong drafts (the
# model's own output at the same place, a workspace line under a FIM cursor) still pay at half.
FIRST_TREE_TRUST = 0.5
PASSES_KEPT = 32  # decoding passes whose times say how long the shortest takes on this machine now
LEARNED_PREFIX = "learned-"  # the calibration folder's files of step-cost curves learned from served steps


@dataclass(frozen=True)
class CacheState:
    """A decoder's cache taken out of it (`Decoder.detach_cache`): opaque to its keeper, put back with
    `attach_cache`. `fields` holds whatever `reset()` clears, so a state always comes back whole."""

    fields: tuple
    tokens: tuple[int, ...]  # the tokens whose KV it holds, in order
    nbytes: int


def _tensor_bytes(obj, seen: set[int] | None = None, depth: int = 4) -> int:
    """Bytes of the tensor storage reachable from `obj` (a cache object of any shape: layers, lists, dicts), each
    storage once: a cropped layer is a view that still holds its whole storage."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if depth == 0 or obj is None or isinstance(obj, (int, float, str, bool)):
        return 0
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return 0
    return sum(_tensor_bytes(item, seen, depth - 1) for item in items)


class Decoder:
    """Runs one model; keeps the KV cache of its last sequence so the next prompt pays only for what changed."""

    def __init__(self, loaded: LoadedModel, acceptance: AcceptanceModel | None = None, lean: bool = True,
                 static: bool | None = None, pack: str | None = None):
        self.model = loaded.model
        self.device = loaded.device
        self.dtype = next(loaded.model.parameters()).dtype
        self.eos = loaded.eos_token_ids
        self.max_context = loaded.max_context
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        # Sliding-window layers: the cache keeps every key (full layers) and the tree mask applies the window,
        # because a windowed cache layer can neither be cropped past the window nor take a tree mask.
        self.window, self.layer_types = _sliding_window(self.model.config)
        # Long RoPE switches every key's rotation once a pass reaches this position: the cache is recomputed
        # then (as transformers' generate does) and no tree straddles it.
        self.rope_switch = _longrope_switch(self.model.config)
        self._rope_long: bool | None = None  # the rotation of the cached keys
        self._cache: DynamicCache | None = None
        self._cached: list[int] = []  # the tokens whose KV the cache holds, in order
        # a .gguf loaded from its blocks (gguf_direct) has no transformers forward: the lean engine or nothing
        lean_only = getattr(self.model, "lean_only", False)
        if lean_only and not lean:
            raise ModelLoadError(f"'{loaded.name}' was loaded from its .gguf blocks, which only rest-lsp's lean "
                                 "engine runs; load it with --dtype float32 for transformers' path.")
        self.body, self.head = (None, None) if lean_only else self._split_head()
        self._cache_kw = _cache_keyword(self.model)
        # Llama-family models run on our own forward and KV cache (a flat, cheap step); others on transformers'.
        self.lean_unsupported = (
            None if lean_only
            else "turned off" if not lean
            else "the LM head does not split off" if self.head is None
            else "sliding windows or long RoPE" if self.window is not None or self.rope_switch is not None
            else unsupported(self.model)
        )
        # static: verification steps padded to fixed shapes, replayed from CUDA graphs on a GPU (None: on a GPU);
        # pack: the weights' packing (None: the loaded model's, else the engine's own choice)
        pack = pack if pack is not None else loaded.packing
        if pack == "fp16" and self.lean_unsupported is not None:
            log.warning("float16-weights runs on the lean engine only (here: %s); this model runs in float32.",
                        self.lean_unsupported)
        self.lean = (LeanLlama(self.model, self.max_context, pack=pack, static=static)
                     if self.lean_unsupported is None else None)
        self.logits = self.lean.head if self.lean is not None else self.head  # hidden [n, H] -> [n, V]
        self.name = loaded.name
        # Until calibrate() has measured this machine: the packing's row of the reference machines' constants.
        self.run = run_mode(self.device, self.dtype, self.lean.packing if self.lean is not None else None,
                            tuple(loaded.notes))
        if self.device.type == "cpu" and self.logits is not None:  # how many rows a head call pays for here
            self.run = replace(self.run, head_cost=self._head_cost())
        if self.device.type == "cpu":  # built (once a machine) before a request's first walk reads its logits
            logit_scan.library()
        self.calibration: Calibration | None = None
        # What a step of k rows costs here, learned from the steps run: seeded by calibrate() from what this machine
        # measured, else from a conservative curve (never the reference machines' curves above); a GPU's is flat.
        self.costs = StepCosts(self.run.step_cost, "flat") if self.device.type == "cuda" else StepCosts()
        # How many threads a step runs on, learned from the steps' times (another process may hold a core):
        # the gguf mode on a CPU alone, whose kernels compute the same values on any number of threads.
        cpu_gguf = self.device.type == "cpu" and self.lean is not None and self.lean.packing == "gguf"
        self.threads = (StepThreads(torch.get_num_threads(), torch.set_num_threads, torch.get_num_threads)
                        if cpu_gguf else None)
        # each thread count learns its own step-cost curve (`costs` is the one of the count steps run on): on fewer
        # threads a tree's rows cost more over one row
        self._costs_threads = self.threads.current if self.threads is not None else None
        self._costs_by_threads: dict[int | None, StepCosts] = {self._costs_threads: self.costs}
        self.clock = time.perf_counter  # what step times are read from (a test's fake clock)
        self._pass_s: deque[float] = deque(maxlen=PASSES_KEPT)  # the last decoding passes' times (seconds)
        # Whether a step drafts at all: where drafting has not paid for its own work, steps are plain.
        self.gate = DraftGate()
        # What sources claim is not how often the model agrees: learned per (source, match length, depth) from
        # every walk, for as long as the decoder lives (and longer, when its owner saves it).
        self.acceptance = acceptance if acceptance is not None else AcceptanceModel()
        self._learned_file: tuple[Path, dict] | None = None  # where calibrate() looked for a learned curve, its key

    def _head_cost(self) -> tuple[float, ...]:
        """The head's cost by rows here (calibration.measure_head), on rows as wide as what it reads: the lean
        engine's hidden state, or the split head's input (a model may project its hidden state before the head).
        A head the probe cannot run keeps the flat curve, with one log line: it never stops a model from loading."""
        width = getattr(self.head, "in_features", None) if self.lean is None else None
        width = width or self.model.config.hidden_size
        try:
            return tuple(measure_head(self.logits, width, self.dtype, max(self.run.head_batch, self.run.miss_rows)))
        except (RuntimeError, ValueError, TypeError) as err:
            log.warning("Could not time the LM head by rows (%s); its first call takes the likely nodes as if rows "
                        "were free.", err)
            return self.run.head_cost

    @torch.inference_mode()
    def _split_head(self):
        """(transformer body, LM head) when logits are just head(hidden), else (None, None).

        A step needs logits only at the nodes its walk visits (a few of 17+), and on a CPU the head over a 49k
        vocabulary is a fifth of a tree step. Models that scale or soft-cap their logits fail the check and keep
        the full forward.
        """
        body, head = self.model.get_decoder(), self.model.get_output_embeddings()
        if body is None or head is None:
            return None, None
        ids = torch.tensor([[0, 1, 2]], device=self.device)  # [1, 3]
        try:
            hidden = body(input_ids=ids, use_cache=False).last_hidden_state  # [1, 3, H]
            same = torch.equal(head(hidden), self.model(input_ids=ids, use_cache=False).logits)
        except (TypeError, AttributeError):
            return None, None
        return (body, head) if same else (None, None)

    @property
    def chain_tail(self) -> int:
        """The longest uncached prompt tail a step's pass computes under its tree (only the lean engine chains)."""
        return CHAIN_TAIL if self.lean is not None else 0

    def shortest_pass_s(self) -> float | None:
        """The shortest of the last decoding passes, head and walk included (seconds): what any pass takes at least;
        None before the first."""
        return min(self._pass_s) if self._pass_s else None

    def calibrate(self, cache_dir: Path | None = None, force: bool = False,
                  should_stop: Callable[[], bool] | None = None, measure: bool = True,
                  **measure_kw) -> Calibration | None:
        """Measure (or read from the cache folder) this machine's step-cost curve; tree sizing uses it from the
        next step on, on CPU and CUDA alike. `measure=False` only reads it (None, and no change, when it was never
        measured here): what a server does at start, when every core is the first request's.

        Safe in a background thread while this decoder serves: it times steps on a KV cache of its own and only
        swaps `step_cost` at the end. Run it while the decoder is idle, though: the timings of a step that shares
        the cores with a request are worthless; pass `should_stop` (checked between steps) to abandon it, which
        raises calibration.Interrupted and keeps the previous curve.
        """
        found = calibrate(self.model, self.name, self.device, self.dtype,
                          cache_root() if cache_dir is None else cache_dir, self.step_timer,
                          engine=self.engine, force=force, should_stop=should_stop, measure=measure,
                          kernel=self.kernel,
                          **measure_kw)
        root = cache_root() if cache_dir is None else cache_dir
        key = calibration_key(self.model, self.name, self.device, self.dtype, self.engine, self.kernel)
        self._learned_file = (cache_file(root, key, prefix=LEARNED_PREFIX), key)
        kept = _kept_learned(*self._learned_file) or {}
        # where drafting paid here: a restart does not learn it again at a loss (a gate that has learned this run's
        # steps is not replaced by an older start's)
        if self.gate.learned_json() is None and (gate := DraftGate.from_learned_json(kept.get("gate"))) is not None:
            self.gate = gate
        if found is not None:
            self.run, self.calibration = self.run.measured(found.curve), found
            # timings from busy cores (not kept) are a seed the first steps outvote
            self._full_costs().seed(found.curve, "measured",
                                    None if found.path is not None else step_cost.GUESSED_WEIGHT)
        elif self.device.type == "cpu" and (learned := _learned_costs(self._learned_file[0], kept)) is not None:
            self._full_costs().seed(learned, "learned here")
        elif self.device.type == "cpu" and (two := _mode_choice_steps(self.name, self.device, self.mode, root)):
            self._full_costs().seed(seed_from_two(two[0], mode_choice.TREE, two[1]), "mode choice")
        return found

    def save_learned(self) -> None:
        """Keep what the steps taught where `calibrate` looked for it, for the next start on this machine, model,
        mode and kernel: the step-cost curve (step_cost.StepCosts.learned_json) and where drafting paid
        (DraftGate.learned_json). Nothing before `calibrate` or before a step taught anything. A failure costs only
        the next start's seed (one log line)."""
        if self._learned_file is None:
            return
        path, key = self._learned_file
        try:  # the curve of all the cores (the count the key names), not of fewer threads
            learned = self._full_costs().learned_json() or {}
        except RuntimeError:  # a step recorded meanwhile (a replaced model finishing a request): not kept this time
            return
        if "curve" not in learned and (kept := _kept_learned(path, key)) is not None and "curve" in kept:
            learned.update(curve=kept["curve"], steps=kept.get("steps"))  # nothing new on all the cores: kept as it was
        if (gate := self.gate.learned_json()) is not None:
            learned["gate"] = gate
        if not learned:
            return
        try:
            write_json(path, {"key": key, **learned})
        except OSError as err:
            log.warning("Could not keep the learned step cost in %s (%s); the next start learns it again.", path, err)

    @property
    def mode(self) -> str:
        """The numerics this decoder's outputs follow ("float32" is the exact mode)."""
        return self.run.name

    @property
    def step_cost(self) -> list[float]:
        """The step-cost curve tree sizing uses now: the seed (measured here, else conservative) as the steps run
        have corrected it."""
        return self.costs.curve()

    @property
    def kernel(self) -> str:
        """The instructions the quantized modes' integer kernel runs on here and which build of it ("" for the other
        engines): a step-cost curve measured on other instructions (before AMX tiles, say) or by another build of
        the kernel (an update) is measured again."""
        if self.lean is None or self.lean.packing not in ("q8", "gguf"):
            return ""
        from rest_lsp.kernels import quant_matmul

        lib = quant_matmul.library(self.run.level or None)
        return f"{quant_matmul.path_name(lib)} ({quant_matmul.build_name(lib)})"

    @property
    def engine(self) -> str:
        if self.lean is None:
            return "transformers"
        if self.lean.graphs is not None:
            return "lean-graphs"
        packing = "" if self.lean.packing == "none" else f"-{self.lean.packing}"
        return f"lean{packing}" + ("-static" if self.lean.static else "")

    @torch.inference_mode()
    def step_timer(self, context: int) -> Callable[[DraftTree], None]:
        """run(tree): one verification step as `verify` runs it (the forward pass and the head over the nodes it
        batches, or the root), on a KV cache of its own holding `context` tokens; the decoder's cache is never
        touched, so this may run in another thread while the decoder serves."""
        cache = self._new_cache()
        prompt = torch.randint(0, self.vocab_size, (context,), generator=torch.Generator().manual_seed(0))  # [T]
        if self.lean is not None:
            self.lean.forward(prompt.to(self.device), torch.arange(context, device=self.device), cache)
        else:
            self.model(input_ids=prompt[None].to(self.device), **{self._cache_kw: cache}, use_cache=True,
                       logits_to_keep=1)

        @torch.inference_mode()
        def run(tree: DraftTree) -> None:
            logits_at = self._pass(cache, tree)
            for node in head_rows(tree, self.run.head_cost, self.run.head_batch, self.run.miss_rows):
                logits_at(node)
            sync_device(self.device)
            if isinstance(cache, KVCache):
                cache.crop(context)
            else:
                cache.crop(-len(tree))

        return run

    # -- cache ---------------------------------------------------------------------------------------------------
    # What `reset()` clears, and so what a detached state carries.
    _CACHE_FIELDS = ("_cache", "_cached", "_rope_long")

    def reset(self) -> None:
        """Forget the cached sequence: the next prompt is prefilled in full. A lean cache keeps its storage, and with
        it the CUDA graphs captured on that storage (a new one would capture every bucket again)."""
        if isinstance(self._cache, KVCache):
            self._cache.crop(0)
            self._cached, self._rope_long = [], None
        else:
            self._cache, self._cached, self._rope_long = None, [], None

    def detach_cache(self) -> CacheState:
        """Take the cache out (the decoder starts over empty) for a keeper to `attach_cache` later: a document
        switched back to then pays only for what changed in it."""
        state = CacheState(tuple(getattr(self, f) for f in self._CACHE_FIELDS), tuple(self._cached),
                           self.cache_bytes())
        self._cache = None  # the state takes the cache with it: a reset then starts a new one
        self.reset()
        return state

    def attach_cache(self, state: CacheState) -> None:
        """Make a detached cache the decoder's own again (the current one is dropped)."""
        for name, value in zip(self._CACHE_FIELDS, state.fields):
            setattr(self, name, value)

    def cache_bytes(self) -> int:
        """Memory the current cache holds."""
        return _tensor_bytes(self._cache)

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether the cache starts with exactly `tokens` (a prefill of them would compute nothing)."""
        return len(tokens) <= len(self._cached) and _common_prefix(self._cached, tokens) == len(tokens)

    def _restore(self) -> None:
        """Back to a consistent cache after a failed call: rows beyond `_cached` are dropped from every layer."""
        try:
            if self._cache is not None:
                self._crop(len(self._cached))
                return
        except Exception:
            pass
        self.reset()

    def _new_cache(self) -> DynamicCache | KVCache:
        if self.lean is not None:
            return self.lean.new_cache()
        return DynamicCache() if self.window is not None else DynamicCache(config=self.model.config)

    def _cache_length(self) -> int:
        return _cached_length(self._cache)

    def _crop(self, length: int) -> int:
        """Keep the first `length` cached tokens in every layer; returns how many are kept (0 when a layer has
        fewer than `length`: a damaged cache starts over)."""
        if isinstance(self._cache, KVCache):
            if self._cache.length < length:
                self._cache, self._cached = self._new_cache(), []
                return 0
            self._cache.crop(length)
            del self._cached[length:]
            return length
        layers = self._cache.layers
        if any(layer.get_seq_length() < length for layer in layers):
            self._cache, self._cached = self._new_cache(), []
            return 0
        for layer in layers:
            if layer.get_seq_length() > length:
                layer.crop(length - layer.get_seq_length())  # negative: tokens to remove
        del self._cached[length:]
        return length

    def _long_rope(self, last_position: int) -> bool:
        return self.rope_switch is not None and last_position >= self.rope_switch

    def _match_rope(self, seq: Sequence[int]) -> None:
        """Recompute the cache when the step's root needs the other rotation than the cached keys have."""
        long = self._long_rope(len(seq) - 1)
        if self.rope_switch is None or not self._cached or self._rope_long == long:
            return
        self.reset()
        if long:  # a pass that reaches the root's position, so that it rotates with the long factors
            self.prefill(seq)
            self._crop(len(seq) - 1)
        else:
            self.prefill(seq[:-1])

    def _usable(self, proposals: list[Proposal], seq_length: int) -> list[Proposal]:
        """Proposals without any node holding an id outside the vocabulary (a datastore of another tokenizer) and,
        for long RoPE, without nodes at or past the position where the rotation switches (one pass cannot hold
        both rotations); a dropped node takes its descendants with it, a dropped `under` token the whole proposal."""
        depth_limit = None
        if self.rope_switch is not None and not self._long_rope(seq_length - 1):
            depth_limit = self.rope_switch - seq_length
        out = []
        for prop in proposals:
            if not all(0 <= t < self.vocab_size for t in prop.under) or (
                    depth_limit is not None and len(prop.under) >= depth_limit):
                continue
            keep = [0 <= t < self.vocab_size for t in prop.tokens]
            if depth_limit is not None:
                depth: list[int] = []
                for i, parent in enumerate(prop.parents):
                    depth.append(len(prop.under) + 1 if parent < 0 else depth[parent] + 1)
                    keep[i] = keep[i] and depth[i] <= depth_limit
            prop = prop.kept(keep)
            if len(prop):
                out.append(prop)
        return out

    def _keep_rows(self, base: int, rows: list[int]) -> None:
        """Move the KV rows base+rows[i] to base+i and drop everything after them."""
        if isinstance(self._cache, KVCache):
            self._cache.keep_rows(base, rows)
            return
        if rows != list(range(len(rows))):
            src = torch.tensor(rows, device=self.device) + base
            for layer in self._cache.layers:
                # [B, H, S, D]: gather the accepted path into place
                layer.keys[:, :, base : base + len(rows)] = layer.keys[:, :, src]
                layer.values[:, :, base : base + len(rows)] = layer.values[:, :, src]
        self._cache.crop(-(self._cache.get_seq_length() - base - len(rows)))

    # -- model passes --------------------------------------------------------------------------------------------
    @_restore_on_error
    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int], stop: Callable[[], bool] | None = None,
                chunk: int = PREFILL_CHUNK, leave: int = 0) -> int:
        """Make the cache hold exactly `tokens`, reusing the longest common prefix. Returns tokens computed.

        `stop` is asked between chunks of `chunk` tokens: a long prompt can be given up half-way (the cache
        then holds the part computed so far). An uncached tail of at most `leave` tokens is left for the caller's
        next pass (the cache then holds the common prefix only).
        """
        if self._cache is None:
            self._cache = self._new_cache()
            self._cached = []
        keep = _common_prefix(self._cached, tokens)
        long = self._long_rope(len(tokens) - 1)
        if keep < len(tokens) and self.rope_switch is not None and self._rope_long != long:
            keep = 0  # the kept keys were rotated with the other factors
        keep = self._crop(keep)
        if len(tokens) - keep <= leave:
            return 0
        # long RoPE rotates a pass by its last position: one pass, so that all keys rotate alike
        size = max(1, chunk) if self.rope_switch is None else max(1, len(tokens))
        for start in range(keep, len(tokens), size):
            if stop is not None and stop():
                break
            part = list(tokens[start : start + size])
            ids = torch.tensor(part, device=self.device)  # [T]
            pos = torch.arange(start, start + len(part), device=self.device)  # [T]
            if self.lean is not None:
                self.lean.forward(ids, pos, self._cache)
            else:
                self.model(input_ids=ids[None], position_ids=pos[None], **{self._cache_kw: self._cache}, use_cache=True,
                           logits_to_keep=1)
            self._cached.extend(part)
            self._rope_long = long
        return len(self._cached) - keep

    @_restore_on_error
    @torch.inference_mode()
    def verify(self, tree: DraftTree, chain: Sequence[int] = ()) -> Callable[[int], torch.Tensor]:
        """One forward pass over the root and all drafts on top of the cache; with a `chain` (lean engine), over
        those uncached tokens first, the tree's root following them.

        Returns logits_at(node) -> [V] fp32, computed on demand when the head can be split off.
        """
        return self._pass(self._cache, tree, chain)

    def _pass(self, cache: DynamicCache | KVCache, tree: DraftTree,
              chain: Sequence[int] = ()) -> Callable[[int], torch.Tensor]:
        past = _cached_length(cache)
        if self.lean is not None:
            whole = under_chain(tree, chain)
            ids = torch.tensor(whole.tokens, device=self.device)  # [k+n+1]
            pos = torch.tensor(whole.depths, device=self.device) + past  # [k+n+1]
            mask = None if len(whole) == 1 else tree_attention_mask(whole, 0, self.dtype, self.device)[0, 0]
            return self._head_at(tree, self.lean.step(ids, pos, cache, mask)[len(chain):])  # [n+1, H]
        if chain:
            raise ValueError("a chained step runs on the lean engine only")
        ids = torch.tensor([tree.tokens], device=self.device)  # [1, n+1]
        pos = tree_position_ids(tree, past, self.device)  # [1, n+1]
        kwargs = dict(input_ids=ids, position_ids=pos, use_cache=True, **{self._cache_kw: cache})
        if len(tree) > 1 or self.window is not None:
            # a lone root on a full cache is a plain step: one query sees the whole cache, no mask to build
            kwargs["attention_mask"] = self._tree_mask(tree, past)  # [1, 1, n+1, past+n+1] (per layer type with windows)
        if self.body is None:
            logits = self.model(**kwargs).logits[0].float()  # [n+1, V]
            return lambda node: logits[node]
        return self._head_at(tree, self.body(**kwargs).last_hidden_state[0])  # [n+1, H]

    def _head_at(self, tree: DraftTree, hidden: torch.Tensor) -> Callable[[int], torch.Tensor]:
        """logits_at(node) -> [V] fp32 from hidden states [n+1, H]: the root and the likeliest nodes in one head call
        (`head_rows`: as many as the head's cost by rows pays for); any other node when the walk reaches it, with the
        likeliest nodes below it in as many rows as cost one (`miss_rows`)."""
        rows = head_rows(tree, self.run.head_cost, self.run.head_batch, self.run.miss_rows)
        logits = self.logits(hidden[rows]).float()  # [k, V]
        done = {node: logits[i] for i, node in enumerate(rows)}

        @torch.inference_mode()
        def logits_at(node: int) -> torch.Tensor:
            if node not in done:
                rows = [node] + below(tree, node, self.run.miss_rows - 1, done)
                logits = self.logits(hidden[rows]).float()  # [k, V]
                done.update((n, logits[i]) for i, n in enumerate(rows))
            return done[node]

        return logits_at

    def _tree_mask(self, tree: DraftTree, past: int):
        mask = tree_attention_mask(tree, past, self.dtype, self.device)  # [1, 1, n+1, past+n+1]
        if self.window is None:
            return mask
        windowed = _outside_window(mask, tree_position_ids(tree, past, self.device)[0], past, self.window)
        if self.layer_types is None:
            return windowed
        return {"full_attention": mask, "sliding_attention": windowed}  # the model picks one per layer

    # -- acceptance ----------------------------------------------------------------------------------------------
    def _choose(self, logits: torch.Tensor, config: DecodeConfig, gen: torch.Generator | None) -> int:
        """The model's own token at one node: argmax, or ONE draw from its (top-p) distribution."""
        if config.temperature <= 0:
            return logit_scan.argmax(logits)  # torch.argmax's index
        probs = torch.softmax(logits / config.temperature, dim=-1)  # [V]
        if config.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
            drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= config.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=gen))

    def accept(
        self,
        tree: DraftTree,
        logits_at: Callable[[int], torch.Tensor],
        config: DecodeConfig,
        gen: torch.Generator | None,
    ) -> tuple[list[int], list[int]]:
        """Walk from the root: at each node take the model's token; go on into the child holding it, else stop.

        Returns (new tokens: the accepted drafts plus the model's own next token, node indices of the path).
        Sampling draws once per visited node, so every emitted token is a draw from the model at its position.
        """
        kids = tree.children()
        node, path, new = 0, [0], []
        while True:
            token = self._choose(logits_at(node), config, gen)
            new.append(token)
            child = kids[node].get(token)
            if child is None or token in self.eos:
                return new, path
            node = child
            path.append(node)

    def _observe(self, tree: DraftTree, path: list[int], chosen: list[int]) -> None:
        """Teach the acceptance model: every child of a node the walk reached was tried against the model's token
        there (chosen[i] at path[i]); the one holding it was accepted."""
        if len(tree) == 1:
            return
        kids = tree.children()
        for node, token in zip(path, chosen):
            for child_token, child in kids[node].items():
                for key, ratio in tree.votes[child]:
                    self.acceptance.observe(key, ratio, child_token == token)
                if tree.chances:
                    self.acceptance.observe_node(tree.chances[child], child_token == token)

    @staticmethod
    def _recycle(drafts: DraftSource, tree: DraftTree, path: list[int], logits_at) -> None:
        """Hand the model's distribution after each visited token to sources that learn its habits (no extra pass:
        the walk computed these logits already)."""
        rows = [logits_at(node) for node in path]  # [V] each
        found = logit_scan.top(rows, SUCCESSORS)  # one pass a row where the kernel takes them
        ids, probs = found if found is not None else top_successors(torch.stack(rows))  # [n, k] each
        for node, node_ids, node_probs in zip(path, ids, probs):
            drafts.observe_successors(tree.tokens[node], node_ids, node_probs)

    # -- the loop ------------------------------------------------------------------------------------------------
    @_restore_on_error
    @torch.inference_mode()
    def generate(
        self,
        prompt: Sequence[int],
        drafts: DraftSource,
        config: DecodeConfig,
        should_stop: Callable[[list[int]], bool] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> DecodeResult:
        """REST: each step drafts a tree, verifies it in one pass and accepts the longest agreed path, learns from
        the walk, and commits the accepted tokens' KV rows; the model's own next token is the next step's root."""
        self._check_fits(prompt, config)
        gen = None
        if config.temperature > 0 and config.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(config.seed)
        clock = Timers(start=time.perf_counter())
        if self.threads is not None:
            self.threads.apply()
        leave = self.chain_tail
        computed = self.prefill(prompt[:-1], stop=cancelled, leave=leave)
        chain = list(prompt[len(self._cached) : -1])  # computed in the first step's pass
        clock.prefilled(self.device)
        if len(chain) > leave:  # `cancelled` fired during the prefill
            return clock.result([], 0, "stopped", computed)

        seq, new = list(prompt), []
        steps, finish, accepted_drafts, copying = 0, "length", 0, False
        recycle = config.budget > 0 and getattr(drafts, "wants_successors", hasattr(drafts, "observe_successors"))
        mix = mix_of(drafts)  # whose sources a lite step narrows to the context
        while len(new) < config.max_new_tokens:
            if cancelled is not None and cancelled():  # before each step too, not only between prefill passes
                finish = "stopped"
                break
            # draft: a tree of every source or of the context alone, whichever has gained more in this situation
            # (while it pays), else the root alone (a plain step)
            situation = DraftGate.situation(steps == 0, accepted_drafts, copying)
            self._follow_threads()  # one step chooses, records and judges on one count's curve
            kind = (None if config.budget <= 0 else FULL if not config.fit_to_cost
                    else self.gate.kind(situation, lite=mix is not None))
            # a step after a miss that would not draft, or drafts the context alone, asks the context first: where
            # its match is long the output is copying (ECHO_MATCH), and a lite tree is built from what it said
            echo, echo_s = (None, 0.0)
            if situation == COLD and kind != FULL:
                echo, echo_s = self._echo(seq, drafts, mix, config)
            if kind is None and echo and max(p.match_length for p in echo) >= ECHO_MATCH:
                situation = COPYING
                kind = self.gate.kind(situation, lite=True)
            drafting = kind is not None
            work_s = self.clock()
            lite = mix if kind == LITE else None
            trust = FIRST_TREE_TRUST if steps == 0 else 1.0
            found = echo if kind == LITE else None  # the context's proposals, asked already, make a lite tree
            tree = (self._draft(seq, drafts, config, clock, lite, len(chain), trust, found) if drafting
                    else self._root(seq))
            asked_s = echo_s if found is not None else 0.0  # the asking is then this step's drafting work
            clock.draft += asked_s
            work_s = self.clock() - work_s + asked_s
            # verify and accept: one pass, the longest agreed path
            if self.threads is not None:
                self.threads.apply()
            self._match_rope(seq)
            base = self._cache_length()
            accepted, path, logits_at = self._verify_and_accept(tree, chain, config, gen)
            computed, steps, under = computed + len(chain), steps + 1, len(chain)
            # update: the learners, the gate, the cache
            work_s += self._learn(drafts if recycle and kind == FULL else None, tree, path, accepted, logits_at)
            accepted_drafts = len(accepted) - 1
            copying = _copied(tree, path, accepted_drafts)
            if drafting:
                self._judge(situation, kind, config, tree, accepted_drafts, work_s, under)
            accepted = accepted[: config.max_new_tokens - len(new)]
            self._commit(base, chain, seq, tree, path, accepted)
            chain = []
            new.extend(accepted)
            finish = self._ended(accepted, new, should_stop)
            if finish:
                break
        clock.decoded(self.device)
        return clock.result(new, steps, finish or "length", computed)

    def _check_fits(self, prompt: Sequence[int], config: DecodeConfig) -> None:
        if not prompt:
            raise ValueError("The prompt is empty: there is nothing to continue.")
        if len(prompt) + config.max_new_tokens + config.budget + 1 > self.max_context:
            raise ValueError(
                f"The prompt ({len(prompt)} tokens) plus {config.max_new_tokens} new tokens does not fit the "
                f"model's context of {self.max_context} tokens."
            )

    def _follow_threads(self) -> None:
        """Size the next step's tree on the step-cost curve of the thread count steps now run on (StepThreads may
        have switched in the step before): a count run for the first time starts from the curve of the count before
        it, as a guess its own steps soon outvote; the count left forgets its plain-step reference (when steps come
        back to it the load may be another), not its ratios."""
        if self.threads is None or self.threads.current == self._costs_threads:
            return
        count, left = self.threads.current, self.costs
        costs = self._costs_by_threads.get(count)
        if costs is None:
            costs = StepCosts(left.curve(), "other thread count", step_cost.GUESSED_WEIGHT, learn=left.learn)
            self._costs_by_threads[count] = costs
        left.pause()
        self.costs, self._costs_threads = costs, count

    def _full_costs(self) -> StepCosts:
        """The step-cost learner of all the cores: the curve a calibration measures and the next start reads."""
        if self.threads is None:
            return self.costs
        return self._costs_by_threads.get(self.threads.counts[0], self.costs)

    def _echo(self, seq: list[int], drafts: DraftSource, mix: DraftMix | None,
              config: DecodeConfig) -> tuple[list[Proposal] | None, float]:
        """(the context's proposals after `seq`, the seconds asking took): what tells a step after a miss that the
        output is copying (a match of ECHO_MATCH tokens or more), and a lite tree's proposals; (None, 0.0) where
        steps are not gated or there is no mix to narrow."""
        if mix is None or config.budget <= 0 or not config.fit_to_cost:
            return None, 0.0
        started = self.clock()
        found = _asked(drafts, seq, mix)
        return found, self.clock() - started

    def _draft(self, seq: list[int], drafts: DraftSource, config: DecodeConfig, clock: "Timers",
               lite: DraftMix | None = None, under: int = 0, trust: float = 1.0,
               found: list[Proposal] | None = None) -> DraftTree:
        """The sources' proposals after `seq` (with `lite`, that mix's LITE_SOURCES alone; `found`: those, asked
        already), merged into one tree rooted at its last token and cut to what pays, its nodes' shares weighed at
        `trust` (above a prompt tail of `under` rows: what it adds to that pass)."""
        t = time.perf_counter()
        if found is None:
            found = _asked(drafts, seq, lite) if config.budget > 0 else []
        # a tree keeps `budget` nodes: a proposal's nodes past its `budget` likeliest would not be kept, and each
        # costs the merge's Python work
        proposals = self._usable([p.prefix(config.budget) for p in found], len(seq))
        tree = build_tree(seq[-1], proposals, config.budget, self.acceptance)
        if config.fit_to_cost:
            tree = self.costs.choose(tree, under, trust)
        clock.draft += time.perf_counter() - t
        return tree

    @staticmethod
    def _root(seq: list[int]) -> DraftTree:
        """A plain step's tree: the last token alone."""
        return DraftTree([seq[-1]], [-1], [0], (1.0,), ((),), (1.0,))

    def _verify_and_accept(self, tree: DraftTree, chain: list[int], config: DecodeConfig,
                           gen: torch.Generator | None) -> tuple[list[int], list[int], Callable[[int], torch.Tensor]]:
        """One forward pass over the chain and the tree, then the walk: (accepted tokens, the path's nodes, the
        logits the pass computed, by node)."""
        probe = self.threads is not None and self.threads.probing  # a step on another thread count than the rest
        timed = self.threads is not None and not chain  # what the thread count is chosen by: steps without a tail
        t, cpu = self.clock(), time.process_time() if timed else 0.0
        logits_at = _memo(self.verify(tree, chain))
        accepted, path = self.accept(tree, logits_at, config, gen)
        elapsed = self.clock() - t  # the walk read the logits: the device is done
        self._pass_s.append(elapsed)
        if not probe:  # a pass of k rows, tail or tree
            self.costs.record(len(chain) + len(tree), elapsed)
        if timed:  # a tree step as the plain steps it is worth on the curve of the count it ran on
            curve = self._costs_by_threads.get(self.threads.running, self.costs)
            worth = curve.cost(len(tree)) if len(tree) > 1 else 1.0
            self.threads.record(elapsed / worth, (time.process_time() - cpu) / worth)
        return accepted, path, logits_at

    def _learn(self, recycle: DraftSource | None, tree: DraftTree, path: list[int], accepted: list[int],
               logits_at: Callable[[int], torch.Tensor]) -> float:
        """What the walk taught: how often each source's nodes are accepted, and (Token Recycling) the model's
        likeliest successors at the nodes it visited. Returns the seconds it took (drafting's work)."""
        started = self.clock()
        self._observe(tree, path, accepted)
        if recycle is not None:
            self._recycle(recycle, tree, path, logits_at)
        return self.clock() - started

    def _judge(self, situation: str, kind: str, config: DecodeConfig, tree: DraftTree, accepted_drafts: int,
               work_s: float, under: int = 0) -> None:
        """Tell the gate what a step drafted `kind` brought: its accepted drafts, less what its rows beyond the root
        added to the pass (above a prompt tail of `under` rows) and drafting's `work_s`, in plain steps. Fixed trees
        are not gated, and a step-cost probe is the curve's exploration, not the drafts'."""
        if config.fit_to_cost and not self.costs.probing:
            self.gate.report(situation, accepted_drafts, self.costs.extra(len(tree), under), work_s,
                             self.costs.reference_s(), kind)

    def _commit(self, base: int, chain: list[int], seq: list[int], tree: DraftTree, path: list[int],
                accepted: list[int]) -> None:
        """Keep the chain's rows, the root's and the accepted drafts' in the KV cache; the last accepted token (the
        model's own) is the next root, not cached yet."""
        k = len(chain)
        self._keep_rows(base, list(range(k)) + [k + i for i in path[: len(accepted)]])
        self._cached.extend(chain + seq[-1:] + [tree.tokens[i] for i in path[1 : len(accepted)]])
        seq.extend(accepted)

    def _ended(self, accepted: list[int], new: list[int],
               should_stop: Callable[[list[int]], bool] | None) -> str | None:
        if any(t in self.eos for t in accepted):
            return "eos"
        if should_stop is not None and should_stop(new):
            return "stopped"
        return None
