"""Each draft source on its own: what it proposes, with which ratios and match lengths, and its bounds."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rest_lsp.drafting import drafts
from rest_lsp.drafting.acceptance import bucket
from rest_lsp.datastore import Datastore
from rest_lsp.drafting.draft_tree import build_tree
from rest_lsp.drafting.drafts import (
    WEAK_MATCH,
    ContextLookup,
    DatastoreDrafts,
    DraftMix,
    FirstLine,
    KnownStart,
    NgramDrafts,
    OutputStore,
    PromptView,
    Proposal,
    SuccessorTable,
    TokenLines,
    propose,
    rest_drafts,
)


def paths(p: Proposal) -> dict[tuple[int, ...], float]:
    """Every node as its token path from the context, with the source's ratio."""
    out, full = {}, []
    for t, parent in zip(p.tokens, p.parents):
        full.append((full[parent] if parent >= 0 else ()) + (t,))
    for path, r in zip(full, p.ratios):
        out[path] = r
    return out


def test_proposal_ratios_are_conditional_shares():
    p = Proposal.from_continuations("x", 3, [((1, 2, 3), 3.0), ((1, 2, 4), 1.0), ((5,), 4.0)])
    got = paths(p)
    assert got == {(1,): 0.5, (5,): 0.5, (1, 2): 1.0, (1, 2, 3): 0.75, (1, 2, 4): 0.25}
    assert all(parent < i for i, parent in enumerate(p.parents))
    assert Proposal.from_continuations("x", 3, [((1, 2, 3), 3.0)] * 5, max_nodes=2).tokens == (1, 2)


