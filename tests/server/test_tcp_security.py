"""`--tcp` and `initialize` as an attacker meets them: one client a server, a token where one is set, loopback by
default, a second initialize refused (rest_lsp/lsp/tcp.py, lsp/admission.py, auth.py)."""

import asyncio
import json
import os
import socket
import struct
import subprocess
from types import SimpleNamespace

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidRequest

from support import cache_with_kernels, command, server_command, start, wait_until
from rest_lsp.auth import TokenError, is_loopback, read_token, token_matches
from rest_lsp.lsp import admission
from rest_lsp.lsp.server import DRAFTS_COMMAND, STATS_COMMAND, create_server
from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings
from rest_lsp.lsp.tcp import parse_address

TOKEN = "s3cr3t-token-of-the-editor-0123456789"
SECRET = "AWS_SECRET_ACCESS_KEY = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'"


class Raw:
    """A bare LSP peer on a socket: what any local process can be."""

    def __init__(self, reader, writer):
        self.reader, self.writer, self.next_id = reader, writer, 0
        self.notes = []  # the server's notifications

    @classmethod
    async def connect(cls, port, host="127.0.0.1", proc=None):
        for _ in range(300):
            try:
                return cls(*await asyncio.open_connection(host, port))
            except OSError:  # not listening yet
                assert proc is None or proc.returncode is None, "the server exited"
                await asyncio.sleep(0.2)
        raise AssertionError("the server did not listen")

    async def send(self, message):
        body = json.dumps(message).encode()
        self.writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await self.writer.drain()

    async def receive(self):
        length = None
        while (line := await self.reader.readline()).strip():
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        if length is None:
            return None  # the server closed the connection
        return json.loads(await self.reader.readexactly(length))

    async def request(self, method, params, timeout=120):
        """The reply to this request (None when the connection closed); the server's own requests get null."""
        self.next_id += 1
        await self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        async with asyncio.timeout(timeout):
            while (message := await self.receive()) is not None:
                if "method" in message and "id" in message:
                    await self.send({"jsonrpc": "2.0", "id": message["id"], "result": None})
                elif message.get("id") == self.next_id:
                    return message
                elif "method" in message:
                    self.notes.append(message)
        return None

    async def initialize(self, root, options):
        reply = await self.request("initialize", {"processId": None, "rootUri": root.as_uri(), "capabilities": {},
                                                  "initializationOptions": options})
        await self.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        return reply

    async def execute(self, name, *args):
        return await self.request("workspace/executeCommand", {"command": name, "arguments": list(args)})

    def close(self):
        self.writer.close()


def free_port(family=socket.AF_INET, host="127.0.0.1"):
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
async def serve(tmp_path):
    """serve(address, *args): a `rest-lsp --tcp address` process; killed at the end."""
    procs = []

    async def launch(address, *args):
        env = dict(os.environ, REST_LSP_CACHE_DIR=str(cache_with_kernels(tmp_path / "cache")))
        proc = await asyncio.create_subprocess_exec(*server_command()[:-1], "--tcp", address, *args, env=env,
                                                    stderr=asyncio.subprocess.PIPE)
        procs.append(proc)
        return proc

    yield launch
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def workspace(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "settings_local.py").write_text("# not committed\n" + SECRET + "\nDEBUG = True\n")
    return root


def options(tiny_models, **more):
    return {"model": str(tiny_models["random"]), "dtype": "float32", "debounceMs": 0, **more}


async def read_secret(peer):
    """What the drafts command gives after the start of the secret line (the reply, for errors)."""
    reply = await peer.execute(DRAFTS_COMMAND, "AWS_SECRET_ACCESS_KEY = '")
    return "".join(d["text"] for d in (reply or {}).get("result") or []), reply


async def ready(peer):
    reply = await peer.execute(STATS_COMMAND)
    stats = (reply or {}).get("result") or {}
    return stats if stats.get("ready") and stats.get("tokens", 0) > 20 else None


async def test_a_second_connection_gets_nothing_and_the_editor_keeps_its_replies(tiny_models, tmp_path, serve):
    port = free_port()
    proc = await serve(f"127.0.0.1:{port}")
    editor = await Raw.connect(port, proc=proc)
    assert "result" in await editor.initialize(workspace(tmp_path), options(tiny_models))
    assert await wait_until(lambda: ready(editor), 120), "the workspace was not indexed"
    assert (await read_secret(editor))[0].startswith("wJalrXUtnFEMI")  # the editor itself reads its workspace

    intruder = await Raw.connect(port)
    for ask in (lambda: intruder.execute(DRAFTS_COMMAND, "AWS_SECRET_ACCESS_KEY = '"),
                lambda: intruder.initialize(tmp_path, {}), lambda: intruder.execute(STATS_COMMAND)):
        reply = await ask()
        assert reply["error"] == {"code": -32600, "message": admission.BUSY}
    editor_stats = await editor.execute(STATS_COMMAND)  # its reply still goes to the editor
    assert editor_stats["result"]["ready"]
    intruder.close()
    editor.close()


