"""The contract between whatever proposes draft tokens and the decoder, and the sources that see token ids only.

A draft source is given the tokens so far. Its simple form returns the continuations it has seen after the longest
suffix of them it found, each with a weight (a count, or a count scaled by how close its origin is to the user).
Its rich form, `propose`, returns `Proposal`s: the same continuations as a small forest, plus how long a suffix
matched, so that the decoder can learn per source and match length how often the model agrees (acceptance.py).
The decoder merges all proposals into one draft tree; it never asks what a source is.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

Continuation = tuple[tuple[int, ...], float]

MAX_SUFFIX = 16
CONTINUATION_LENGTH = 10
MAX_MATCHES = 2000
# Nodes one proposal may bring: the tree keeps 16-64, and every node costs Python work at each step.
PROPOSAL_NODES = 48
# Occurrences of a query's last token above which a source searches them with numpy, not Python
PYTHON_CANDIDATES = 64
# A match this short is weak evidence; below it the fallback source (the model's own habits) is consulted too.
WEAK_MATCH = 2

_SEP = -1  # between streams: equals no token, so a match or a continuation never crosses it


@dataclass(frozen=True)
class Proposal:
    """What one source proposes on top of the context: a forest of draft tokens.

    `parents[i]` is the index of node i's parent in this proposal, -1 for a child of the context's last token;
    parents come first. `ratios[i]` is the source's own estimate of P(node i | its parent was accepted): the
    share of its continuations through the parent that go on through node i. The decoder calibrates it.
    `under`: tokens the forest hangs below instead (a start of the output that another source proposes; this one
    does not vote on them).
    """

    source: str
    match_length: int  # context tokens the source matched (0: not from a match)
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    ratios: tuple[float, ...]
    under: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_continuations(
        cls, source: str, match_length: int, continuations: Sequence[Continuation], max_nodes: int = PROPOSAL_NODES
    ) -> "Proposal":
        """Merge continuations into a trie (a shared prefix is one node) and keep its `max_nodes` likeliest nodes."""
        trie: list[dict[int, int]] = [{}]
        weight = [0.0]
        for tokens, w in continuations:
            if w <= 0:
                continue
            node = 0
            for t in tokens:
                nxt = trie[node].get(t)
                if nxt is None:
                    nxt = len(trie)
                    trie[node][t] = nxt
                    trie.append({})
                    weight.append(0.0)
                weight[nxt] += w
                node = nxt
        weight[0] = sum(weight[c] for c in trie[0].values())
        if weight[0] <= 0:
            return cls(source, match_length, (), (), ())
        # best-first by path share (= weight / total), which never exceeds the parent's: kept nodes keep parents
        out_tokens: list[int] = []
        out_parents: list[int] = []
        out_ratios: list[float] = []
        frontier = [(-weight[c] / weight[0], c, t, 0, -1) for t, c in trie[0].items()]
        heapq.heapify(frontier)
        while frontier and len(out_tokens) < max_nodes:
            _, node, token, parent_node, parent = heapq.heappop(frontier)
            index = len(out_tokens)
            out_tokens.append(token)
            out_parents.append(parent)
            out_ratios.append(weight[node] / weight[parent_node])
            for t, c in trie[node].items():
                heapq.heappush(frontier, (-weight[c] / weight[0], c, t, node, index))
        return cls(source, match_length, tuple(out_tokens), tuple(out_parents), tuple(out_ratios))

    def prefix(self, k: int) -> "Proposal":
        """The first k nodes: a whole forest (parents come first), its likeliest nodes where the source lists them
        best first (from_continuations and the successor table do)."""
        if k >= len(self.tokens):
            return self
        return dataclasses.replace(self, tokens=self.tokens[:k], parents=self.parents[:k], ratios=self.ratios[:k])

    def kept(self, keep: Sequence[bool]) -> "Proposal":
        """The nodes that `keep` marks, less the descendants of any it drops (indices renumbered)."""
        if len(keep) != len(self.tokens):
            raise ValueError(f"{len(keep)} marks for {len(self.tokens)} nodes")
        if all(keep):
            return self
        where: list[int] = []  # old index -> new index, -1 when dropped
        tokens, parents, ratios = [], [], []
        for t, parent, ratio, wanted in zip(self.tokens, self.parents, self.ratios, keep):
            if not wanted or (parent >= 0 and where[parent] < 0):
                where.append(-1)
                continue
            where.append(len(tokens))
            tokens.append(t)
            parents.append(-1 if parent < 0 else where[parent])
            ratios.append(ratio)
        return dataclasses.replace(self, tokens=tuple(tokens), parents=tuple(parents), ratios=tuple(ratios))


def mix_of(source) -> "DraftMix | None":
    """The draft mix inside `source` (itself, or under its wrappers), None where there is none."""
    while source is not None and not isinstance(source, DraftMix):
        source = getattr(source, "inner", None)
    return source


class DraftSource(Protocol):
    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        """Continuations of the longest suffix of `context` found, heaviest first."""
        ...


def propose(source: DraftSource, context: Sequence[int], name: str | None = None) -> list[Proposal]:
    """A source's proposals: its own `propose` when it has one, else its continuations as one proposal."""
    if hasattr(source, "propose"):
        found = source.propose(context)
    else:
        conts = source.continuations(context)
        found = [Proposal.from_continuations(type(source).__name__, 0, conts)] if conts else []
    if name is not None:
        found = [dataclasses.replace(p, source=name) for p in found]
    return [p for p in found if len(p)]


