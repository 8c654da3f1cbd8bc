"""REST greedy output must be token-identical to `model.generate(do_sample=False)` in fp32."""

import random

import pytest
import torch
from support import tiny_model
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.engine.lean_llama import LeanLlama
from rest_lsp.engine.model import LoadedModel
from rest_lsp.engine.runmode import PACKINGS
from rest_lsp.engine.step_cost import StepCosts
from rest_lsp.drafting.acceptance import PRIOR_SCALE, bucket
from rest_lsp.datastore import Datastore
from rest_lsp.drafting.drafts import (ContextLookup, DraftMix, KnownStart, NgramDrafts, NoDrafts, OutputStore, Proposal,
                             SuccessorTable, TokenLines, propose, rest_drafts)

N_NEW = 40


_REFERENCES: dict = {}  # (model, prompt, n) -> generate's tokens: the engines of a test share a model's references


def reference(loaded, prompt, n=N_NEW):
    key = (id(loaded.model), tuple(prompt), n)
    if key not in _REFERENCES:
        ids = torch.tensor([prompt], device=loaded.device)
        out = loaded.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
        _REFERENCES[key] = (loaded.model, out[0, len(prompt) :].tolist())  # the model kept: its id stays its own
    return list(_REFERENCES[key][1])


def corrupted(tokens, every, vocab, rnd):
    return [rnd.randrange(vocab) if i % every == every - 1 else t for i, t in enumerate(tokens)]


def plain_tokens(decoder, prompt, n=N_NEW):
    """What plain decoding writes after `prompt` on this decoder's own step (no drafts, budget 0)."""
    from rest_lsp.drafting.drafts import NoDrafts

    return decoder.generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=n, budget=0)).tokens


def assert_rest_is_plain_decoding(decoder, vocab, budgets=(4, 16), seeds=range(3)):
    """Perfect, useless, partly right and branchy drafts at each budget: every completion is plain decoding's on the
    same decoder, and perfect drafts are taken several tokens a step."""
    for seed in seeds:
        rnd = random.Random(seed)
        prompt = [rnd.randrange(vocab) for _ in range(rnd.randrange(5, 30))]
        truth = plain_tokens(decoder, prompt)
        sources = draft_sources(prompt, truth, vocab, rnd)
        for name in ("perfect", "useless", "partly", "branchy", "all"):
            for budget in budgets:
                result = decoder.generate(prompt, sources[name], DecodeConfig(max_new_tokens=N_NEW, budget=budget,
                                                                              fit_to_cost=False))
                assert result.tokens == truth, (name, seed, budget)
        assert decoder.generate(prompt, sources["perfect"], DecodeConfig(max_new_tokens=N_NEW, budget=16,
                                                                         fit_to_cost=False)).tokens_per_step > 3