async def test_with_a_token_nothing_is_served_without_it(tiny_models, tmp_path, serve, token_file):
    port = free_port()
    proc = await serve(f"127.0.0.1:{port}", "--token-file", str(token_file))
    root = workspace(tmp_path)
    first = await Raw.connect(port, proc=proc)  # asks before initializing
    assert (await first.execute(STATS_COMMAND))["error"]["message"] == admission.NOT_FIRST
    for presented, why in ((None, admission.NO_TOKEN), ("wrong-" + TOKEN, admission.WRONG_TOKEN),
                           (TOKEN[:-1], admission.WRONG_TOKEN), (["list"], admission.WRONG_TOKEN)):
        peer = await Raw.connect(port)
        extra = {} if presented is None else {"token": presented}
        assert (await peer.initialize(root, options(tiny_models, **extra)))["error"]["message"] == why
        for name in (STATS_COMMAND, DRAFTS_COMMAND):  # and nothing later on that connection either
            assert (await peer.execute(name, "AWS"))["error"]["message"] == why
        peer.close()
    editor = await Raw.connect(port)
    reply = await editor.initialize(root, options(tiny_models, token=TOKEN))
    assert "result" in reply
    assert await wait_until(lambda: ready(editor), 120)
    assert (await read_secret(editor))[0].startswith("wJalrXUtnFEMI")
    assert "result" in await editor.request("shutdown", None)
    await editor.send({"jsonrpc": "2.0", "method": "exit"})
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    log = (await proc.stderr.read()).decode()
    shown = [n["params"]["message"] for n in editor.notes if n["method"] == "window/showMessage"]
    assert not [m for m in shown if "token" in m.lower()], shown  # the token reached no setting
    assert TOKEN not in log


async def test_an_initialize_pygls_cannot_read_is_answered_and_may_be_sent_again(tmp_path, serve):
    port = free_port()
    proc = await serve(f"127.0.0.1:{port}")
    editor = await Raw.connect(port, proc=proc)
    reply = await editor.request("initialize", {"processId": "not a number", "capabilities": []}, timeout=60)
    assert reply["error"]["code"] == -32602  # InvalidParams, not silence
    assert "result" in await editor.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    editor.close()


async def test_a_client_that_resets_its_connection_ends_the_server(tmp_path, serve):
    """A reset is the client leaving: the server stops listening rather than refusing every later editor."""
    port = free_port()
    proc = await serve(f"127.0.0.1:{port}")
    editor = await Raw.connect(port, proc=proc)
    assert "result" in await editor.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    sock = editor.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    editor.writer.transport.abort()

    async def refused():
        try:
            Raw(*await asyncio.open_connection("127.0.0.1", port)).close()
        except ConnectionRefusedError:
            return True
        return False

    assert await wait_until(refused, 60), "the server still listens after its client left"


async def test_a_non_loopback_host_needs_a_token_file(tmp_path, serve):
    port = free_port()
    done = await asyncio.to_thread(subprocess.run, [*server_command()[:-1], "--tcp", f"0.0.0.0:{port}"],
                                   capture_output=True, text=True, timeout=60)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert err == (f"rest-lsp: --tcp on 0.0.0.0 (not a loopback address) needs --token-file: anyone who can reach "
                   "the port would read your code.")


async def test_a_non_loopback_host_with_a_token_warns_and_asks_for_it(tiny_models, tmp_path, serve, token_file):
    port = free_port()
    proc = await serve(f"0.0.0.0:{port}", "--token-file", str(token_file))
    peer = await Raw.connect(port, proc=proc)
    assert (await peer.initialize(tmp_path, options(tiny_models)))["error"]["message"] == admission.NO_TOKEN
    peer.close()
    proc.kill()
    await proc.wait()
    log = (await proc.stderr.read()).decode()
    assert f"Listening on 0.0.0.0:{port}, not a loopback address" in log


async def test_ipv6_loopback_is_accepted(tiny_models, tmp_path, serve):
    port = free_port(socket.AF_INET6, "::1")
    proc = await serve(f"[::1]:{port}")
    editor = await Raw.connect(port, host="::1", proc=proc)
    assert "result" in await editor.initialize(tmp_path, options(tiny_models, indexWorkspace=False))
    editor.close()


async def test_a_second_initialize_is_refused_and_the_first_service_kept(tiny_models, tmp_path):
    client, _ = await start(server_command(), tmp_path, "neovim", options(tiny_models, indexWorkspace=False),
                            env=dict(os.environ, REST_LSP_CACHE_DIR=str(cache_with_kernels(tmp_path / "cache"))))
    try:
        assert await wait_until(lambda: _ready(client), 120)
        again = types.InitializeParams(capabilities=types.ClientCapabilities(), root_uri=tmp_path.parent.as_uri())
        with pytest.raises(JsonRpcInvalidRequest, match="second initialize is refused"):
            await client.protocol.send_request_async(types.INITIALIZE, again)
        assert await _ready(client)  # the same service, still loaded (a new one would not be started)
    finally:
        await client.shutdown_session()


