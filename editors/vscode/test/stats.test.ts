import { strict as assert } from "node:assert";
import { test } from "node:test";
import { formatStats, modelSettled, speedFromStats, STAT_KEYS, stateFromStats } from "../src/stats";

test("the speed comes from the stats keys the server sends", () => {
  const stats = {
    documents: 12,
    [STAT_KEYS.tokensPerStep]: 2.5,
    [STAT_KEYS.msPerToken]: 14.2,
    [STAT_KEYS.latencyMs]: 310,
  };
  assert.deepEqual(speedFromStats(stats), { tokensPerStep: 2.5, msPerToken: 14.2, latencyMs: 310 });
});

test("missing, null or non-numeric speed fields stay undefined", () => {
  assert.deepEqual(speedFromStats({ [STAT_KEYS.tokensPerStep]: null, [STAT_KEYS.msPerToken]: "fast" }), {
    tokensPerStep: undefined,
    msPerToken: undefined,
    latencyMs: undefined,
  });
  assert.deepEqual(speedFromStats(null), {});
  assert.deepEqual(speedFromStats([1, 2]), {});
});

test("stats are formatted one field a line, in order, nested ones with dots", () => {
  const lines = formatStats({
    documents: 1234,
    tokens: 5678901,
    completions_served: 3,
    mean_tokens_per_step: 2.3456,
    last_latency_ms: null,
    model: "SmolLM2",
    index: { segments: 2 },
  });
  assert.deepEqual(lines, [
    "documents: 1,234",
    "tokens: 5,678,901",
    "completions served: 3",
    "mean tokens per step: 2.35",
    "last latency ms: -",
    "model: SmolLM2",
    "index.segments: 2",
  ]);
});

test("an answer that is not an object is reported, not thrown", () => {
  assert.match(formatStats("oops")[0], /not a stats object: "oops"/);
  assert.deepEqual(formatStats({}), ["The server has no stats yet."]);
});

test("the model's state in the stats moves the status", () => {
  const starting = { kind: "starting" } as const;
  const ready = { kind: "ready" } as const;
  assert.deepEqual(stateFromStats(starting, { ready: false, load_error: null }), starting);
  assert.deepEqual(stateFromStats(starting, { ready: true, load_error: null }), ready);
  assert.deepEqual(stateFromStats(ready, { ready: false, load_error: null }), starting);
  assert.deepEqual(stateFromStats(ready, { ready: false, load_error: "No model at /x.gguf." }), {
    kind: "error",
    message: "The model did not load: No model at /x.gguf.",
  });
  // a server that failed to load and then loaded a new model (settings changed) is ready again
  assert.deepEqual(stateFromStats({ kind: "error", message: "old" }, { ready: true, load_error: null }), ready);
});

test("indexing and off are kept, and an answer without the fields changes nothing", () => {
  const indexing = { kind: "indexing", title: "Indexing src", percentage: 30 } as const;
  assert.deepEqual(stateFromStats(indexing, { ready: false }), indexing);
  assert.deepEqual(stateFromStats(indexing, { ready: true }), indexing);
  assert.deepEqual(stateFromStats({ kind: "off" }, { ready: true }), { kind: "off" });
  assert.deepEqual(stateFromStats({ kind: "ready" }, {}), { kind: "ready" });
  assert.deepEqual(stateFromStats({ kind: "ready" }, "nonsense"), { kind: "ready" });
});

test("the model is settled once loaded or failed; an answer without `ready` is not waited on", () => {
  assert.equal(modelSettled({ ready: false, load_error: null }), false);
  assert.equal(modelSettled({ ready: true, load_error: null }), true);
  assert.equal(modelSettled({ ready: false, load_error: "out of memory" }), true);
  assert.equal(modelSettled({ documents: 3 }), true);
  assert.equal(modelSettled(null), true);
});

test("a mean or a time that happens to be whole still reads as a measurement, a count stays a count", () => {
  // JSON turns the server's 1.0 into 1: the dialog showed "mean tokens per step: 1" in code-server.
  const lines = formatStats({ completions_served: 2, mean_tokens_per_step: 1, mean_ms_per_token: 200, last_latency_ms: 313 });
  assert.deepEqual(lines, [
    "completions served: 2",
    "mean tokens per step: 1.00",
    "mean ms per token: 200.00",
    "last latency ms: 313.00",
  ]);
});

test("a remote server's stats carry its URL to the status bar; a local one's do not", () => {
  assert.equal(speedFromStats({ mode: "remote", remote: "https://team:8000" }).remote, "https://team:8000");
  assert.equal(speedFromStats({ mode: "float32", remote: "x" }).remote, undefined);
});
