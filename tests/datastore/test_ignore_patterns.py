"""Invalid ignore patterns: refused by settings validation, skipped one by one (never the workspace) when indexing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rest_lsp.datastore import Datastore, WorkspaceIndex
from rest_lsp.datastore.ignore import IgnoreRules, bad_patterns
from rest_lsp.settings import Settings

BAD = ["[z-a]", "!", "\\"]  # a reversed range (re.error), a lone negation, a lone backslash (ValueError)


def byte_tokenize(texts: list[str]) -> list[list[int]]:
    return [list(t.encode("utf-8")) for t in texts]


@pytest.mark.parametrize("bad", BAD)
def test_settings_refuse_a_bad_pattern_in_one_sentence_and_keep_the_previous_value(bad):
    before = Settings().update({"ignore": ["*.log"]})[0]
    after, errors = before.update({"ignore": ["*.tmp", bad]})
    assert after.ignore == ("*.log",)
    assert len(errors) == 1 and repr(bad) in errors[0] and "'ignore'" in errors[0]


def test_good_patterns_pass_validation():
    s, errors = Settings().update({"ignore": ["*.log", "build/", "!keep.log", "\\#literal"]})
    assert errors == [] and s.ignore == ("*.log", "build/", "!keep.log", "\\#literal")
    assert bad_patterns(["*.log", *BAD]) == BAD


def test_indexing_skips_a_bad_extra_pattern_not_the_workspace(tmp_path, caplog):
    (tmp_path / "a.py").write_text("alpha = 1\n")
    (tmp_path / "b.log").write_text("noise\n")
    ds = Datastore(background_merges=False)
    index = WorkspaceIndex(tmp_path, ds, byte_tokenize, "bytes", persist=False, extra_ignore=["*.log", *BAD])
    index.build()
    assert set(ds.doc_ids()) == {str(tmp_path.resolve() / "a.py")}  # *.log still applies
    assert sum("invalid ignore pattern" in r.getMessage() for r in caplog.records) == 1
    ds.close()


def test_a_bad_line_in_a_gitignore_skips_that_line_only(tmp_path):
    (tmp_path / ".gitignore").write_text("*.log\n[z-a]\n")
    rules = IgnoreRules(tmp_path)
    assert rules.ignored("x.log", False)
    assert not rules.ignored("x.py", False)