def test_only_the_first_initialize_and_initialized_reach_the_service(tiny_models, monkeypatch, tmp_path):
    """In process: a client that repeats the handshake starts the service (and loads the model) once."""
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    starts, services = [], []
    real_start = CompletionService.start
    monkeypatch.setattr(CompletionService, "start", lambda self, roots=None: (starts.append(self),
                                                                               real_start(self, roots))[1])
    server = create_server(Settings(model=str(tiny_models["random"]), dtype="float32", index_workspace=False))
    sent = []
    server.protocol.set_writer(SimpleNamespace(write=sent.append, close=lambda: None))

    def deliver(message):
        server.protocol.handle_message(json.loads(json.dumps({"jsonrpc": "2.0", **message}),
                                                  object_hook=server.protocol.structure_message))

    async def handshake_twice():
        server.loop = asyncio.get_running_loop()
        deliver({"method": "initialized", "params": {}})  # before initialize: ignored
        for i in (1, 2):
            deliver({"id": i, "method": "initialize", "params": {"processId": None, "rootUri": tmp_path.as_uri(),
                                                                 "capabilities": {}}})
            services.append(server.service)
            deliver({"method": "initialized", "params": {}})

    asyncio.run(handshake_twice())
    try:
        assert len(starts) == 1 and services[0] is services[1] is starts[0]
        replies = [json.loads(data.split(b"\r\n\r\n", 1)[1]) for data in sent]
        assert [r["id"] for r in replies] == [1, 2] and "result" in replies[0]
        assert replies[1]["error"] == {"code": -32600, "message": admission.SECOND_INITIALIZE}
    finally:
        server.service.close()


async def _ready(client):
    return (await command(client, STATS_COMMAND))["ready"]


@pytest.mark.parametrize("text,want", [("8123", ("127.0.0.1", 8123)), ("localhost:8123", ("localhost", 8123)),
                                       ("[::1]:8123", ("::1", 8123)), ("0.0.0.0:1", ("0.0.0.0", 1))])
def test_addresses(text, want):
    assert parse_address(text) == want


@pytest.mark.parametrize("text", ["::1:8123", "host:", ":8123", "host:0", "host:65536", "[::1]:x", "port"])
def test_bad_addresses_say_what_is_wanted(text):
    with pytest.raises(ValueError, match=r"^--tcp wants "):
        parse_address(text)


HOSTS = [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("0:0:0:0:0:0:0:1", True), ("localhost", True),
         ("LocalHost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.20", False), ("example.com", False)]


@pytest.mark.parametrize("host,loopback", HOSTS)
def test_which_hosts_are_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host,loopback", HOSTS)
def test_serve_and_remote_draw_the_line_where_tcp_does(host, loopback, token_file, monkeypatch, capsys):
    """One rule for the three network modes: `serve` without TLS warns of clear text exactly where `--remote`
    refuses an http:// URL and `--tcp` wants a token file (serve's own list warned for 127.3.2.1 and ::1 written
    out in full)."""
    from rest_lsp.commands import serve
    from rest_lsp.team.remote import remote_target

    url = f"http://[{host}]:8000" if ":" in host else f"http://{host}:8000"
    assert isinstance(remote_target(url, str(token_file)), tuple) is loopback

    class Started(Exception):
        pass

    def start(args):
        raise Started

    monkeypatch.setattr(serve, "start", start)  # the warning comes before the cluster
    monkeypatch.setattr(serve.signal, "signal", lambda *a: None)
    with pytest.raises(Started):  # _serve: what `run` does once Ray is set up (run's set-up changes the process)
        serve._serve(SimpleNamespace(host=host, tls_cert=None))
    assert ("clear text" in capsys.readouterr().err) is not loopback


def test_a_token_file_is_read_and_refused_when_others_may_read_it(tmp_path, token_file):
    assert read_token(token_file) == TOKEN
    token_file.chmod(0o640)
    with pytest.raises(TokenError, match=r"can be read or written by other users \(mode 640\): run `chmod 600"):
        read_token(token_file)
    for text, why in (("", "one token on one line"), ("two words-and-more-chars", "one token on one line"),
                      ("short", "shorter than 16 characters")):
        token_file.write_text(text)
        token_file.chmod(0o600)
        with pytest.raises(TokenError, match=why):
            read_token(token_file)
    with pytest.raises(TokenError, match="Cannot read the token file"):
        read_token(tmp_path / "missing")


def test_tokens_match_only_exactly():
    assert token_matches(TOKEN, TOKEN)
    assert not token_matches(TOKEN, TOKEN + "x") and not token_matches(TOKEN, TOKEN[:-1])
    assert not token_matches(TOKEN, None) and not token_matches(TOKEN, 42) and not token_matches(TOKEN, "\udcff")