def draft_sources(prompt, truth, vocab, rnd):
    """Perfect, useless, partly right and branchy sources for one prompt whose true continuation is `truth`."""
    full = prompt + truth
    branchy = []
    for i in range(len(full) - 1):
        # many siblings after every context position: the right next token among random ones
        for _ in range(4):
            branchy.append(full[max(0, i - 3) : i + 1] + [rnd.randrange(vocab) for _ in range(3)])
        branchy.append(full[max(0, i - 3) : i + 4])
    outputs = OutputStore()
    outputs.add(prompt[-6:], corrupted(truth, 5, vocab, rnd))  # an earlier, partly different output here
    recycle = SuccessorTable()
    for t in range(vocab):  # habits that are half right: the true successor of some tokens, noise for others
        nxt = [full[i + 1] for i in range(len(full) - 1) if full[i] == t][:1] or [rnd.randrange(vocab)]
        recycle.observe_successors(t, nxt + [rnd.randrange(vocab) for _ in range(3)], [0.6, 0.2, 0.1, 0.1])
    workspace = Datastore()
    workspace.put("other.py", prompt[: len(prompt) // 2] + corrupted(truth, 2, vocab, rnd))
    return {
        "perfect": NgramDrafts([full]),
        "useless": NgramDrafts([[rnd.randrange(vocab) for _ in range(2000)]]),
        "partly": NgramDrafts([prompt + corrupted(truth, 4, vocab, rnd)]),
        "branchy": NgramDrafts(branchy),
        "context": ContextLookup(),
        "mixed": DraftMix([("context", ContextLookup()), ("other", NgramDrafts([prompt + corrupted(truth, 3, vocab, rnd)]))]),
        "outputs": outputs,
        "suffix": NgramDrafts([truth[len(truth) // 2 :]], name="suffix"),
        "recycle": recycle,
        "all": rest_drafts(workspace, suffix=truth[10:], outputs=outputs, recycle=recycle),
        # a known start of the output (held-back whitespace): right, with the drafts below it partly right; wrong
        "held": rest_drafts(workspace, suffix=truth[10:], outputs=outputs, recycle=recycle,
                            held=(len(prompt), truth[:2])),
        "held-wrong": KnownStart(NgramDrafts([prompt + corrupted(truth, 4, vocab, rnd)]), len(prompt),
                                 [(truth[0] + 1) % vocab]),
        # a one-line output: every fifth id "ends the line", and the drafts below such an end are cut
        "first-line": rest_drafts(workspace, suffix=truth[10:], outputs=outputs, recycle=recycle,
                                  held=(len(prompt), truth[:2]),
                                  first_line=(len(prompt), TokenLines(lambda t: "x\n" if t % 5 == 0 else "x"),
                                              False)),
        "none": NoDrafts(),
    }


# Every engine: our own forward over our own KV cache (Llama-family models), eager (the CPU's) and static (the GPU's:
# steps padded to fixed shapes, replayed from CUDA graphs there), and transformers' forward over DynamicCache.
ENGINES = [pytest.param(dict(lean=True, static=False), id="lean"),
           pytest.param(dict(lean=True, static=True), id="lean-static"),
           pytest.param(dict(lean=False), id="transformers")]


def test_llama_family_runs_on_the_lean_engine(tiny):
    assert Decoder(tiny).lean is not None
    assert Decoder(tiny, lean=False).lean is None


@pytest.mark.parametrize("pack", ["panel", "onednn", "none"], ids=["panel", "onednn", "f.linear"])
def test_the_lean_engine_is_exact_on_packed_weights_and_on_plain_ones(tiny, pack):
    """On a CPU in fp32 the lean engine's matmuls run on our panel kernel (the other tests use that path), or on
    oneDNN's packed weights where no compiler built it; F.linear is the path on GPUs and in other dtypes: all of
    them verify trees exactly."""
    from rest_lsp.engine.lean_llama import LeanLlama
    from rest_lsp.engine.matmuls import onednn_packs, panel_packs

    runs = {"panel": panel_packs, "onednn": onednn_packs}.get(pack)
    if runs is not None and not runs(torch.float32, tiny.device):
        pytest.skip(f"{pack} packs fp32 weights on a CPU only (panel: with a C compiler)")
    vocab = tiny.model.config.vocab_size
    decoder = Decoder(tiny)
    decoder.lean = LeanLlama(decoder.model, decoder.max_context, pack=pack)
    decoder.logits = decoder.lean.head
    assert decoder.engine == (f"lean-{pack}" if runs is not None
                              else "lean-graphs" if tiny.device.type == "cuda" else "lean")
    for seed in range(3):
        rnd = random.Random(seed)
        prompt = [rnd.randrange(vocab) for _ in range(rnd.randrange(5, 30))]
        truth = reference(tiny, prompt)
        sources = draft_sources(prompt, truth, vocab, rnd)
        for name in ("perfect", "partly", "branchy", "all"):
            result = decoder.generate(prompt, sources[name], DecodeConfig(max_new_tokens=N_NEW, budget=16,
                                                                          fit_to_cost=False))
            assert result.tokens == truth, (name, seed)


@pytest.mark.parametrize("lean", ENGINES)
@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_greedy_rest_equals_generate(tiny, budget, lean):
    vocab = tiny.model.config.vocab_size
    decoder = Decoder(tiny, **lean)
    stats = {}
    for seed in range(3):  # 3 prompts x 4 budgets x 14 draft kinds per engine and architecture
        rnd = random.Random(seed * 100 + budget)
        # repetitive prompts give the context lookup something to find
        motif = [rnd.randrange(vocab) for _ in range(rnd.randrange(1, 6))]
        prompt = (motif * 8)[: rnd.randrange(1, 30)] + [rnd.randrange(vocab) for _ in range(rnd.randrange(0, 8))]
        truth = reference(tiny, prompt)
        for name, source in draft_sources(prompt, truth, vocab, rnd).items():
            # whole trees, never cut by the cost curve: this test is about verifying trees of every shape
            config = DecodeConfig(max_new_tokens=N_NEW, budget=budget, fit_to_cost=False)
            result = decoder.generate(prompt, source, config)
            assert result.tokens == truth, (name, seed)
            assert result.finish == "length"
            stats.setdefault(name, []).append(result.tokens_per_step)
    mean = {k: sum(v) / len(v) for k, v in stats.items()}
    # The drafts must really be used: a perfect source accepts several tokens a step; no drafts accept exactly one.
    assert mean["none"] == 1.0
    assert mean["perfect"] > min(budget, 8) * 0.6 + 1 if budget > 1 else mean["perfect"] > 1.9
    assert mean["useless"] < mean["perfect"]


@pytest.mark.parametrize("lean", ENGINES)
def test_cache_reuse_across_calls_stays_exact(tiny, lean):
    """The decoder keeps its cache between calls; prompts sharing a prefix, or not, must still decode exactly."""
    vocab = tiny.model.config.vocab_size
    rnd = random.Random(7)
    decoder = Decoder(tiny, **lean)
    base = [rnd.randrange(vocab) for _ in range(20)]
    prompts = [base, base + [3], base[:10], base[:10] + [4, 5, 6], [9] + base, base + [3, 1]]
    for prompt in prompts:
        truth = reference(tiny, prompt, 20)
        result = decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=20, budget=8))
        assert result.tokens == truth
    # typing recomputes only what changed (the prompt's last token is fed with the first tree, not prefilled)
    decoder.generate(base + [3], NoDrafts(), DecodeConfig(max_new_tokens=2))
    again = decoder.generate(base + [3, 8, 9], NoDrafts(), DecodeConfig(max_new_tokens=2))
    assert again.prefill_tokens == 1


@pytest.mark.parametrize("lean", ENGINES[:2])
def test_a_short_uncached_tail_rides_the_first_step_and_stays_exact(tiny, lean, monkeypatch):
    """What an edit adds to the last prompt (up to CHAIN_TAIL tokens) is computed in the first verification step's
    pass, not in a prefill pass of its own; a longer tail is prefilled first. Both decode exactly."""
    from rest_lsp.engine.decoding import CHAIN_TAIL

    vocab = tiny.model.config.vocab_size
    rnd = random.Random(11)
    decoder = Decoder(tiny, **lean)
    passes: list[int] = []  # rows of every forward pass, prefill or step
    layers = decoder.lean._layers

    def counted(ids, *args, **kwargs):
        passes.append(ids.shape[0])
        return layers(ids, *args, **kwargs)

    monkeypatch.setattr(decoder.lean, "_layers", counted)
    long_prompt = [rnd.randrange(vocab) for _ in range(CHAIN_TAIL + 30)]
    edited = long_prompt + [rnd.randrange(vocab) for _ in range(5)]  # the cache holds long_prompt: 5 new tokens
    for prompt, tail, source in [(long_prompt, None, NoDrafts()), (edited, 5, NoDrafts()),
                                 (edited[:-2], None, ContextLookup()), (edited + edited[-12:], 14, ContextLookup())]:
        truth = reference(tiny, prompt, 12)
        passes.clear()
        result = decoder.generate(prompt, source, DecodeConfig(max_new_tokens=12, budget=8, fit_to_cost=False))
        assert result.tokens == truth
        if tail is None:  # the whole prompt, or the part of it the cache already holds: no chain
            assert len(passes) == result.steps + (1 if prompt is long_prompt else 0)
        else:  # the chain and the root in the first step's pass, no prefill pass
            assert len(passes) == result.steps and passes[0] >= tail
            assert result.prefill_tokens == tail - 1


def test_eos_stops_and_is_kept(tiny):
    prompt = [1, 2, 3, 4, 5]
    truth = reference(tiny, prompt, 30)
    eos = truth[12]
    decoder = Decoder(tiny)
    decoder.eos = {eos}
    result = decoder.generate(prompt, NgramDrafts([prompt + truth]), DecodeConfig(max_new_tokens=30, budget=16))
    first = truth.index(eos)
    assert result.tokens == truth[: first + 1]
    assert result.finish == "eos"


def test_should_stop_is_checked_between_steps(tiny):
    prompt = [5, 6, 7]
    seen = []

    def stop(new):
        seen.append(len(new))
        return len(new) >= 5

    result = Decoder(tiny).generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=30), should_stop=stop)
    assert result.finish == "stopped" and len(result.tokens) == 5 and seen == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("lean", ENGINES)
def test_default_model_greedy_rest_equals_generate(default_model, lean):
    tok = default_model.tokenizer
    prompt_text = (
        "import os\n\n\ndef list_python_files(folder):\n"
        '    """Return the paths of the Python files under folder."""\n'
        "    result = []\n    for root, dirs, files in os.walk(folder):\n"
    )
    prompt = tok.encode(prompt_text)
    truth = reference(default_model, prompt, 32)
    decoder = Decoder(default_model, **lean)
    for source in (ContextLookup(), NgramDrafts([prompt + truth]), NgramDrafts([prompt + corrupted(truth, 3, 49152, random.Random(0))])):
        result = decoder.generate(prompt, source, DecodeConfig(max_new_tokens=32, budget=16))
        assert result.tokens == truth


def test_full_logits_path_stays_exact(tiny):
    """Models whose logits are not just head(hidden) run the full forward; that path must be exact too."""
    decoder = Decoder(tiny, lean=False)
    assert decoder.body is not None  # Llama and Qwen2 split their head
    decoder.body = decoder.head = None
    rnd = random.Random(11)
    for _ in range(3):
        prompt = [rnd.randrange(97) for _ in range(12)] * 2
        truth = reference(tiny, prompt, 24)
        result = decoder.generate(prompt, NgramDrafts([prompt + corrupted(truth, 5, 97, rnd)]), DecodeConfig(max_new_tokens=24, budget=16))
        assert result.tokens == truth


class Oracle:
    """Proposes a chain after the prompt: the true continuation (or its tokens shifted by one: always wrong),
    with the same ratio at every node. It claims a long match, like a source that found the spot verbatim."""

    def __init__(self, name, prompt, truth, vocab, ratio, wrong=False):
        self.name, self.prompt, self.truth, self.vocab, self.ratio, self.wrong = name, prompt, truth, vocab, ratio, wrong

    def propose(self, context):
        done = len(context) - len(self.prompt)
        chain = self.truth[done : done + 6]
        if self.wrong:
            chain = [(t + 1) % self.vocab for t in chain]
        if not chain:
            return []
        n = len(chain)
        return [Proposal(self.name, 8, tuple(chain), tuple(range(-1, n - 1)), (self.ratio,) * n)]


def test_learned_acceptance_follows_what_the_model_accepts(tiny):
    """A source whose drafts are always rejected stops being drafted; one that is always accepted gets deeper trees."""
    vocab = tiny.model.config.vocab_size
    rnd = random.Random(5)
    prompt = [rnd.randrange(vocab) for _ in range(16)]
    truth = reference(tiny, prompt, 120)
    decoder = Decoder(tiny)
    # a CPU's curve, on any device, whatever a step of this tiny model costs here: a node must earn its cost
    decoder.costs = StepCosts(PACKINGS["onednn"].step_cost, "measured", learn=False)

    liar = Oracle("liar", prompt, truth, vocab, ratio=1.0, wrong=True)
    first = decoder.generate(prompt, liar, DecodeConfig(max_new_tokens=40))
    trees = []
    decoder.verify = _spy(decoder.verify, trees)
    late = decoder.generate(prompt, liar, DecodeConfig(max_new_tokens=40))
    assert first.tokens == late.tokens == truth[:40]
    assert decoder.acceptance.scale(bucket("liar", 8, 1)) < PRIOR_SCALE  # below what it was before any evidence
    assert max(trees) == 1  # no more drafts from the liar: every step is a plain step

    trees.clear()
    shy = Oracle("shy", prompt, truth, vocab, ratio=0.5)  # right every time, but claims 50%
    runs = [decoder.generate(prompt, shy, DecodeConfig(max_new_tokens=120)) for _ in range(3)]
    assert all(r.tokens == truth for r in runs)
    assert decoder.acceptance.probability(bucket("shy", 8, 3), 0.5) > 0.9
    # deeper trees as the evidence grows: the first tree is cut short, later ones hold the whole 6-token chain
    assert trees[0] < 7 and trees[-6:-1] == [7] * 5  # (the very last step has one token left to draft)
    assert runs[-1].tokens_per_step >= 6


def _spy(verify, sizes):
    def wrapped(tree, *chain):
        sizes.append(len(tree))
        return verify(tree, *chain)

    return wrapped


def test_default_model_with_every_source(default_model):
    """The real model with the drafts the server uses, the fallback learned while decoding, stays exact."""
    tok = default_model.tokenizer
    text = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
    prompt = tok.encode(text)
    truth = reference(default_model, prompt, 24)
    workspace = Datastore()
    workspace.put("ops.py", tok.encode("def div(a, b):\n    return a / b\n"))
    outputs, recycle = OutputStore(), SuccessorTable()
    decoder = Decoder(default_model)
    for _ in range(2):  # the second run has the first's outputs and habits to draw on
        drafts = rest_drafts(workspace, suffix=tok.encode("\n\ndef neg(a):\n    return -a\n"), outputs=outputs,
                             recycle=recycle)
        result = decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=24, budget=16))
        assert result.tokens == truth
        outputs.add(prompt[-16:], result.tokens)
    assert len(recycle) > 0 and result.tokens_per_step > 2