def test_context_lookup_reports_its_match_length():
    ctx = [9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    [p] = ContextLookup().propose(ctx)
    assert p.source == "context" and p.match_length == 3 and p.tokens[:2] == (7, 8)


def numpy_search(corpus: list[int], candidates, query: list[int]):
    """_longest_match itself, over numpy arrays: what the sources' Python search must answer."""
    return drafts._longest_match(np.asarray(corpus, dtype=np.int64), np.asarray(candidates, dtype=np.int64),
                                 np.asarray(query, dtype=np.int64), drafts.MAX_SUFFIX, drafts.CONTINUATION_LENGTH,
                                 drafts.MAX_MATCHES)


# few token kinds: long repeats, ties, and last tokens occurring more than PYTHON_CANDIDATES times (numpy's path)
tokens = st.lists(st.integers(0, 4), min_size=0, max_size=400)


@settings(max_examples=150, deadline=None)
@given(context=tokens, kinds=st.integers(1, 5), repeated=st.lists(st.integers(0, 4), max_size=40),
       times=st.integers(0, 3))
def test_the_context_search_answers_as_numpys_does(context, kinds, repeated, times):
    context = [t % kinds for t in context] + repeated * times  # a repeated run: matches up to MAX_SUFFIX long
    if len(context) < 2:
        assert ContextLookup().match(context) == (0, [])
        return
    ctx = np.asarray(context)
    expected = numpy_search(context, np.nonzero(ctx[:-1] == ctx[-1])[0], context)
    assert ContextLookup().match(context) == expected
    assert ContextLookup().match(tuple(context)) == expected


@settings(max_examples=150, deadline=None)
@given(streams=st.lists(tokens, min_size=1, max_size=3), context=st.lists(st.integers(0, 4), min_size=1, max_size=30))
def test_the_ngram_search_answers_as_numpys_does(streams, context):
    source = NgramDrafts(streams)
    if not source.corpus.size:
        assert source.match(context) == (0, [])
        return
    corpus = source.corpus.tolist()
    candidates = [i for i in source._order.tolist() if corpus[i] == context[-1]]
    assert source.match(context) == numpy_search(corpus, sorted(candidates), context[-drafts.MAX_SUFFIX:])


def test_output_store_finds_what_the_model_wrote_after_the_same_context_and_forgets_the_oldest():
    store = OutputStore(max_tokens=30)
    store.add([1, 2, 3], [10, 11, 12])
    [p] = store.propose([7, 7, 1, 2, 3])
    assert p.source == "outputs" and p.match_length == 3 and p.tokens == (10, 11, 12)
    # the next line start: the context now holds the first output line, the rest of the old output follows
    [p] = store.propose([2, 3, 10])
    assert p.tokens == (11, 12) and p.match_length == 3
    for i in range(10):
        store.add([50 + i], [60 + i, 61 + i])
    assert store.propose([1, 2, 3]) == []  # evicted: the store keeps at most 30 tokens, newest first
    assert sum(len(s) for s in store._streams) <= 30 and store.propose([59]) != []
    store.add([1], [])  # an empty output adds nothing
    assert len(store) == 10


def test_successor_table_expands_the_models_habits_best_first():
    table = SuccessorTable(max_nodes=5)
    assert table.propose([3]) == []  # nothing seen after 3 yet
    table.observe_successors(3, [4, 5, 6], [0.7, 0.2, 0.1])
    table.observe_successors(4, [8, 9], [0.9, 0.1])
    [p] = table.propose([1, 3])
    got = paths(p)
    assert p.source == "recycle" and p.match_length == 0
    # path probabilities 0.7, 0.63 (4 then 8), 0.2, 0.1, 0.07: the five best, parents first
    assert got == {(4,): 0.7, (4, 8): 0.9, (5,): 0.2, (6,): 0.1, (4, 9): 0.1}
    table.observe_successors(3, [6], [1.0])  # newer logits replace the old row
    assert paths(table.propose([3])[0])[(6,)] == 1.0


def test_datastore_source_passes_the_match_length():
    ds = Datastore()
    ds.put("a.py", [1, 2, 3, 4, 5])
    [p] = DatastoreDrafts(ds).propose([9, 2, 3])
    assert p.source == "workspace" and p.match_length == 2 and p.tokens[:2] == (4, 5)
    assert DatastoreDrafts(ds).propose([42]) == []


def test_fallback_is_asked_only_when_nothing_matched_well():
    table = SuccessorTable()
    table.observe_successors(3, [7], [0.5])
    strong = NgramDrafts([[1, 2, 3, 4]])
    mix = DraftMix([("near", strong)], fallback=[("recycle", table)])
    assert [p.source for p in mix.propose([1, 2, 3])] == ["near"]  # a 3-token match: no fallback
    assert WEAK_MATCH < 3
    assert [p.source for p in mix.propose([2, 3])] == ["near", "recycle"]  # a 2-token match is weak
    assert [p.source for p in mix.propose([9, 3])] == ["near", "recycle"]
    mix.observe_successors(3, [8], [0.9])  # the mix passes the model's habits on to whoever learns them
    assert table.propose([3])[0].tokens == (8,)


def test_rest_drafts_names_and_exclusions():
    ds = Datastore()
    ds.put("a.py", [1, 2])
    mix = rest_drafts(ds, suffix=[1, 2], outputs=OutputStore(), recycle=SuccessorTable())
    assert mix.names == ["context", "suffix", "outputs", "workspace", "recycle"]
    mix = rest_drafts(ds, suffix=[1, 2], outputs=OutputStore(), recycle=SuccessorTable(), exclude=["suffix", "recycle"])
    assert mix.names == ["context", "outputs", "workspace"]
    held = rest_drafts(ds, held=(5, (7,)))
    assert isinstance(held, KnownStart) and held.inner.names == ["context", "workspace"]
    assert isinstance(rest_drafts(ds, held=(5, (7,)), exclude=["held"]), DraftMix)
    assert isinstance(rest_drafts(ds, held=(5, ())), DraftMix)  # nothing held back


def test_a_known_start_is_drafted_and_the_sources_say_what_follows_it():
    """Right after the prompt, the start the output is known to take comes first, as a chain of its own, and the
    other sources are asked what follows the context and it: their drafts hang below it, and they vote on their
    own nodes only. Anywhere else the sources are asked as they are."""
    # the workspace has the line above followed by a break and text at this indentation (7 = the held-back run),
    # and elsewhere followed by the rest of a longer line (8): without the known start, both compete
    ds = NgramDrafts([[1, 2, 3, 7, 20, 21], [2, 3, 8, 9], [2, 3, 8, 9]], name="workspace")
    mix = DraftMix([("workspace", ds)])
    known = KnownStart(mix, at=3, start=(7,))
    found = known.propose([5, 2, 3])
    assert [(p.source, p.tokens, p.under) for p in found] == [("held", (7,), ()), ("workspace", (20, 21), (7,))]
    assert found[1].match_length == 3  # 2 3 7: the known start is part of what the source matched
    tree = build_tree(3, found, 8)
    assert tree.tokens == [3, 7, 20, 21]
    assert [k[0] for k, _ in tree.votes[1]] == ["held"] and [k[0] for k, _ in tree.votes[2]] == ["workspace"]
    assert tree.depths == [0, 1, 2, 3]  # the source's nodes sit at their depth in the tree,
    assert tree.votes[2][0][0] == bucket("workspace", 3, 1)  # and are learned at their depth in its continuation
    plain = build_tree(3, propose(mix, [5, 2, 3]), 8)
    assert 8 in plain.tokens  # what the known start rules out, the plain mix drafts
    # one step later (the start was accepted) the sources are asked as they are
    assert [p.tokens for p in known.propose([5, 2, 3, 7])] == [(20, 21)]
    assert known.continuations([5, 2, 3]) == [((7,), 1.0), ((7, 20, 21), 1.0)]
    assert known.continuations([2, 3]) == mix.continuations([2, 3])
    table = SuccessorTable()
    KnownStart(DraftMix([], fallback=[("recycle", table)]), 3, (7,)).observe_successors(3, [5], [0.9])
    assert table.propose([3])[0].tokens == (5,)  # the model's habits still reach the sources that learn them


def test_sources_that_agree_count_once_and_siblings_share_at_most_one():
    """Agreeing sources are not independent witnesses (the same text reaches several of them): a node takes its
    most confident source's word. Siblings exclude each other, so their probabilities are scaled to sum to 1."""
    a = NgramDrafts([[1, 2, 3, 4], [1, 2, 3, 9]], name="a")  # 4 and 9 share the slot
    b = NgramDrafts([[1, 2, 3, 4]], name="b")
    c = NgramDrafts([[1, 2, 3, 4], [1, 2, 3, 9]], name="c")  # says what a says
    alone = build_tree(3, propose(a, [2, 3]), 8)
    twice = build_tree(3, propose(a, [2, 3]) + propose(c, [2, 3]), 8)
    both = build_tree(3, propose(a, [2, 3]) + propose(b, [2, 3]), 8)
    share = lambda t, token: t.shares[t.tokens.index(token)]  # noqa: E731
    assert share(alone, 4) == 0.5 and share(twice, 4) == 0.5  # a second source saying the same adds nothing
    # b is sure of 4 (1.0), a gives 9 a half: 1.5 in all, scaled down to 2/3 and 1/3
    assert share(both, 4) == pytest.approx(2 / 3) and share(both, 9) == pytest.approx(1 / 3)
    assert len(both.votes[both.tokens.index(4)]) == 2


def test_kept_drops_the_nodes_it_is_told_to_and_their_descendants():
    p = Proposal("x", 2, (1, 2, 3, 4, 5), (-1, 0, 1, -1, 3), (0.5, 1.0, 1.0, 0.5, 1.0))
    k = p.kept([True, False, True, True, True])
    assert (k.tokens, k.parents, k.ratios) == ((1, 4, 5), (-1, -1, 1), (0.5, 0.5, 1.0))
    assert (k.source, k.match_length) == ("x", 2)
    assert p.kept([True] * 5) is p
    with pytest.raises(ValueError):
        p.kept([True] * 4)


# token texts: 1-3 text, 7 a break (with indentation), 8 a break after text ("):\n"), 9 whitespace, 10 part of a
# character (U+3000, whitespace, splits so), 11 text between two breaks
TEXTS = {1: "foo", 2: "(", 3: "bar", 7: "\n    ", 8: "):\n", 9: "  ", 10: "\ufffd", 11: "\n  x\n"}


def test_token_lines_say_what_each_token_does_to_lines_and_decode_each_once():
    asked = []
    lines = TokenLines(lambda t: asked.append(t) or TEXTS[t])
    assert [lines.of(t) for t in (1, 7, 8, 9, 10, 11)] == [
        (False, False, True), (True, False, False), (True, True, True), (False, False, False),
        (False, False, False),  # a part of a character may be whitespace: not text
        (True, True, True)]  # text before its last break: it ends the output even from a clean start
    lines.of(7)
    assert asked == [1, 7, 8, 9, 10, 11]
    assert lines.after(7, written=False) == (False, False) and lines.after(7, written=True) == (True, True)
    assert lines.after(7, written=False, any_break=True) == (True, False)


def test_a_one_line_output_gets_no_drafts_below_the_end_of_its_first_line():
    """The output ends at its first line break after text: a break at the start (the held-back indentation) does
    not end it, the break after text does and stays drafted, and nothing below it is."""
    lines = TokenLines(TEXTS.__getitem__)
    # a line start: the output begins with the break and indentation (7), then text, a break, the next line
    inner = NgramDrafts([[5, 5, 7, 1, 2, 3, 7, 1, 2]])
    one = FirstLine(inner, at=2, lines=lines)
    [p] = one.propose([5, 5])
    assert p.tokens == (7, 1, 2, 3, 7)  # the second break ends the output: its line below is cut
    [p] = one.propose([5, 5, 7, 1])  # the output holds text already: the next break ends it
    assert p.tokens == (2, 3, 7)
    assert one.continuations([5, 5, 7, 1]) == [((2, 3, 7), 1.0)]
    # a break that follows text in the same token ends the output even when nothing was written before it
    assert [p.tokens for p in FirstLine(NgramDrafts([[5, 5, 8, 1, 2]]), 2, lines).propose([5, 5])] == [(8,)]
    # after the end (decoding went on past it) the drafts are left as they are
    assert [p.tokens for p in one.propose([5, 5, 1, 7])] == [p.tokens for p in inner.propose([5, 5, 1, 7])]
    # a proposal that hangs below a start that ends the output is dropped; one below a start that does not is cut
    held = KnownStart(NgramDrafts([[5, 5, 7, 1, 7, 3]]), at=2, start=(7,))
    found = FirstLine(held, 2, lines).propose([5, 5])
    assert [(p.source, p.tokens, p.under) for p in found] == [("held", (7,), ()), ("ngram", (1, 7), (7,))]
    assert FirstLine(KnownStart(inner, at=3, start=(8,)), 3, lines).propose([5, 5, 1]) == [
        Proposal("held", 0, (8,), (-1,), (1.0,))]
    # mid-line with nothing held back, any break ends the output; a part of a character is not text
    assert [p.tokens for p in FirstLine(NgramDrafts([[5, 5, 9, 7, 1]]), 2, lines, any_break=True).propose(
        [5, 5])] == [(9, 7)]
    assert [p.tokens for p in FirstLine(NgramDrafts([[5, 5, 10, 7, 1, 7, 2]]), 2, lines).propose([5, 5])] == [
        (10, 7, 1, 7)]


def test_rest_drafts_cut_at_the_first_line_only_when_asked():
    lines = TokenLines(TEXTS.__getitem__)
    ds = NgramDrafts([[1, 2, 3]], name="workspace")
    assert isinstance(rest_drafts(ds, first_line=(4, lines, False)), FirstLine)
    one = rest_drafts(ds, held=(4, (7,)), first_line=(4, lines, True))
    assert one.any_break
    assert isinstance(one, FirstLine) and isinstance(one.inner, KnownStart)
    assert not isinstance(rest_drafts(ds, held=(4, (7,))), FirstLine)


def test_a_prompt_view_shows_the_sources_the_file_around_the_cursor():
    """A FIM prompt ends with the text after the cursor and the middle marker (91 92 below), which no file holds:
    asked with it, the workspace finds nothing. Asked with the view (the text after the cursor, then before it,
    ending at the cursor as the file does), the workspace proposes what followed the prefix there."""
    workspace = DraftMix([("workspace", NgramDrafts([[1, 2, 3, 4, 5, 6]], name="workspace"))])
    prompt = [90, 1, 2, 3, 91, 7, 92]  # prefix marker, the text before the cursor, suffix marker, after, middle
    assert workspace.propose(prompt) == []
    view = PromptView(workspace, at=len(prompt), view=(7, 1, 2, 3))
    found = view.propose(prompt)
    assert [(p.source, p.tokens[:3], p.match_length) for p in found] == [("workspace", (4, 5, 6), 3)]
    assert view.propose([*prompt, 4])[0].tokens[:2] == (5, 6)  # the output so far follows the view
    assert view.continuations(prompt)[0][0][:3] == (4, 5, 6)
    assert view.seen(prompt[:3]) == prompt[:3]  # a context shorter than the prompt is its own
    ds = Datastore()
    ds.put("a.py", [1, 2])
    assert isinstance(rest_drafts(ds, view=(7, (1, 2))), PromptView)
    assert isinstance(rest_drafts(ds, view=(7, ())), DraftMix)  # no FIM: the prompt ends at the cursor already
    held = rest_drafts(ds, view=(7, (1, 2)), held=(7, (5,)))
    assert isinstance(held, KnownStart) and isinstance(held.inner, PromptView)  # the start hangs after the view