class NoDrafts:
    """Plain autoregressive decoding: every tree is empty."""

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        return []


def _longest_match(
    corpus: np.ndarray, candidates: np.ndarray, query: np.ndarray, max_suffix: int, length: int, max_matches: int
) -> tuple[int, list[Continuation]]:
    """`candidates` are corpus positions holding query[-1]; keep those matching the longest suffix of `query`.

    Returns (matched length, continuations): each survivor contributes the tokens after it, up to `length`, cut at
    a stream separator.
    """
    if candidates.size == 0:
        return 0, []
    matched = np.ones(candidates.size, dtype=np.int64)
    alive = np.ones(candidates.size, dtype=bool)
    for k in range(1, min(max_suffix, len(query))):
        pos = candidates - k
        ok = alive & (pos >= 0)
        ok[ok] = corpus[pos[ok]] == query[-1 - k]
        if not ok.any():
            break
        matched[ok] += 1
        alive = ok
    best = int(matched.max())
    starts = candidates[matched == best][-max_matches:] + 1  # most recent occurrences when capped
    return best, _tallied(tuple(corpus[s : s + length].tolist()) for s in starts.tolist())


def _tallied(following: Iterable[tuple[int, ...]]) -> list[Continuation]:
    """The distinct continuations among `following` (each cut at a stream separator, empty ones dropped), counted,
    the most frequent first (ties in order of first appearance)."""
    counts: dict[tuple[int, ...], float] = {}
    for cont in following:
        if _SEP in cont:
            cont = cont[: cont.index(_SEP)]
        if cont:
            counts[cont] = counts.get(cont, 0.0) + 1.0
    return sorted(counts.items(), key=lambda kv: -kv[1])


def _longest_match_listed(corpus: Sequence[int], candidates: list[int], query: Sequence[int], max_suffix: int,
                          length: int, max_matches: int) -> tuple[int, list[Continuation]]:
    """_longest_match over Python sequences, for few candidates: the same answer without numpy's per-call cost."""
    if not candidates:
        return 0, []
    limit, end = min(max_suffix, len(query)), len(query) - 1
    lengths = []
    for i in candidates:  # the match ending at corpus[i]: how far back it agrees with the query's end
        k = 1
        while k < limit and k <= i and corpus[i - k] == query[end - k]:
            k += 1
        lengths.append(k)
    best = max(lengths)
    starts = [i + 1 for i, k in zip(candidates, lengths) if k == best][-max_matches:]
    return best, _tallied(tuple(corpus[s : s + length]) for s in starts)