def test_default_model_with_a_known_start(default_model):
    """A prompt that ends before a body's indentation (the server holds it back): drafting the run the model
    writes there, with every source's drafts below it, stays exact, and the run is accepted in the first step."""
    from rest_lsp.service.prompt import held_tokens

    tok = default_model.tokenizer
    prompt = tok.encode("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):")
    truth = reference(default_model, prompt, 16)
    start = held_tokens(tok.hf, "\n    ")
    assert truth[: len(start)] == list(start)
    workspace = Datastore()
    workspace.put("ops.py", tok.encode("def div(a, b):\n    return a / b\n"))
    decoder = Decoder(default_model)
    drafts = rest_drafts(workspace, outputs=OutputStore(), recycle=SuccessorTable(), held=(len(prompt), start))
    steps = []  # the tokens each step took
    real = decoder.accept

    def accept(*args):
        out = real(*args)
        steps.append(out[0])
        return out

    decoder.accept = accept
    result = decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=16, budget=16))
    assert result.tokens == truth
    assert steps[0][: len(start)] == list(start) and len(steps[0]) > len(start)
    # as a one-line suggestion: the drafts below the first line's end are cut, the output is the same
    lines = TokenLines(lambda t: tok.decode([t]))
    one_line = rest_drafts(workspace, outputs=OutputStore(), recycle=SuccessorTable(), held=(len(prompt), start),
                           first_line=(len(prompt), lines, False))
    sizes = []  # (nodes the inner sources proposed, nodes left) per step
    cut = one_line.propose

    def spy(context):
        got = cut(context)
        sizes.append((sum(map(len, propose(one_line.inner, context))), sum(map(len, got))))
        return got

    one_line.propose = spy
    assert Decoder(default_model).generate(prompt, one_line, DecodeConfig(max_new_tokens=16, budget=16)).tokens == truth
    assert any(left < full for full, left in sizes)  # the line below "return a * b" was drafted, and cut


