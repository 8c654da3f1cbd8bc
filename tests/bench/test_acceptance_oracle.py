"""The acceptance oracle's counting: how far a draft is right, the steps REST would take, the dependencies it
would index. No server here: the benchmark itself drives the real one."""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/ is no installed package: import it from this checkout whatever the working directory
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.acceptance_oracle import (  # noqa: E402
    CAP,
    dependency_files,
    imported_roots,
    losses,
    proposal_depth,
    tree_depth,
    walk,
)
from rest_lsp.drafting.draft_tree import build_tree  # noqa: E402
from rest_lsp.drafting.drafts import Proposal  # noqa: E402


def test_proposal_depth_follows_the_path_through_branches():
    # 1 -> 2 -> 3 and 1 -> 4 -> 5: the truth takes the second branch
    prop = Proposal("workspace", 3, (1, 2, 4, 3, 5), (-1, 0, 0, 1, 2), (1.0, 0.5, 0.5, 1.0, 1.0))
    assert proposal_depth(prop, [1, 4, 5, 9]) == 3
    assert proposal_depth(prop, [1, 2, 7]) == 2
    assert proposal_depth(prop, [7, 1, 2]) == 0  # a right token off the path counts nothing


def test_proposal_depth_counts_under_only_below_a_right_node_of_its_own():
    prop = Proposal("context", 2, (8, 9), (-1, 0), (1.0, 1.0), under=(5, 6))
    assert proposal_depth(prop, [5, 6, 8, 9, 1]) == 4
    assert proposal_depth(prop, [5, 6, 7]) == 0  # the held start was right, this source's drafts were not
    assert proposal_depth(prop, [5, 7, 8]) == 0


def test_tree_depth_is_what_the_walk_accepts():
    tree = build_tree(0, [Proposal("context", 2, (1, 2, 3), (-1, 0, 1), (1.0, 1.0, 1.0))], budget=2)
    assert tree_depth(tree, [1, 2, 3, 4]) == 2  # the budget kept two nodes
    assert tree_depth(tree, [2]) == 0


def test_walk_takes_each_step_its_drafts_and_the_models_token():
    positions = [{"fit": f} for f in (2, 0, 0, 1, 0, 0)]
    # steps start at 0 (accepts 2 + 1), 3 (1 + 1), 5 (the last token)
    assert walk(positions, "fit") == (3, 6)
    # a step never accepts past the continuation's end
    assert walk([{"fit": 5}, {"fit": 5}], "fit") == (1, 2)


def test_walk_with_cap_chain_joins_a_step_that_ran_out_of_drafts():
    n = 2 * (CAP + 1) + 1
    positions = [{"fit": 0, "leaf": False} for _ in range(n)]
    positions[0] = {"fit": CAP, "leaf": True}
    positions[CAP + 1] = {"fit": CAP, "leaf": False}
    assert walk(positions, "fit") == (3, n)
    assert walk(positions, "fit", cap_chain=True) == (2, n)


def test_losses_split_what_the_budget_and_the_cost_cut():
    pos = [{"fit": 1, "budget": 2, "all": 4}, {}, {"fit": 0, "budget": 0, "all": 0}, {"fit": 0, "budget": 0, "all": 0}]
    c = losses([{"positions": pos}])
    # the first step: 1 accepted, 1 more in the budget's tree, 1 more in all drafts (not 2: 3 tokens follow)
    assert (c["steps"], c["accepted"], c["cost_cut"], c["budget_cut"], c["none"], c["last"]) == (3, 1, 1, 1, 1, 1)


def test_dependency_files_leave_out_the_corpus_and_copies_of_it(tmp_path, monkeypatch):
    import sysconfig

    site, stdlib = tmp_path / "site", tmp_path / "stdlib"
    (site / "dep").mkdir(parents=True)
    (site / "dep" / "__init__.py").write_text("x = 1\n")
    (site / "dep" / "_vendor" / "mypkg").mkdir(parents=True)
    (site / "dep" / "_vendor" / "mypkg" / "core.py").write_text("copy = 1\n")
    (site / "mypkg").mkdir()
    (site / "mypkg" / "core.py").write_text("import dep\nimport os\nfrom . import x\n")
    (stdlib / "os.py").parent.mkdir(parents=True)
    (stdlib / "os.py").write_text("sep = '/'\n")
    (stdlib / "test").mkdir()
    (stdlib / "test" / "test_os.py").write_text("pass\n")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(stdlib), "purelib": str(site)})
    assert imported_roots(site / "mypkg") == {"dep", "os"}
    files = [Path(f).relative_to(tmp_path).as_posix() for f in dependency_files(site / "mypkg", 1000)]
    assert files == ["site/dep/__init__.py", "stdlib/os.py"]


def test_replay_decode_counts_what_the_requests_own_sources_would_draft():
    from benchmarks.acceptance_oracle import replay_decode
    from rest_lsp.drafting.acceptance import AcceptanceModel
    from rest_lsp.drafting.drafts import SuccessorTable, rest_drafts

    class Vocabulary:  # the decoder's filter of proposals: every id here is in its vocabulary
        def _usable(self, proposals, seq_length):
            return proposals

    prompt = [1, 2, 3, 4, 5, 9, 1, 2]
    tokens = [3, 4, 5, 7]  # the model repeats the prompt's line, then leaves it
    table = SuccessorTable()
    drafts = rest_drafts(recycle=table)
    line = replay_decode(Vocabulary(), prompt, tokens, drafts, 16, AcceptanceModel(), [0.0, 1.0, 1.0, 1.0],
                         table, None, [], None)
    first = line["positions"][0]
    assert (first["all"], first["budget"]) == (3, 3)  # 3 4 5 held by the context; 7 by nothing
    assert ["context", 2, 3] in first["src"]
    assert [p["all"] for p in line["positions"]] == [3, 2, 1, 0]
    assert line["truth"] == tokens and len(line["positions"][0]["props"]) == len(first["src"])
