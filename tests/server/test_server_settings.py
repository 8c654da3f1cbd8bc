"""Settings from the editor over the command line's: a null value goes back to the CLI flag."""

import argparse

from rest_lsp.commands import lsp as lsp_command
from rest_lsp.lsp import server
from rest_lsp.settings import Settings


def cli_settings(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    lsp_command.add_arguments(parser)
    return Settings.from_args(parser.parse_args(list(argv)))


def test_null_from_the_editor_goes_back_to_the_command_line():
    ls = server.create_server(cli_settings("--model", "/models/mine.gguf", "--max-new-tokens", "32"))
    ls.apply_settings({"rest-lsp": {"model": "/models/other", "maxNewTokens": 8, "draftBudget": 4}})
    assert (ls.settings.model, ls.settings.max_new_tokens, ls.settings.draft_budget) == ("/models/other", 8, 4)
    # null: the CLI flag where one was given, the built-in value where not
    ls.apply_settings({"model": None, "maxNewTokens": None, "draftBudget": None, "device": None})
    assert (ls.settings.model, ls.settings.max_new_tokens) == ("/models/mine.gguf", 32)
    assert (ls.settings.draft_budget, ls.settings.device) == (Settings().draft_budget, None)
    assert ls.defaults.model == "/models/mine.gguf"  # the editor never changes the defaults


def test_null_without_defaults_is_the_built_in_value():
    s, errors = Settings(model="/m", max_new_tokens=9).update({"model": None, "max_new_tokens": None})
    assert errors == [] and (s.model, s.max_new_tokens) == (None, Settings().max_new_tokens)
    # a wrong type is still one sentence, and the previous value stays
    s, errors = Settings(model="/m").update({"model": 3}, Settings(model="/cli"))
    assert s.model == "/m" and len(errors) == 1 and "'model'" in errors[0]


def test_indexing_end_reports_the_indexers_counts():
    """The progress end message reads the keys the indexer's build() returns (was '? files')."""
    import asyncio

    from rest_lsp.datastore import Datastore, WorkspaceIndex
    from rest_lsp.lsp.server import _Events

    ended = []

    class Progress:
        def end(self, token, value):
            ended.append(value.message)

    class FakeServer:
        work_done_progress = Progress()

    loop = asyncio.new_event_loop()
    try:
        events = _Events(FakeServer(), loop)
        events.tokens["/ws"] = ("tok", 100)
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "a.py").write_text("x = 1\n")
            index = WorkspaceIndex(Path(d), Datastore(), lambda texts: [[1, 2, 3] for _ in texts], "k",
                                   cache_dir=Path(d) / ".cache")
            stats = index.build()
            index.stop()
        events.index_end("/ws", stats)
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert ended == ["1 files, 3 tokens"]