WINDOW = 16


def _loaded(model) -> LoadedModel:
    return LoadedModel(model=model.eval(), tokenizer=None, device=torch.device("cpu"), dtype=torch.float32,
                       name=type(model).__name__)


def _reference(loaded: LoadedModel, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _sliding(arch: str) -> LoadedModel:
    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None, sliding_window=WINDOW)
    if arch == "mistral":
        return _loaded(MistralForCausalLM(MistralConfig(**common)))
    # Qwen2: layer 0 full attention, layer 1 windowed
    return _loaded(Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=True, max_window_layers=1)))


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_sliding_window_models_decode_like_generate_past_the_window(arch):
    loaded = _sliding(arch)
    rnd = random.Random(0)
    decoder = Decoder(loaded)  # one decoder for all: its cache is reused and cropped across prompts
    for plen, perfect in ((40, False), (40, True), (9, True), (30, True)):
        prompt = [rnd.randrange(97) for _ in range(plen)]
        truth = _reference(loaded, prompt, 24)
        drafts = NgramDrafts([prompt + truth]) if perfect else NoDrafts()
        got = decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=24, budget=6, fit_to_cost=False))
        assert got.tokens == truth, (arch, plen, perfect)
    # a prompt that shares a prefix with the last sequence reuses the cache past the window
    prompt = prompt + truth[:10]
    assert decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=12, budget=6)).tokens == \
        _reference(loaded, prompt, 12)