class _MatchingSource:
    """A source that finds the longest match and its continuations; `propose` wraps them with the match length."""

    name = "drafts"

    def match(self, context: Sequence[int]) -> tuple[int, list[Continuation]]:
        raise NotImplementedError

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        return self.match(context)[1]

    def propose(self, context: Sequence[int]) -> list[Proposal]:
        length, conts = self.match(context)
        return [Proposal.from_continuations(self.name, length, conts)] if conts else []


class ContextLookup(_MatchingSource):
    """Prompt lookup over the context itself: the prompt plus everything generated so far."""

    name = "context"

    def __init__(self, max_suffix: int = MAX_SUFFIX, length: int = CONTINUATION_LENGTH, max_matches: int = MAX_MATCHES):
        self.max_suffix, self.length, self.max_matches = max_suffix, length, max_matches

    def match(self, context: Sequence[int]) -> tuple[int, list[Continuation]]:
        """_longest_match's answer over the context, found in Python where the last token occurs at most
        PYTHON_CANDIDATES times (a step's context is a list: converting it for numpy each step cost more than the
        search), else by _longest_match itself."""
        n = len(context)
        if n < 2:
            return 0, []
        seq = context if isinstance(context, (list, tuple)) else list(context)
        candidates = _occurrences(seq, seq[-1], n - 1)  # the last position is the query itself, never its own match
        if len(candidates) > PYTHON_CANDIDATES:
            ctx = np.asarray(seq, dtype=np.int64)
            return _longest_match(ctx, np.asarray(candidates, dtype=np.int64), ctx, self.max_suffix, self.length,
                                  self.max_matches)
        return _longest_match_listed(seq, candidates, seq, self.max_suffix, self.length, self.max_matches)


def _occurrences(seq: list[int] | tuple[int, ...], token: int, end: int) -> list[int]:
    """The positions before `end` that hold `token`, ascending (list.index scans in C)."""
    found, i = [], -1
    try:
        while True:
            i = seq.index(token, i + 1, end)
            found.append(i)
    except ValueError:
        return found


class NgramDrafts(_MatchingSource):
    """An in-memory index of fixed token streams (the files of a folder, a prompt); streams never run together."""

    def __init__(
        self,
        streams: Iterable[Sequence[int]],
        max_suffix: int = MAX_SUFFIX,
        length: int = CONTINUATION_LENGTH,
        max_matches: int = MAX_MATCHES,
        name: str = "ngram",
    ):
        parts: list[np.ndarray] = []
        for s in streams:
            parts.append(np.asarray(s, dtype=np.int64))
            parts.append(np.array([_SEP], dtype=np.int64))
        self.corpus = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
        # positions grouped by token: one sort now, a binary search per query
        self._order = np.argsort(self.corpus, kind="stable")
        self._sorted = self.corpus[self._order]
        self.max_suffix, self.length, self.max_matches = max_suffix, length, max_matches
        self.name = name
        self._listed: list[int] | None = None  # the corpus as a list, made on the first search of few candidates

    def match(self, context: Sequence[int]) -> tuple[int, list[Continuation]]:
        if not len(context) or not self.corpus.size:
            return 0, []
        last = context[-1]
        lo, hi = np.searchsorted(self._sorted, [last, last + 1])
        candidates = self._order[lo:hi]  # ascending: the sort was stable
        if hi - lo <= PYTHON_CANDIDATES:
            if self._listed is None:
                self._listed = self.corpus.tolist()
            return _longest_match_listed(self._listed, candidates.tolist(), list(context[-self.max_suffix :]),
                                         self.max_suffix, self.length, self.max_matches)
        query = np.asarray(context[-self.max_suffix :], dtype=np.int64)
        return _longest_match(self.corpus, candidates, query, self.max_suffix, self.length, self.max_matches)


