"""The VS Code extension in a real VS Code: code-server driven by headless Chromium, the real server, the default
model.

`bash .ci/vscode-e2e.sh` installs code-server and Chromium, builds the .vsix and runs this file. The tools are
found through these variables (a missing one fails the test with the command that brings it):
REST_LSP_CODE_SERVER (the code-server script), REST_LSP_CHROMIUM (default /usr/bin/chromium), REST_LSP_VSIX
(default editors/vscode/rest-lsp.vsix). REST_LSP_E2E_SHOTS names a folder for the screenshots (default: the
test's temporary folder); the ones in editors/vscode/doc/ come from a run with it set there.

What the server was asked and answered is read from an LSP tap (lsp_tap.py) between VS Code and the server, so
the test assumes nothing about what the model writes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

# Not skipped when missing: this file runs only where .ci/vscode-e2e.sh has installed everything.
from playwright import sync_api as playwright_sync  # noqa: E402  (pip install -e ".[test]" brings it)

expect = playwright_sync.expect

HERE = Path(__file__).resolve().parent
VSCODE_DIR = HERE.parent
REPO = VSCODE_DIR.parent.parent
TAP = HERE / "lsp_tap.py"

# Generous: the default model loads in ~10 s and a cold completion takes seconds on an idle 2-core machine; this
# one is shared with other work.
MODEL_READY_S = 300
COMPLETION_S = 240
UI_S = 60

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]

# The workspace: two folders (a multi-root workspace), the file we type in, and a second file elsewhere.
SHAPES = (
    "import math\n\n\n"
    "def circle_area(radius):\n"
    "    return math.pi * radius * radius\n\n\n"
    "def circle_circumference(radius):\n"
    "    return 2 * math.pi * radius\n\n\n"
    "def square_area(side):\n"
)
TYPED = "    return side"
UNITS = "METERS_PER_FOOT = 0.3048\nFEET_PER_METER = 1 / METERS_PER_FOOT\n"

# What keeps the editor from changing what is typed, and keeps the workbench quiet and offline.
EDITOR_SETTINGS = {
    "editor.autoClosingBrackets": "never",
    "editor.autoClosingQuotes": "never",
    "editor.quickSuggestions": {"other": "off", "comments": "off", "strings": "off"},
    "editor.suggestOnTriggerCharacters": False,
    "editor.wordBasedSuggestions": "off",
    "editor.inlineSuggest.enabled": True,
    "editor.minimap.enabled": False,
    "workbench.startupEditor": "none",
    "workbench.tips.enabled": False,
    "workbench.enableExperiments": False,
    "security.workspace.trust.enabled": False,
    "extensions.autoCheckUpdates": False,
    "extensions.autoUpdate": False,
    "update.mode": "none",
    "telemetry.telemetryLevel": "off",
    "chat.commandCenter.enabled": False,
}


def tool(variable: str, default: str | None, hint: str) -> Path:
    value = os.environ.get(variable) or default
    if not value or not Path(value).exists():
        pytest.fail(f"{variable} does not name an existing file ({value!r}); {hint}", pytrace=False)
    return Path(value)


@pytest.fixture(scope="module")
def tools() -> dict[str, Path]:
    hint = "bash .ci/vscode-e2e.sh installs it and runs this test."
    return {
        "code_server": tool("REST_LSP_CODE_SERVER", shutil.which("code-server"), hint),
        "chromium": tool("REST_LSP_CHROMIUM", "/usr/bin/chromium", hint),
        "vsix": tool("REST_LSP_VSIX", str(VSCODE_DIR / "rest-lsp.vsix"), "bash .ci/editors.sh builds it."),
    }


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("REST_LSP_E2E_SHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RETRIGGER_S = 20.0  # without an inline completion request this long after typing, trigger one by hand


def wait_until(condition, timeout: float, what: str, interval: float = 0.25):
    """Polls `condition` until it returns something truthy; fails naming `what` when the time is up."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:.0f} s for {what}", pytrace=False)
        time.sleep(interval)


