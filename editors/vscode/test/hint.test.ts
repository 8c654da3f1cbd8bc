import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { cursorHint, EditorCursor } from "../src/hint";

const resting = (over: Partial<EditorCursor> = {}): EditorCursor => ({
  active: true,
  selections: [{ isEmpty: true }],
  served: true,
  uri: "file:///w/a.py",
  position: { line: 3, character: 7 },
  ...over,
});

test("the active editor's resting cursor in a served document is the hint, where it is", () => {
  assert.deepEqual(cursorHint(resting()), {
    textDocument: { uri: "file:///w/a.py" },
    position: { line: 3, character: 7 },
  });
});

test("no hint without an editor, from another editor, a served-not document, a selection or several cursors", () => {
  assert.equal(cursorHint(undefined), undefined);
  assert.equal(cursorHint(resting({ active: false })), undefined);
  assert.equal(cursorHint(resting({ served: false })), undefined);
  assert.equal(cursorHint(resting({ selections: [{ isEmpty: false }] })), undefined);
  assert.equal(cursorHint(resting({ selections: [{ isEmpty: true }, { isEmpty: true }] })), undefined);
  assert.equal(cursorHint(resting({ selections: [] })), undefined);
});

test("the extension sends the hint of each selection change and each change of the active editor", () => {
  // extension.ts needs VS Code to run; its compiled code must still route both events through cursorHint
  const source = readFileSync(join(__dirname, "..", "src", "extension.js"), "utf8");
  assert.match(source, /onDidChangeTextEditorSelection\(\(?e\)? => ext\.cursorMoved\(e\.textEditor\)\)/);
  assert.match(source, /onDidChangeActiveTextEditor\(\(?editor\)? => ext\.cursorMoved\(editor\)\)/);
  assert.match(source, /\(0, hint_1\.cursorHint\)\(/);
  assert.match(source, /this\.hints\.moved\(/);
});
