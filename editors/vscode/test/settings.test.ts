import { strict as assert } from "node:assert";
import { test } from "node:test";
import {
  classifyChange,
  DEFAULT_SETTINGS,
  documentSelector,
  readSettings,
  RestLspSettings,
  serverLaunch,
  serverOptions,
} from "../src/settings";

const reader = (values: Record<string, unknown>) => (key: string) => values[key];
const withSettings = (over: Partial<RestLspSettings>): RestLspSettings => ({ ...DEFAULT_SETTINGS, ...over });

test("nothing set gives the defaults and no problems", () => {
  const { settings, problems } = readSettings(reader({}));
  assert.deepEqual(settings, DEFAULT_SETTINGS);
  assert.deepEqual(problems, []);
});

test("set values are read and trimmed", () => {
  const { settings, problems } = readSettings(
    reader({
      "server.command": " /opt/bin/rest-lsp ",
      model: "Qwen/Qwen2.5-Coder-1.5B",
      device: "cuda",
      dtype: "bfloat16",
      maxNewTokens: 128,
      maxLines: 3,
      budget: 0,
      debounceMs: 50,
      ignore: ["*.lock", " "],
      languages: ["python", "rust"],
    }),
  );
  assert.deepEqual(problems, []);
  assert.equal(settings.serverCommand, "/opt/bin/rest-lsp");
  assert.equal(settings.model, "Qwen/Qwen2.5-Coder-1.5B");
  assert.equal(settings.dtype, "bfloat16");
  assert.equal(settings.maxNewTokens, 128);
  assert.equal(settings.maxLines, 3);
  assert.equal(settings.budget, 0);
  assert.deepEqual(settings.ignore, ["*.lock"]);
  assert.deepEqual(settings.languages, ["python", "rust"]);
});

test("each bad value gets one sentence and its default", () => {
  const { settings, problems } = readSettings(
    reader({
      maxNewTokens: 0,
      maxLines: -1,
      budget: 2.5,
      debounceMs: "fast",
      dtype: "int4",
      enable: "yes",
      languages: [],
      ignore: "node_modules",
      "server.command": "",
    }),
  );
  assert.equal(settings.maxNewTokens, DEFAULT_SETTINGS.maxNewTokens);
  assert.equal(settings.maxLines, DEFAULT_SETTINGS.maxLines);
  assert.equal(settings.budget, DEFAULT_SETTINGS.budget);
  assert.equal(settings.debounceMs, DEFAULT_SETTINGS.debounceMs);
  assert.equal(settings.dtype, "");
  assert.equal(settings.enable, true);
  assert.deepEqual(settings.languages, ["*"]);
  assert.deepEqual(settings.ignore, []);
  assert.equal(settings.serverCommand, "rest-lsp");
  assert.equal(problems.length, 9);
  assert.ok(problems.some((p) => p.startsWith("restLsp.maxNewTokens must be a whole number from 1 to 1024")));
  assert.ok(problems.some((p) => p.startsWith("restLsp.dtype must be one of")));
  for (const p of problems) assert.match(p, /^restLsp\.[\w.]+ .*\.$/);
});

test("the server runs as rest-lsp --stdio by default", () => {
  assert.deepEqual(serverLaunch(DEFAULT_SETTINGS), { command: "rest-lsp", args: ["--stdio"] });
});

test("a Python interpreter runs the module, with extra arguments after --stdio", () => {
  const launch = serverLaunch(withSettings({ python: "/venv/bin/python", extraArgs: ["--log-file", "/tmp/l"] }));
  assert.deepEqual(launch, {
    command: "/venv/bin/python",
    args: ["-m", "rest_lsp.cli", "--stdio", "--log-file", "/tmp/l"],
  });
});

test("server options use the server's names, and null for what the server should choose", () => {
  assert.deepEqual(serverOptions(DEFAULT_SETTINGS), {
    model: null,
    device: null,
    dtype: null,
    max_new_tokens: 64,
    max_lines: 1,
    draft_budget: 16,
    debounce_ms: 20,
    ignore: [],
  });
  assert.deepEqual(serverOptions(withSettings({ model: "m.gguf", device: "cuda:1", dtype: "float16", ignore: ["x"] })), {
    model: "m.gguf",
    device: "cuda:1",
    dtype: "float16",
    max_new_tokens: 64,
    max_lines: 1,
    draft_budget: 16,
    debounce_ms: 20,
    ignore: ["x"],
  });
});

test("the document selector covers files and untitled buffers of the chosen languages", () => {
  assert.deepEqual(documentSelector(["*"]), [{ scheme: "file" }, { scheme: "untitled" }]);
  assert.deepEqual(documentSelector(["python", "python", "go"]), [
    { scheme: "file", language: "python" },
    { scheme: "untitled", language: "python" },
    { scheme: "file", language: "go" },
    { scheme: "untitled", language: "go" },
  ]);
});

test("settings changes are classified by what they need", () => {
  const base = DEFAULT_SETTINGS;
  assert.equal(classifyChange(base, base), "none");
  assert.equal(classifyChange(base, withSettings({ enable: false })), "stop");
  assert.equal(classifyChange(withSettings({ enable: false }), base), "start");
  assert.equal(classifyChange(withSettings({ enable: false }), withSettings({ enable: false, model: "x" })), "none");
  assert.equal(classifyChange(base, withSettings({ python: "/usr/bin/python3" })), "restart");
  assert.equal(classifyChange(base, withSettings({ languages: ["python"] })), "restart");
  assert.equal(classifyChange(base, withSettings({ showInSuggestList: true })), "restart");
  assert.equal(classifyChange(base, withSettings({ model: "other" })), "notify");
  assert.equal(classifyChange(base, withSettings({ budget: 4 })), "notify");
});

test("the quantized modes are accepted as the server names them", () => {
  for (const dtype of ["q8_0", "gguf"]) {
    const { settings, problems } = readSettings((key) => (key === "dtype" ? dtype : undefined));
    assert.equal(settings.dtype, dtype);
    assert.deepEqual(problems, []);
  }
});
