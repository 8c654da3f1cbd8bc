"""How often the model accepts a draft node, learned online per (source, match length, depth).

A source's own estimate of a node is its ratio: the share of the source's continuations through the node's parent
that go on through the node. Ratios overstate agreement in some places (a single 1-token match has a ratio of 1)
and understate it in others (the model's recent outputs at the same spot). Each bucket keeps decayed sums of
drafts accepted and ratios tried; their quotient is the bucket's scale, shrunk towards its source's scale while the
bucket has few observations. P(node accepted | parent accepted) = min(1, scale * ratio), plus, for the first token
of a source's proposal (every token, after a long match), a bonus for thin evidence while choosing trees.

The table knows nothing of models or editors: the decoder feeds it what its walks saw, and whoever owns the decoder
saves it beside the index, so that a restarted server does not start from scratch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 1
PRIOR = 4.0  # pseudo-observations behind each estimate
PRIOR_SCALE = 0.5  # before any evidence, half of what a source claims
DECAY = 0.995  # per observation of a bucket: the last few hundred count
# Optimism while a bucket has little evidence (an upper confidence bound): a source that understates itself is
# tried and can prove it; one that is always wrong loses the bonus after a few tries and is no longer drafted.
# After a short match only a proposal's first token has it: trying a source costs that one row. A deeper node's
# bucket learns only when the walk reaches its parent, which is rare for a weak source, so a bonus there stays
# whole: every node of a new source's chain looked sure, and its trees promised its whole length (docs/LOG.md,
# 2026-12-07 (afternoon)). After a long match the chain is the same text again (the model's own output at the same
# place, a line the workspace holds), and it is explored whole.
EXPLORE = 0.5
EXPLORED_DEPTH = 1  # the deepest bucket with the bonus after a short match
LONG_MATCH = 4  # the match bucket (5-8 tokens) from which every depth has it

Key = tuple[str, int, int]  # (source, match-length bucket, depth bucket)
BINS = 10  # calibration bins over the tree's P(node | parent), [0, 0.1), ..., [0.9, 1]
CALIBRATION_PRIOR = 8.0  # pseudo-observations at face value behind each bin's correction


def match_bucket(length: int) -> int:
    """0 (no match), 1, 2, 3-4, 5-8, 9+: the paper's ablation puts the knee between 2 and 6."""
    if length <= 2:
        return max(0, length)
    return 3 if length <= 4 else 4 if length <= 8 else 5


def depth_bucket(depth: int) -> int:
    return min(depth, 8)


def bucket(source: str, match_length: int, depth: int) -> Key:
    return (source, match_bucket(match_length), depth_bucket(depth))