ROPE_SWITCH = 32


def _longrope() -> LoadedModel:
    torch.manual_seed(0)
    half = 64 // 4 // 2
    config = Phi3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        original_max_position_embeddings=ROPE_SWITCH, bos_token_id=None, eos_token_id=None,
                        pad_token_id=None, sliding_window=None,
                        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * half,
                                         "long_factor": [float(4 + i) for i in range(half)],
                                         "original_max_position_embeddings": ROPE_SWITCH})
    model = Phi3ForCausalLM(config)
    with torch.no_grad():  # sharp logits and attention, so that a wrong rotation changes the argmax
        model.lm_head.weight.mul_(4.0)
        for layer in model.model.layers:
            layer.self_attn.qkv_proj.weight[: 2 * 64].mul_(6.0)
    return _loaded(model)


def test_long_rope_models_decode_like_generate_across_the_switch():
    loaded = _longrope()
    rnd = random.Random(0)
    decoder = Decoder(loaded)
    for plen in (20, 26, 31, 32, 33, 40, 12):  # below, at and past the switch, then back below on the same cache
        prompt = [rnd.randrange(97) for _ in range(plen)]
        truth = _reference(loaded, prompt, 20)
        for drafts in (NoDrafts(), NgramDrafts([prompt + truth])):
            got = decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=20, budget=8, fit_to_cost=False))
            assert got.tokens == truth, (plen, type(drafts).__name__)