class SuffixDrafts(NgramDrafts):
    """The text after the cursor: a line being re-typed, a call matching a definition below (models without FIM; a
    FIM prompt holds it already)."""

    name = "suffix"

    def __init__(self, suffix: Sequence[int]):
        super().__init__([suffix], name=self.name)


class OutputStore(_MatchingSource):
    """The model's own recent outputs, each after the context tokens it followed: a bounded, recent store.

    An editor asks at the same places again and again (the next line, the same line after a keystroke); what the
    model wrote there a moment ago, shown or not, is the best guess of what it will write now. Oldest outputs go
    first once `max_tokens` is exceeded. The index is rebuilt lazily, at the first query after a change.
    """

    name = "outputs"

    def __init__(self, max_tokens: int = 1 << 16, max_suffix: int = MAX_SUFFIX, length: int = CONTINUATION_LENGTH):
        self.max_tokens, self.max_suffix, self.length = max_tokens, max_suffix, length
        self._streams: deque[tuple[int, ...]] = deque()
        self._tokens = 0
        self._index: NgramDrafts | None = None

    def __len__(self) -> int:
        return len(self._streams)

    def add(self, context_tail: Sequence[int], output: Sequence[int]) -> None:
        if not output:
            return
        stream = tuple(context_tail) + tuple(output)
        self._streams.append(stream)
        self._tokens += len(stream)
        while self._tokens > self.max_tokens and len(self._streams) > 1:
            self._tokens -= len(self._streams.popleft())
        self._index = None

    def match(self, context: Sequence[int]) -> tuple[int, list[Continuation]]:
        if not self._streams:
            return 0, []
        index = self._index
        if index is None:
            index = self._index = NgramDrafts(list(self._streams), self.max_suffix, self.length, name=self.name)
        return index.match(context)


class SuccessorTable:
    """The model's own habits: for each token id, its likeliest next tokens, from logits already computed.

    Token Recycling's idea (arXiv 2408.08696): every verification step computes the model's distribution after
    the tokens it visits; keeping each one's top-k gives drafts when retrieval finds nothing. The decoder feeds it
    through `observe_successors`; `propose` expands the table best-first into a small tree.
    """

    name = "recycle"

    def __init__(self, k: int = 8, max_nodes: int = 24, max_depth: int = 6):
        self.k, self.max_nodes, self.max_depth = k, max_nodes, max_depth
        self._ids: dict[int, np.ndarray] = {}  # token -> [k] ids, likeliest first
        self._probs: dict[int, np.ndarray] = {}  # token -> [k] probabilities

    def __len__(self) -> int:
        return len(self._ids)

    def observe_successors(self, token: int, ids: Sequence[int], probs: Sequence[float]) -> None:
        self._ids[int(token)] = np.asarray(ids[: self.k], dtype=np.int64)
        self._probs[int(token)] = np.asarray(probs[: self.k], dtype=np.float64)

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        return []  # a tree, not continuations: see propose

    def propose(self, context: Sequence[int]) -> list[Proposal]:
        if not len(context) or int(context[-1]) not in self._ids:
            return []
        tokens: list[int] = []
        parents: list[int] = []
        ratios: list[float] = []
        # (-path probability, order, token, parent index, probability given the parent, depth)
        frontier: list[tuple[float, int, int, int, float, int]] = []
        order = 0

        def expand(token: int, parent: int, path_p: float, depth: int) -> None:
            nonlocal order
            if depth > self.max_depth or token not in self._ids:
                return
            for t, p in zip(self._ids[token].tolist(), self._probs[token].tolist()):
                if p > 0:
                    heapq.heappush(frontier, (-path_p * p, order, t, parent, p, depth))
                    order += 1

        expand(int(context[-1]), -1, 1.0, 1)
        while frontier and len(tokens) < self.max_nodes:
            neg, _, token, parent, p, depth = heapq.heappop(frontier)
            tokens.append(token)
            parents.append(parent)
            ratios.append(p)
            expand(token, len(tokens) - 1, -neg, depth + 1)
        return [Proposal(self.name, 0, tuple(tokens), tuple(parents), tuple(ratios))]