class AcceptanceModel:
    def __init__(self) -> None:
        self._buckets: dict[Key, list[float]] = {}  # key -> [accepted, ratios tried], decayed
        self._sources: dict[str, list[float]] = {}  # source -> [accepted, ratios tried], decayed
        # per bin of the tree's P(node | parent) as the sources say it: [accepted, sum of that P], decayed. Sources
        # overlap (one continuation is in the suffix, the workspace and earlier outputs alike) and a tree step sees
        # one path, so what the sources say together is calibrated against what the model did.
        self._bins: list[list[float]] = [[0.0, 0.0] for _ in range(BINS)]
        self.observations = 0

    def scale(self, key: Key) -> float:
        src = self._sources.get(key[0], (0.0, 0.0))
        source_scale = (src[0] + PRIOR * PRIOR_SCALE) / (src[1] + PRIOR)
        hits, tried = self._buckets.get(key, (0.0, 0.0))
        return (hits + PRIOR * source_scale) / (tried + PRIOR)

    def factor(self, key: Key) -> float:
        """What a ratio of `key` is multiplied by when choosing the tree: its scale, plus the bonus of thin evidence
        at a proposal's first token, or at any depth after a long match (a deeper bucket after a short match borrows
        its source's scale until it has evidence of its own)."""
        if key[2] > EXPLORED_DEPTH and key[1] < LONG_MATCH:
            return self.scale(key)
        tried = self._buckets.get(key, (0.0, 0.0))[1]
        return self.scale(key) + EXPLORE / math.sqrt(1.0 + tried)

    def probability(self, key: Key, ratio: float) -> float:
        """What a node is worth when choosing the tree: the scaled ratio, optimistic while evidence is thin."""
        return min(1.0, self.factor(key) * ratio)

    def calibrated(self, p: float) -> float:
        """The tree's P(node | parent) corrected by how often nodes given that probability were accepted."""
        hits, said = self._bins[min(BINS - 1, int(p * BINS))]
        prior = CALIBRATION_PRIOR * max(p, 1e-3)
        return min(1.0, p * (hits + prior) / (said + prior))

    def observe_node(self, p: float, accepted: bool) -> None:
        """A tree node whose parent the walk reached, given P(node | parent) = p before calibration."""
        stats = self._bins[min(BINS - 1, int(p * BINS))]
        stats[0] = DECAY * stats[0] + float(accepted)
        stats[1] = DECAY * stats[1] + p

    def observe(self, key: Key, ratio: float, accepted: bool) -> None:
        """A draft node whose parent the walk reached: the model's token was (accepted) or was not its token."""
        for table, k in ((self._buckets, key), (self._sources, key[0])):
            stats = table.setdefault(k, [0.0, 0.0])
            stats[0] = DECAY * stats[0] + float(accepted)
            stats[1] = DECAY * stats[1] + ratio
        self.observations += 1

    # -- persistence -------------------------------------------------------------------------------------------
    def to_json(self, model_key: str) -> dict:
        return {
            "format": FORMAT,
            "model": model_key,
            "buckets": [[*k, *v] for k, v in self._buckets.items()],
            "sources": [[k, *v] for k, v in self._sources.items()],
            "calibration": self._bins,
            "observations": self.observations,
        }

    @classmethod
    def from_json(cls, data: dict, model_key: str) -> "AcceptanceModel":
        """Raises ValueError for anything but a table of this format written for this model."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not an acceptance table of this version")
        if data.get("model") != model_key:
            raise ValueError("written for another model")
        table = cls()
        for row in data["buckets"]:
            source, m, d, hits, tried = row
            table._buckets[(str(source), int(m), int(d))] = [_count(hits), _count(tried)]
        for row in data["sources"]:
            source, hits, tried = row
            table._sources[str(source)] = [_count(hits), _count(tried)]
        bins = data.get("calibration", [[0.0, 0.0]] * BINS)  # absent from tables written before it existed
        if not isinstance(bins, list) or len(bins) != BINS:
            raise ValueError("a calibration of another shape")
        table._bins = [[_count(hits), _count(said)] for hits, said in bins]
        table.observations = int(_count(data.get("observations", 0)))
        return table

    def save(self, path: Path, model_key: str) -> None:
        """Atomically: a crash mid-write leaves the previous table."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(model_key), f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path, model_key: str) -> "AcceptanceModel":
        """The saved table, or a fresh one (with one log line) when it is missing, corrupt or someone else's."""
        try:
            return cls.from_json(json.loads(path.read_text()), model_key)
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, TypeError, KeyError, IndexError) as err:
            log.warning("rest-lsp: ignoring the learned acceptance table %s (%s); starting afresh.", path, err)
            return cls()


def _count(x) -> float:
    value = float(x)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"bad count {x!r}")
    return value


def table_location(cache_dir: Path, model_name: str, dtype: str, device_type: str) -> tuple[Path, str]:
    """(file, key) of a model's table: one per model, dtype and device kind, since each agrees differently."""
    import hashlib

    key = f"{model_name}|{dtype}|{device_type}"
    return cache_dir / "acceptance" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json", key