class CodeServer:
    """code-server with its own user data and extension folders, the .vsix installed, listening on loopback."""

    def __init__(self, tools: dict[str, Path], root: Path, settings: dict):
        self.bin = tools["code_server"]
        self.data = root / "user-data"
        self.extensions = root / "extensions"
        # code-server's windows are remote windows: the machine-scoped settings (which program runs) are read from
        # the remote machine's settings (Machine/), as in VS Code's Remote-SSH; in the user settings VS Code drops
        # them at the first configuration change (seen: a restart with the default command).
        machine = {k: v for k, v in settings.items() if k.startswith("restLsp.server.")}
        user = {k: v for k, v in settings.items() if k not in machine}
        for folder, values in (("User", {**EDITOR_SETTINGS, **user}), ("Machine", machine)):
            (self.data / folder).mkdir(parents=True)
            (self.data / folder / "settings.json").write_text(json.dumps(values, indent=2))
        self.log = root / "code-server.log"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.common = ["--user-data-dir", str(self.data), "--extensions-dir", str(self.extensions),
                       "--config", str(root / "config.yaml")]
        installed = subprocess.run([str(self.bin), *self.common, "--install-extension", str(tools["vsix"])],
                                   capture_output=True, text=True, timeout=300)
        assert installed.returncode == 0, f"installing the .vsix failed:\n{installed.stdout}\n{installed.stderr}"

    def start(self) -> str:
        args = [str(self.bin), *self.common, "--auth", "none", "--bind-addr", f"127.0.0.1:{self.port}",
                "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
                "--disable-getting-started-override"]
        # Its own process group, so that the extension host and the language server end with it.
        self.proc = subprocess.Popen(args, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        url = f"http://127.0.0.1:{self.port}/healthz"
        wait_until(lambda: self._answers(url), UI_S, f"code-server to answer on {url} (log: {self.log})")
        return f"http://127.0.0.1:{self.port}/"

    def _answers(self, url: str) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"code-server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}",
                        pytrace=False)
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(20)