class DatastoreDrafts:
    """The workspace datastore as a draft source (duck-typed: anything with `lookup(context, limit, weighted)`)."""

    name = "workspace"

    def __init__(self, datastore, limit: int = 64):
        self.datastore, self.limit = datastore, limit

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        return self.datastore.lookup(context, limit=self.limit, weighted=True).continuations

    def propose(self, context: Sequence[int]) -> list[Proposal]:
        found = self.datastore.lookup(context, limit=self.limit, weighted=True)
        if not found.continuations:
            return []
        return [Proposal.from_continuations(self.name, found.match_length, found.continuations)]


class _Wrapper:
    """A source around another: the model's habits still reach the inner one."""

    inner: DraftSource

    def observe_successors(self, token: int, ids: Sequence[int], probs: Sequence[float]) -> None:
        if hasattr(self.inner, "observe_successors"):
            self.inner.observe_successors(token, ids, probs)

    @property
    def wants_successors(self) -> bool:
        return getattr(self.inner, "wants_successors", hasattr(self.inner, "observe_successors"))


class KnownStart(_Wrapper):
    """Drafts for an output whose start is known: `start`, due right after the first `at` context tokens.

    A prompt can end before text that is already written: the whitespace before the cursor that the prompt holds
    back (prompt.held_back: an auto-indented line start, which the model writes itself, the line break and the
    indentation in one or a few tokens). The model almost always writes it, and every continuation that does not
    begin with it is wasted: the sources, asked what follows the prompt, propose the rest of the line above as often
    as a line break, and line breaks at other indentations. So right after the prompt `start` is proposed as a
    chain (source "held"), and the other sources are asked what follows the context *and* `start`, their proposals
    hung under it. Anywhere else they are asked as they are.
    """

    name = "held"

    def __init__(self, inner: DraftSource, at: int, start: Sequence[int]):
        self.inner, self.at, self.start = inner, at, tuple(int(t) for t in start)

    def _due(self, context: Sequence[int]) -> bool:
        return bool(self.start) and len(context) == self.at

    def propose(self, context: Sequence[int]) -> list[Proposal]:
        if not self._due(context):
            return propose(self.inner, context)
        k = len(self.start)
        own = Proposal(self.name, 0, self.start, tuple(range(-1, k - 1)), (1.0,) * k)
        below = propose(self.inner, [*context, *self.start])
        return [own] + [dataclasses.replace(p, under=self.start + p.under) for p in below]

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        if not self._due(context):
            return self.inner.continuations(context)
        below = self.inner.continuations([*context, *self.start])
        return [(self.start, 1.0)] + [(self.start + tuple(c), w) for c, w in below]


class PromptView(_Wrapper):
    """Drafts for a prompt that does not end where the output begins: a FIM prompt ends with the text after the
    cursor and the middle marker, tokens no file holds, so every source matching the context's end found nothing
    until the output had a few tokens of its own. The sources are asked with `view` (the file's text around the
    cursor as the prompt tokenized it, ending at the cursor) in place of the first `at` context tokens; what the
    output adds after them follows as it is. Proposals hang after the context's end either way."""

    def __init__(self, inner: DraftSource, at: int, view: Sequence[int]):
        self.inner, self.at, self.view = inner, at, tuple(int(t) for t in view)

    def seen(self, context: Sequence[int]) -> Sequence[int]:
        """The context as the sources see it: [view, the output so far] once the context holds the prompt."""
        if not self.view or len(context) < self.at:
            return context
        return [*self.view, *context[self.at:]]

    def propose(self, context: Sequence[int]) -> list[Proposal]:
        return propose(self.inner, self.seen(context))

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        return self.inner.continuations(self.seen(context))


