"""The learned acceptance table: its estimates, its persistence, and bad files."""

import json
import logging

from rest_lsp.drafting.acceptance import EXPLORE, PRIOR_SCALE, AcceptanceModel, bucket, match_bucket
from rest_lsp.drafting.draft_tree import build_tree, fit_to_cost
from rest_lsp.drafting.drafts import Proposal


def test_estimates_follow_outcomes_and_fall_back_to_the_source():
    m = AcceptanceModel()
    key = bucket("outputs", 6, 1)
    assert m.scale(key) == PRIOR_SCALE
    assert m.probability(key, 1.0) == PRIOR_SCALE + EXPLORE  # optimism before any evidence
    for _ in range(200):
        m.observe(key, 0.5, True)  # the source says 50%, the model always agrees
    assert m.probability(key, 0.5) == 1.0 and m.scale(key) > 1.8
    # a bucket of the same source never seen borrows the source's scale
    assert m.scale(bucket("outputs", 1, 4)) > 1.2
    assert m.scale(bucket("recycle", 0, 1)) == PRIOR_SCALE
    for _ in range(1000):  # old evidence decays: the last few hundred observations count
        m.observe(key, 1.0, False)
    assert m.probability(key, 1.0) < 0.1
    assert [match_bucket(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 16)] == [0, 1, 2, 3, 3, 4, 4, 5, 5]


def test_only_a_proposals_first_token_is_explored():
    """Trying a new source after a short match costs its first row: deeper nodes are worth what the source has
    shown, not the bonus, so its chain is not taken whole on its word; once the walks accept it, the chain is."""
    m = AcceptanceModel()
    assert m.probability(bucket("new", 2, 1), 1.0) == PRIOR_SCALE + EXPLORE
    assert m.probability(bucket("new", 2, 2), 1.0) == m.probability(bucket("new", 2, 7), 1.0) == PRIOR_SCALE
    chain = Proposal("new", 2, (5, 6, 7, 8, 9, 10), (-1, 0, 1, 2, 3, 4), (1.0,) * 6)
    steep = [0.0, 1.0, 1.4, 1.8, 2.2, 2.6, 3.0, 3.4]
    assert [round(s, 3) for s in build_tree(1, [chain], 8, m).shares] == [1.0, 1.0, 0.5, 0.25, 0.125, 0.062, 0.031]
    assert len(fit_to_cost(build_tree(1, [chain], 8, m), steep)) == 2  # the root and the first token
    for _ in range(30):
        for depth in range(1, 7):
            m.observe(bucket("new", 2, depth), 1.0, True)
            m.observe_node(1.0, True)
    assert len(fit_to_cost(build_tree(1, [chain], 8, m), steep)) == 7  # the whole chain
    # after a long match the chain is the same text again: explored whole from the start
    fresh = AcceptanceModel()
    again = Proposal("new", 9, chain.tokens, chain.parents, chain.ratios)
    assert fresh.probability(bucket("new", 9, 6), 1.0) == PRIOR_SCALE + EXPLORE
    assert len(fit_to_cost(build_tree(1, [again], 8, fresh), steep)) == 7


def test_a_rejected_source_is_cut_from_trees_on_a_steep_cost_curve():
    m = AcceptanceModel()
    prop = Proposal("liar", 8, (5, 6, 7), (-1, 0, 1), (1.0, 1.0, 1.0))
    steep = [0.0, 1.0, 1.4, 1.8, 2.2]
    assert len(fit_to_cost(build_tree(1, [prop], 8, m), steep)) > 1
    for depth in (1, 2, 3):
        for _ in range(20):
            m.observe(bucket("liar", 8, depth), 1.0, False)
    assert len(fit_to_cost(build_tree(1, [prop], 8, m), steep)) == 1


def test_the_table_survives_a_restart(tmp_path):
    m = AcceptanceModel()
    for i in range(50):
        m.observe(bucket("workspace", 3, 2), 0.4, i % 2 == 0)
    path = tmp_path / "acceptance" / "model.json"
    m.save(path, "model-a")
    again = AcceptanceModel.load(path, "model-a")
    assert again.scale(bucket("workspace", 3, 2)) == m.scale(bucket("workspace", 3, 2))
    assert again.scale(bucket("workspace", 9, 1)) == m.scale(bucket("workspace", 9, 1))
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_a_corrupt_or_foreign_table_is_ignored_with_one_log_line(tmp_path, caplog):
    good = AcceptanceModel()
    good.observe(bucket("context", 4, 1), 1.0, False)
    path = tmp_path / "t.json"
    bad_files = {
        "not json": "{oops",
        "foreign model": json.dumps(good.to_json("another-model")),
        "other format": json.dumps({**good.to_json("m"), "format": 99}),
        "bad numbers": json.dumps({**good.to_json("m"), "buckets": [["context", 3, 1, -5, "x"]]}),
        "wrong shape": json.dumps({**good.to_json("m"), "sources": [["context"]]}),
        "a list": "[]",
    }
    for what, text in bad_files.items():
        path.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rest_lsp.drafting.acceptance"):
            table = AcceptanceModel.load(path, "m")
        assert table.observations == 0 and table.scale(bucket("context", 4, 1)) == PRIOR_SCALE, what
        assert len(caplog.records) == 1 and "ignoring" in caplog.records[0].getMessage(), what
    caplog.clear()
    assert AcceptanceModel.load(tmp_path / "missing.json", "m").observations == 0 and not caplog.records


def test_calibration_corrects_what_the_sources_say_together():
    """Nodes the tree gave 0.9 but the model rarely took are worth less next time; ones it always took keep it."""
    table = AcceptanceModel()
    assert table.calibrated(0.9) == 0.9  # no evidence: face value
    for _ in range(200):
        table.observe_node(0.95, accepted=False)
        table.observe_node(0.35, accepted=True)
    assert table.calibrated(0.95) < 0.1
    assert 0.9 < table.calibrated(0.35) <= 1.0  # understated: believed more, never past 1
    assert table.calibrated(0.55) == 0.55  # a bin without evidence is left alone


def test_the_calibration_is_saved_with_the_table(tmp_path):
    table = AcceptanceModel()
    for _ in range(50):
        table.observe_node(0.95, accepted=False)
    table.save(tmp_path / "t.json", "m")
    again = AcceptanceModel.load(tmp_path / "t.json", "m")
    assert again.calibrated(0.95) == table.calibrated(0.95) < 0.5


def test_a_tree_is_built_on_calibrated_probabilities():
    table = AcceptanceModel()
    props = [Proposal("s", 8, (5, 6), (-1, 0), (1.0, 1.0))]
    before = build_tree(4, props, 4, table)
    for _ in range(200):
        table.observe_node(before.chances[1], accepted=False)
    after = build_tree(4, props, 4, table)
    assert after.chances[1] == before.chances[1]  # what the source says is kept for learning
    assert after.shares[1] < before.shares[1] / 4
