"""Per-document state over LSP: a text the tokenizer refuses fails its own request with one sentence and nothing after
it; a closed document leaves no KV cache behind."""

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from support import command, greedy, inline, open_doc, server_command, start, wait_until

from rest_lsp.lsp.server import STATS_COMMAND

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_NEW = 6


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("workspace")
    options = {"model": str(tiny_models["random"]), "dtype": "float32", "maxNewTokens": MAX_NEW, "debounceMs": 0,
               "indexWorkspace": False, "cacheDir": str(tmp_path_factory.mktemp("cache"))}
    client, _ = await start(server_command(), root, "visual-studio-code", options)
    assert await wait_until(lambda: _stats(client, "ready")), "the model did not load"
    yield client, root, tiny_models["random"]
    await client.shutdown_session()


async def _stats(client, key: str):
    return (await command(client, STATS_COMMAND))[key]


def _replace(client, uri: str, version: int, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))


async def test_a_lone_surrogate_fails_its_request_only(session):
    client, root, model = session
    uri, clean = (root / "s.py").as_uri(), 'x = ""\ny = '
    expected = greedy(model, clean, "", MAX_NEW)
    assert expected.strip(), "the reference completion is empty: pick another text"
    open_doc(client, uri, 'x = "\ud83d"\ny = ')  # valid JSON ("\\ud83d"), not valid Unicode
    with pytest.raises(JsonRpcInvalidParams) as failed:
        await inline(client, uri, 1, 4)
    assert failed.value.message == ("rest-lsp: line 1 holds a lone surrogate (U+D83D), which is not valid Unicode; "
                                    "no completion until it is removed.")
    _replace(client, uri, 2, clean)  # the old code: -32603 TypeError from here on, for this URI
    assert [i.insert_text for i in (await inline(client, uri, 1, 4)).items] == [expected]
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    open_doc(client, uri, clean, version=3)
    assert [i.insert_text for i in (await inline(client, uri, 1, 4)).items] == [expected]
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))


async def test_closed_documents_keep_no_kv_cache(session):
    client, root, _ = session
    uris = [(root / f"m{i}.py").as_uri() for i in range(4)]
    for i, uri in enumerate(uris):
        text = "".join(f"def f_{i}_{j}(x):\n    return x * {j}\n" for j in range(20)) + "y = "
        open_doc(client, uri, text)
        await inline(client, uri, 40, 4)
    assert await _stats(client, "document_caches") >= 2  # the caches of the documents left were kept
    for uri in uris:
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    # the old code: the caches of the closed documents stay until newer ones push them out
    assert await _stats(client, "document_caches") == 0
    assert await _stats(client, "document_cache_bytes") == 0