class TokenLines:
    """What a token's text does to lines: (it holds a line break, text comes before its last break, it holds any
    text), from the tokenizer's decoding of the token alone, memoised per id (a session meets a few thousand ids).

    A token holding part of a character decodes to U+FFFD alone: not counted as text, since the character may be
    whitespace (U+3000 splits so), and a wrong "text" would end a line the stop rules leave open."""

    def __init__(self, decode_one: Callable[[int], str]):
        self._decode_one = decode_one
        self._flags: dict[int, tuple[bool, bool, bool]] = {}

    def of(self, token: int) -> tuple[bool, bool, bool]:
        flags = self._flags.get(token)
        if flags is None:
            text = self._decode_one(token).replace("\ufffd", "")
            head, brk, _ = text.rpartition("\n")
            flags = self._flags[token] = (bool(brk), bool(brk) and bool(head.strip()), bool(text.strip()))
        return flags

    def after(self, token: int, written: bool, any_break: bool = False) -> tuple[bool, bool]:
        """(the token ends an output that holds text already when `written`, whether the output holds text after
        it); with `any_break`, any line break ends it."""
        brk, before, anything = self.of(token)
        return brk and (written or before or any_break), written or anything


class FirstLine(_Wrapper):
    """Drafts for an output that ends at its first line break after text (a one-line suggestion; the output
    begins after the first `at` context tokens), or at any line break with `any_break` (mid-line, nothing held
    back: the stop rules end it at the first).

    Nothing below that break is ever shown: decoding stops there. Yet the sources, continuing text they have
    seen, hang the next line below it, and those nodes took a sixth of the draft rows of the replay's one-line
    suggestions. Each proposal is cut below the node that ends the output, which stays (it is the output's last
    token); the rows go to likelier nodes, or are not paid for.
    """

    def __init__(self, inner: DraftSource, at: int, lines: TokenLines, any_break: bool = False):
        self.inner, self.at, self.lines, self.any_break = inner, at, lines, any_break

    def _scan(self, tokens: Sequence[int], written: bool) -> tuple[int | None, bool]:
        """(the index of the token among `tokens` that ends the output, None if none does; whether the output holds
        text after them), for an output that held text before them when `written`."""
        for i, t in enumerate(tokens):
            ends, written = self.lines.after(t, written, self.any_break)
            if ends:
                return i, written
        return None, written

    def _written(self, context: Sequence[int]) -> bool | None:
        """Whether the output so far holds text; None once it has ended."""
        end, written = self._scan(context[self.at:], False)
        return None if end is not None else written

    def propose(self, context: Sequence[int]) -> list[Proposal]:
        found = propose(self.inner, context)
        written = self._written(context)
        if written is None:
            return found
        return [cut for p in found if (cut := self._cut(p, written)) is not None and len(cut)]

    def _cut(self, prop: Proposal, written: bool) -> Proposal | None:
        end, written = self._scan(prop.under, written)
        if end is not None:
            return None  # the proposal hangs below the end
        text: list[bool] = []  # per node: the output holds text once it is accepted
        ends: list[bool] = []
        keep: list[bool] = []
        for t, parent in zip(prop.tokens, prop.parents):
            end, holds = self.lines.after(t, written if parent < 0 else text[parent], self.any_break)
            keep.append(parent < 0 or not ends[parent])
            ends.append(end)
            text.append(holds)
        return prop.kept(keep)

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        found = self.inner.continuations(context)
        written = self._written(context)
        if written is None:
            return found
        out = []
        for tokens, w in found:
            end, _ = self._scan(tokens, written)
            out.append((tuple(tokens if end is None else tokens[: end + 1]), w))
        return out


