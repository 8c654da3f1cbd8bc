import { strict as assert } from "node:assert";
import { test } from "node:test";
import { DEFAULT_SETTINGS, serverLaunch } from "../src/settings";
import { checkProgram, Probe, startFailureMessage } from "../src/startup";

const disk = (files: Record<string, "ok" | "not-executable">): Probe => (file) => files[file] ?? "missing";

test("a bare name is looked up on PATH, in order; a path is taken as it is", () => {
  const probe = disk({ "/b/rest-lsp": "ok", "/a/rest-lsp": "not-executable", "/opt/x/rest-lsp": "ok" });
  assert.equal(checkProgram("rest-lsp", "/a:/b", probe), undefined);
  assert.deepEqual(checkProgram("rest-lsp", "/a:/c", probe), { kind: "not-executable", program: "/a/rest-lsp" });
  assert.deepEqual(checkProgram("rest-lsp", "/c::/d", probe), { kind: "missing", program: "rest-lsp" });
  assert.deepEqual(checkProgram("rest-lsp", undefined, probe), { kind: "missing", program: "rest-lsp" });
  assert.equal(checkProgram("/opt/x/rest-lsp", "", probe), undefined);
  assert.deepEqual(checkProgram("/opt/y/rest-lsp", "/b", probe), { kind: "missing", program: "/opt/y/rest-lsp" });
});

const sentences = (text: string) => text.split(/(?<=[.!?])\s+(?=[A-Z])/).length;

test("each start failure is one sentence that names the program and the setting that fixes it", () => {
  const byCommand = { ...DEFAULT_SETTINGS };
  const byPath = { ...DEFAULT_SETTINGS, serverCommand: "/opt/rest/bin/rest-lsp" };
  const byPython = { ...DEFAULT_SETTINGS, python: "/home/me/venv/bin/python" };
  const cases = [
    [byCommand, { kind: "missing", program: "rest-lsp" }, /"rest-lsp" was not found on VS Code's PATH.*restLsp\.server\.command/],
    [byPath, { kind: "missing", program: "/opt/rest/bin/rest-lsp" }, /"\/opt\/rest\/bin\/rest-lsp" \(restLsp\.server\.command\) does not exist/],
    [byPath, { kind: "not-executable", program: "/opt/rest/bin/rest-lsp" }, /is not executable.*restLsp\.server\.command/],
    [byPython, { kind: "missing", program: "/home/me/venv/bin/python" }, /\(restLsp\.server\.python\) does not exist; set restLsp\.server\.python/],
    [byPython, { kind: "failed", detail: "Pending response rejected since connection got disposed\nstack..." },
      /"\/home\/me\/venv\/bin\/python -m rest_lsp\.cli --stdio" stopped before it answered \(Pending response rejected since connection got disposed\); the "REST LSP" output/],
  ] as const;
  for (const [settings, problem, pattern] of cases) {
    const message = startFailureMessage(settings, serverLaunch(settings), problem);
    assert.match(message, pattern);
    assert.match(message, /^REST LSP could not start its server: .*\.$/);
    assert.equal(sentences(message), 1, message);
    assert.ok(!message.includes("\n"), message);
  }
});

test("a long error is cut to its first line", () => {
  const message = startFailureMessage(DEFAULT_SETTINGS, serverLaunch(DEFAULT_SETTINGS),
    { kind: "failed", detail: `\n${"x".repeat(500)}\nsecond line` });
  assert.ok(message.length < 500, message);
  assert.ok(!message.includes("second line"), message);
});

test("in a remote window the fix names the Remote settings, where VS Code reads machine settings", () => {
  const local = startFailureMessage(DEFAULT_SETTINGS, serverLaunch(DEFAULT_SETTINGS), { kind: "missing", program: "rest-lsp" });
  const remote = startFailureMessage(DEFAULT_SETTINGS, serverLaunch(DEFAULT_SETTINGS), { kind: "missing", program: "rest-lsp" }, true);
  assert.match(local, /in your user settings\.$/);
  assert.match(remote, /in the Remote settings \(Preferences: Open Remote Settings\)\.$/);
  assert.equal(sentences(remote), 1, remote);
});