class Tap:
    """The messages that passed between VS Code and the server, read from the tap's log."""

    def __init__(self, path: Path):
        self.path = path

    def messages(self) -> list[tuple[str, dict]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a line being written
                continue
            out.append((entry["dir"], entry["msg"]))
        return out

    def exchanges(self, method: str) -> list[tuple[dict, dict | None]]:
        """(request, its response or None) for each client request of `method`, oldest first."""
        msgs = self.messages()
        responses = {m["id"]: m for d, m in msgs if d == "server->client" and "id" in m and "method" not in m}
        return [(m, responses.get(m["id"])) for d, m in msgs if d == "client->server" and m.get("method") == method]

    def commands(self, command: str) -> list[tuple[dict, dict | None]]:
        return [(req, resp) for req, resp in self.exchanges("workspace/executeCommand")
                if req["params"].get("command") == command]


def indexed(tap: Tap) -> set[str]:
    """The titles of the server's work-done progress (one per workspace folder) that have ended."""
    begun, ended = {}, set()
    for d, m in tap.messages():
        if d == "server->client" and m.get("method") == "$/progress":
            value = m["params"]["value"]
            if value.get("kind") == "begin":
                begun[m["params"]["token"]] = value.get("title")
            elif value.get("kind") == "end":
                ended.add(m["params"]["token"])
    return {title for token, title in begun.items() if token in ended}


def server_launcher(folder: Path, tap_log: Path) -> Path:
    """An executable that VS Code runs as restLsp.server.command: the tap, with this venv's server behind it."""
    script = folder / "rest-lsp-tapped"
    script.write_text(
        "#!/bin/sh\n"
        f'exec "{sys.executable}" "{TAP}" "{tap_log}" -- "{sys.executable}" -m rest_lsp.cli "$@"\n')
    script.chmod(0o755)
    return script


@pytest.fixture
def browser(tools):
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(tools["chromium"]), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def open_workbench(browser, url: str, query: str, scale: float = 1):
    page = browser.new_page(viewport={"width": 1280, "height": 800}, device_scale_factor=scale)
    page.goto(url + query)
    expect(page.locator(".monaco-workbench")).to_be_visible(timeout=UI_S * 1000)
    return page


def status_item(page):
    """Our status bar entry (the only one whose text starts with REST)."""
    return page.locator("#workbench\\.parts\\.statusbar .statusbar-item").filter(has_text=re.compile(r"^\s*REST\b"))


def run_command(page, title: str) -> None:
    page.keyboard.press("F1")
    box = page.locator(".quick-input-widget input.input")
    expect(box).to_be_visible(timeout=UI_S * 1000)
    box.fill(">" + title)
    row = page.locator(".quick-input-widget .monaco-list-row").filter(has_text=title).first
    expect(row).to_be_visible(timeout=UI_S * 1000)
    page.keyboard.press("Enter")


def open_file(page, name: str, line: int) -> None:
    """Quick Open `name:line`: the editor opens with the cursor at the start of that (1-based) line, focused."""
    page.keyboard.press("Control+p")
    box = page.locator(".quick-input-widget input.input")
    expect(box).to_be_visible(timeout=UI_S * 1000)
    box.fill(f"{name}:{line}")
    expect(page.locator(".quick-input-widget .monaco-list-row").filter(has_text=name).first).to_be_visible(
        timeout=UI_S * 1000)
    page.keyboard.press("Enter")
    expect(page.locator(".tab.active").filter(has_text=name)).to_be_visible(timeout=UI_S * 1000)
    expect(page.locator(".editor-instance .monaco-editor.focused")).to_be_visible(timeout=UI_S * 1000)


GHOST_JS = """() => {
  // The ghost text of the focused editor: the part on the cursor's line, then the lines VS Code adds below it.
  const editor = document.querySelector('.monaco-editor.focused') || document.querySelector('.monaco-editor');
  if (!editor) return null;
  const inline = [...editor.querySelectorAll('.ghost-text-decoration, .ghost-text-decoration-preview')];
  const blocks = [...editor.querySelectorAll('.ghost-text .view-line')];
  if (inline.length === 0 && blocks.length === 0) return null;
  const text = (el) => el.textContent.replace(/\\u00a0/g, ' ');
  return {inline: inline.map(text).join(''), lines: blocks.map(text)};
}"""


def ghost_text(page) -> str | None:
    found = page.evaluate(GHOST_JS)
    if not found:
        return None
    return "\n".join([found["inline"], *found["lines"]])


def test_ghost_text_tab_status_stats_settings_and_toggle(tools, browser, tmp_path, shots):
    main, other = tmp_path / "shapes", tmp_path / "units"
    main.mkdir()
    other.mkdir()
    (main / "shapes.py").write_text(SHAPES)
    (other / "units.py").write_text(UNITS)
    workspace = tmp_path / "two-folders.code-workspace"
    workspace.write_text(json.dumps({"folders": [{"path": str(main)}, {"path": str(other)}]}))
    tap = Tap(tmp_path / "tap.jsonl")
    server = CodeServer(tools, tmp_path / "vscode", {
        "restLsp.server.command": str(server_launcher(tmp_path, tap.path)),
        "restLsp.maxNewTokens": 24,
    })
    url = server.start()
    try:
        page = open_workbench(browser, url, f"?workspace={workspace}", scale=2)  # sharp screenshots
        item = status_item(page)
        expect(item).to_have_text(re.compile(r"REST ready"), timeout=MODEL_READY_S * 1000)
        # Both folders reached the server, and both were indexed.
        init = wait_until(lambda: tap.exchanges("initialize"), UI_S, "the initialize request")[0][0]
        folders = sorted(Path(f["uri"].removeprefix("file://")).name for f in init["params"]["workspaceFolders"])
        assert folders == ["shapes", "units"], folders
        wait_until(lambda: indexed(tap) == {"Indexing shapes", "Indexing units"}, MODEL_READY_S,
                   "both folders to be indexed ($/progress from begin to end for each)")

        line = SHAPES.count("\n")  # the empty last line, 0-based
        open_file(page, "shapes.py", line + 1)
        # the cursor the file opened at, once it rests, goes to the server (restLsp/cursor), before any request
        wait_until(lambda: [m for d, m in tap.messages()
                            if d == "client->server" and m.get("method") == "restLsp/cursor"
                            and m["params"]["textDocument"]["uri"].endswith("/shapes.py")],
                   UI_S, "the restLsp/cursor notification of the opened file's cursor")
        page.keyboard.type(TYPED, delay=30)
        asked = [time.monotonic()]

        # The last inline completion request, answered with an item, is what the editor shows.
        def answered():
            found = tap.exchanges("textDocument/inlineCompletion")
            if not found and time.monotonic() - asked[0] > RETRIGGER_S:
                # VS Code asks on typing, but now and then it does not (seen in CI and in one of four local runs, with no
                # request at all, even after Alt+\). The user then does what one does: types a key and deletes
                # it, and asks with Trigger Inline Suggestion (Alt+\).
                page.keyboard.press("End")
                page.keyboard.type(" ", delay=30)
                page.keyboard.press("Backspace")
                page.keyboard.press("Alt+Backslash")
                asked[0] = time.monotonic()
            if not found or found[-1][1] is None:
                return None
            req, resp = found[-1]
            items = (resp.get("result") or {}).get("items") or []
            return (req, items[0]) if items and ghost_text(page) else None

        try:
            request, item_sent = wait_until(answered, COMPLETION_S, "ghost text after typing")
        except BaseException:
            page.screenshot(path=str(shots / "failed-ghost-text.png"))
            raise
        expected = item_sent["insertText"]
        assert request["params"]["position"] == {"line": line, "character": len(TYPED)}, request["params"]
        assert expected.strip(), f"the server answered an empty completion: {item_sent!r}"
        assert ghost_text(page) == expected, f"ghost text {ghost_text(page)!r} != server's {expected!r}"
        page.screenshot(path=str(shots / "vscode-ghost-text.png"))

        page.keyboard.press("Tab")
        page.keyboard.press("Control+s")
        wanted = SHAPES + TYPED + expected
        wait_until(lambda: (main / "shapes.py").read_text() == wanted, UI_S,
                   f"Tab to insert the completion and the file to be saved as {wanted!r}")
        accepted = wait_until(lambda: [(q, r) for q, r in tap.commands("rest-lsp.accept") if r is not None],
                              UI_S, "the server to answer a rest-lsp.accept")
        req, resp = accepted[-1]
        assert req["params"]["arguments"][0]["text"] == expected, req
        assert resp.get("result") is True, resp

        # the speed of the decoding that requests waited for, as the server's stats tell it: tokens per step and ms
        # per token once a request waited for a decoding (it usually joins the guess decoding at the last
        # keystroke), the last latency alone while every suggestion was ready before it was asked (seen on a
        # 2-core AVX2 EPYC, where the guess was done before VS Code asked)
        speed = re.compile(r"REST \d+\.\d tok/step · \d+ ms/tok")
        latency = re.compile(r"REST \d+ ms")
        expect(item).to_have_text(re.compile(f"{speed.pattern}|{latency.pattern}"), timeout=UI_S * 1000)
        told = [r["result"] for _, r in tap.commands("rest-lsp.stats") if r is not None and r.get("result")]
        if any(stats["mean_tokens_per_step"] is not None for stats in told):
            expect(item).to_have_text(speed, timeout=UI_S * 1000)
        else:
            assert told, "the status bar shows a speed the server's stats never told"
            assert latency.search(item.inner_text()), item.inner_text()
        # The status bar's right half, with the last lines of the editor above it.
        box = item.bounding_box()
        page.screenshot(path=str(shots / "vscode-status-bar.png"),
                        clip={"x": 640, "y": box["y"] - 80, "width": 640, "height": 800 - (box["y"] - 80)})

        run_command(page, "REST LSP: Show Stats")
        dialog = page.locator(".monaco-dialog-box")
        expect(dialog).to_contain_text("REST LSP stats", timeout=UI_S * 1000)
        # The dialog shows what the server answered to the stats command it just received.
        stats = wait_until(lambda: [r for _, r in tap.commands("rest-lsp.stats") if r is not None],
                           UI_S, "an answer to rest-lsp.stats")[-1]["result"]
        assert stats["completions_served"] >= 1, stats
        text = dialog.inner_text()
        assert f"completions served: {stats['completions_served']}" in text, text
        # None (shown "-") while every suggestion was computed before it was asked
        mean = lambda key: "-" if stats[key] is None else f"{stats[key]:.2f}"  # noqa: E731
        assert f"mean tokens per step: {mean('mean_tokens_per_step')}" in text, text
        assert f"mean ms per token: {mean('mean_ms_per_token')}" in text, text
        assert f"documents: {stats['documents']}" in text, text
        dialog.screenshot(path=str(shots / "vscode-stats.png"))
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden(timeout=UI_S * 1000)

        # A setting changed in the Settings editor reaches the running server, under the server's name.
        run_command(page, "Preferences: Open User Settings")
        expect(page.locator(".settings-editor")).to_be_visible(timeout=UI_S * 1000)
        page.keyboard.type("restLsp.maxNewTokens")
        field = page.locator(".settings-editor .setting-item-number input")
        expect(field).to_have_count(1, timeout=UI_S * 1000)
        field.fill("16")
        wait_until(lambda: any(m.get("method") == "workspace/didChangeConfiguration"
                               and (m["params"].get("settings") or {}).get("max_new_tokens") == 16
                               for d, m in tap.messages() if d == "client->server"),
                   UI_S, "workspace/didChangeConfiguration with max_new_tokens 16")
        settings_file = server.data / "User" / "settings.json"
        assert json.loads(settings_file.read_text()).get("restLsp.maxNewTokens") == 16

        # Toggle turns completions off: the setting is saved, the server is shut down, the status bar says so.
        run_command(page, "REST LSP: Toggle Completions")
        expect(item).to_have_text(re.compile(r"REST off"), timeout=UI_S * 1000)
        wait_until(lambda: json.loads(settings_file.read_text()).get("restLsp.enable") is False, UI_S,
                   "restLsp.enable: false in the user settings")
        wait_until(lambda: any(m.get("method") == "exit" for d, m in tap.messages() if d == "client->server"),
                   UI_S, "the server to be told to exit")

        # The server's log lines keep their level in the "REST LSP" output: "model ready" is no error.
        def output_log() -> str:
            found = sorted(server.data.glob("logs/*/exthost*/rest-lsp.rest-lsp/REST LSP.log"))
            return found[-1].read_text() if found else ""
        wait_until(lambda: re.search(r"\[info\] \[server\] rest_lsp\.lsp\.server: .*ready", output_log()), UI_S,
                   "the server's 'model ready' record at [info] in the REST LSP output")
        assert "[error]" not in output_log(), output_log()
    finally:
        server.stop()


def crashing_server(folder: Path) -> Path:
    """A 'server' that dies at once, as `python -m rest_lsp.cli` does in a Python without rest-lsp."""
    script = folder / "crashing-rest-lsp"
    script.write_text("#!/bin/sh\necho \"No module named rest_lsp\" >&2\nexit 1\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("case", ["missing", "crashing"])
def test_a_server_that_does_not_start_says_why_and_how_to_fix_it(tools, browser, tmp_path, case):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "main.py").write_text("print('hello')\n")
    command = tmp_path / "no-such-dir" / "rest-lsp" if case == "missing" else crashing_server(tmp_path)
    server = CodeServer(tools, tmp_path / "vscode", {"restLsp.server.command": str(command)})
    url = server.start()
    try:
        page = open_workbench(browser, url, f"?folder={folder}")
        expect(status_item(page)).to_have_text(re.compile(r"REST error"), timeout=UI_S * 1000)
        toasts = page.locator(".notifications-toasts .notification-toast")
        expect(toasts.filter(has_text="REST LSP").first).to_be_visible(timeout=UI_S * 1000)
        # One notice, not one from the extension and more from the language client.
        assert toasts.count() == 1, [t.inner_text() for t in toasts.all()]
        message = toasts.first.locator(".notification-list-item-message").inner_text()
        assert message.startswith("REST LSP could not start its server: "), message
        assert str(command) in message, message
        assert "restLsp.server.command" in message, message
        if case == "missing":
            assert "does not exist" in message, message
        else:
            assert "stopped before it answered" in message and 'the "REST LSP" output' in message, message
        # code-server's window is remote: machine settings are read from the Remote settings, and the notice says so.
        assert message.endswith("in the Remote settings (Preferences: Open Remote Settings)."), message
        buttons = toasts.first.locator(".monaco-button").all_inner_texts()
        assert "Open Settings" in buttons and "Show Output" in buttons, buttons
        toasts.first.locator(".monaco-button", has_text="Open Settings").click()
        # The settings editor opens on the server settings, where the fix goes.
        row = page.locator(".settings-editor .setting-item-contents").filter(has_text="restLsp.server.command")
        expect(row.or_(page.locator(".settings-editor .setting-item-contents").filter(has_text="Server: Command"))
               .first).to_be_visible(timeout=UI_S * 1000)
    finally:
        server.stop()