class DraftMix:
    """Several named sources in one tree. Each source's proposal keeps its own ratios: a big, distant corpus with
    thousands of matches cannot drown the few, more relevant matches of the current file, and the decoder learns
    how far to trust each source at each match length.

    `fallback` sources are asked only when no other source matched more than WEAK_MATCH tokens. `only` (set by
    whoever decodes, step by step; None: all): the names of the sources asked now, the others left out.
    """

    def __init__(self, sources: Sequence[tuple[str, DraftSource]], fallback: Sequence[tuple[str, DraftSource]] = ()):
        self.sources = list(sources)
        self.fallback = list(fallback)
        self.only: frozenset[str] | None = None

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.sources] + [n for n, _ in self.fallback]

    def propose(self, context: Sequence[int]) -> list[Proposal]:
        only = self.only
        found = [p for name, source in self.sources if only is None or name in only
                 for p in propose(source, context, name)]
        if max((p.match_length for p in found), default=0) <= WEAK_MATCH:
            found += [p for name, source in self.fallback if only is None or name in only
                      for p in propose(source, context, name)]
        return found

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        """Flattened for callers that want plain continuations: each source's weights normalised to sum to 1."""
        merged: dict[tuple[int, ...], float] = {}
        for _, source in self.sources:
            found = source.continuations(context)
            total = sum(w for _, w in found)
            for tokens, w in found if total > 0 else ():
                merged[tokens] = merged.get(tokens, 0.0) + w / total
        return sorted(merged.items(), key=lambda kv: -kv[1])

    def observe_successors(self, token: int, ids: Sequence[int], probs: Sequence[float]) -> None:
        for _, source in self.sources + self.fallback:
            if hasattr(source, "observe_successors"):
                source.observe_successors(token, ids, probs)

    @property
    def wants_successors(self) -> bool:
        return any(hasattr(s, "observe_successors") for _, s in self.sources + self.fallback)


# The sources a user can leave out by name (the server's and the CLI's draft-source settings), in drafting order.
SOURCES = (ContextLookup, SuffixDrafts, OutputStore, DatastoreDrafts, SuccessorTable, KnownStart)
SOURCE_NAMES = tuple(source.name for source in SOURCES)


def rest_drafts(
    workspace=None,
    suffix: Sequence[int] | None = None,
    outputs: OutputStore | None = None,
    recycle: SuccessorTable | None = None,
    exclude: Iterable[str] = (),
    held: tuple[int, Sequence[int]] | None = None,
    first_line: tuple[int, TokenLines, bool] | None = None,
    view: tuple[int, Sequence[int]] | None = None,
) -> DraftMix | PromptView | KnownStart | FirstLine:
    """The drafts REST uses everywhere: the context itself, the text after the cursor, the model's recent outputs,
    the workspace datastore, and the model's own habits as the fallback; with `held` (context length, tokens), the
    start of the output that is known (KnownStart); with `first_line` (context length, the tokens' lines, whether
    any line break ends it), an output that ends at its first line break after text (FirstLine); with `view`
    (prompt length, tokens), the sources see those tokens in place of the prompt (PromptView: a FIM prompt). Any
    source can be absent or excluded by name."""
    skip = set(exclude)
    sources: list = [ContextLookup()]
    if suffix:
        sources.append(SuffixDrafts(suffix))
    if outputs is not None:
        sources.append(outputs)
    if workspace is not None:
        sources.append(DatastoreDrafts(workspace))
    fallback = [recycle] if recycle is not None else []
    drafts: DraftMix | KnownStart = DraftMix([(s.name, s) for s in sources if s.name not in skip],
                                             [(s.name, s) for s in fallback if s.name not in skip])
    if view is not None and view[1]:
        drafts = PromptView(drafts, *view)
    if held is not None and held[1] and KnownStart.name not in skip:
        drafts = KnownStart(drafts, *held)
    return drafts if first_line is None else FirstLine(drafts, *first_line)