class _FakeOOM(RuntimeError):
    pass


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
def test_a_pass_that_fails_in_a_middle_layer_leaves_the_decoder_exact(lean, monkeypatch):
    torch.manual_seed(0)
    loaded = _loaded(LlamaForCausalLM(LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None)))
    armed = []

    def fail_once(module, args):
        if armed and args[0].shape[1] > 1:  # a tree, like an out-of-memory on the biggest step
            armed.clear()
            raise _FakeOOM("out of memory (simulated in layer 2)")

    loaded.model.model.layers[2].register_forward_pre_hook(fail_once)
    rnd = random.Random(0)
    prompt = [rnd.randrange(97) for _ in range(30)]
    truth = _reference(loaded, prompt, 20)
    decoder = Decoder(loaded, lean=lean)
    if lean:  # our own layers, run in Python (where a hook can fail one): fail in layer 2, on trees only
        decoder.lean = LeanLlama(loaded.model, decoder.max_context, script=False)

        def fail_once_lean(module, args):
            if armed and args[0].shape[0] > 1:  # x [n, H]
                armed.clear()
                raise _FakeOOM("out of memory (simulated in layer 2)")

        decoder.lean.layers[2].register_forward_pre_hook(fail_once_lean)
    decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=4, budget=8))  # a warm cache
    armed.append(1)
    with pytest.raises(_FakeOOM):
        decoder.generate(prompt, NgramDrafts([prompt + truth]), DecodeConfig(max_new_tokens=20, budget=8,
                                                                              fit_to_cost=False))
    if lean:
        assert decoder._cache.length == len(decoder._cached)
    else:
        lengths = {layer.get_seq_length() for layer in decoder._cache.layers}
        assert lengths == {len(decoder._cached)}, lengths
    for p in (prompt, prompt[:25] + [1, 2], prompt + truth[:3]):
        assert decoder.generate(p, ContextLookup(), DecodeConfig(max_new_tokens=12, budget=8)).tokens == \
            _reference(loaded, p, 12)


def test_crop_cuts_every_layer_to_the_kept_length():
    loaded = tiny_model("llama")
    decoder = Decoder(loaded, lean=False)  # the DynamicCache path: layers can differ in length
    prompt = list(range(3, 40))
    decoder.prefill(prompt)
    first = decoder._cache.layers[0]  # layer 0 alone got 5 more rows, as after a pass failing in layer 1
    first.keys = torch.cat([first.keys, first.keys[:, :, :5]], dim=2)
    first.values = torch.cat([first.values, first.values[:, :, :5]], dim=2)
    decoder.prefill(prompt[:20] + [1, 2, 3])
    assert [layer.get_seq_length() for layer in decoder._cache.layers] == [23, 23]
    p = prompt[:20] + [1, 2, 3, 4]
    assert decoder.generate(p, NoDrafts(), DecodeConfig(max_new_tokens=8, budget=0)).tokens == \
        _reference(loaded, p, 8)


def test_draft_ids_outside_the_vocabulary_are_dropped():
    loaded = tiny_model("llama")  # 97 tokens
    prompt = [5, 6, 7, 8]
    truth = _reference(loaded, prompt, 12)
    bad = NgramDrafts([prompt + [97, 150, 3], prompt + truth[:2] + [-1, 4000]])  # a datastore of another tokenizer
    got = Decoder(loaded).generate(prompt, bad, DecodeConfig(max_new_tokens=12, budget=8, fit_to_cost=False))
    assert got.tokens == truth
