import { strict as assert } from "node:assert";
import { test } from "node:test";
import { ProgressTracker, ServerState, statusText } from "../src/status";

test("ready with a speed shows tokens per step and ms per token", () => {
  const { text, tooltip } = statusText({ kind: "ready" }, { tokensPerStep: 2.345, msPerToken: 18.4, latencyMs: 412 });
  assert.equal(text, "$(zap) REST 2.3 tok/step · 18 ms/tok");
  assert.match(tooltip, /Last completion: 412 ms\./);
});

test("ready with only a latency shows the latency", () => {
  assert.equal(statusText({ kind: "ready" }, { latencyMs: 95.6 }).text, "$(zap) REST 96 ms");
});

test("ready before any completion says ready", () => {
  assert.equal(statusText({ kind: "ready" }).text, "$(check) REST ready");
  assert.equal(statusText({ kind: "ready" }, {}).text, "$(check) REST ready");
});

test("indexing shows its percentage and the server's message in the tooltip", () => {
  const s = statusText({ kind: "indexing", title: "Indexing workspace", message: "120/300 files", percentage: 40.4 });
  assert.equal(s.text, "$(sync~spin) REST indexing 40%");
  assert.equal(s.tooltip, "Indexing workspace: 120/300 files");
  assert.equal(statusText({ kind: "indexing", title: "Indexing" }).text, "$(sync~spin) REST indexing");
});

test("error and off say so", () => {
  const e = statusText({ kind: "error", message: "The rest-lsp server did not start (rest-lsp): spawn ENOENT" });
  assert.equal(e.text, "$(error) REST error");
  assert.match(e.tooltip, /spawn ENOENT/);
  assert.equal(statusText({ kind: "off" }).text, "$(circle-slash) REST off");
  assert.equal(statusText({ kind: "starting" }).text, "$(loading~spin) REST starting");
});

test("progress moves ready -> indexing -> ready", () => {
  const tracker = new ProgressTracker();
  let state: ServerState = { kind: "ready" };
  state = tracker.apply(state, "idx", { kind: "begin", title: "Indexing workspace", percentage: 0 });
  assert.deepEqual(state, { kind: "indexing", title: "Indexing workspace", message: undefined, percentage: 0 });
  state = tracker.apply(state, "idx", { kind: "report", message: "10/20 files", percentage: 50 });
  assert.deepEqual(state, { kind: "indexing", title: "Indexing workspace", message: "10/20 files", percentage: 50 });
  state = tracker.apply(state, "idx", { kind: "end" });
  assert.deepEqual(state, { kind: "ready" });
});

test("progress during start keeps showing indexing until the last one ends", () => {
  const tracker = new ProgressTracker();
  let state: ServerState = { kind: "starting" };
  state = tracker.apply(state, 1, { kind: "begin", title: "Loading model" });
  state = tracker.apply(state, 2, { kind: "begin", title: "Indexing workspace", percentage: 5 });
  assert.equal(state.kind === "indexing" && state.title, "Indexing workspace");
  state = tracker.apply(state, 2, { kind: "end" });
  assert.equal(state.kind === "indexing" && state.title, "Loading model");
  state = tracker.apply(state, 1, { kind: "end" });
  assert.deepEqual(state, { kind: "ready" });
});

test("a report for an unknown token changes nothing, and errors are not overwritten", () => {
  const tracker = new ProgressTracker();
  const ready: ServerState = { kind: "ready" };
  assert.equal(tracker.apply(ready, "x", { kind: "report", percentage: 10 }), ready);
  const error: ServerState = { kind: "error", message: "stopped" };
  assert.equal(tracker.apply(error, "y", { kind: "begin", title: "Indexing" }), error);
  const off: ServerState = { kind: "off" };
  assert.equal(tracker.apply(off, "y", { kind: "begin", title: "Indexing" }), off);
});

test("completions from a team server say remote, with the server in the tooltip", () => {
  const { text, tooltip } = statusText({ kind: "ready" }, { tokensPerStep: 2.1, remote: "https://team:8000" });
  assert.equal(text, "$(cloud) REST remote · 2.1 tok/step");
  assert.match(tooltip, /completions from https:\/\/team:8000/);
  assert.equal(statusText({ kind: "ready" }, { remote: "https://team:8000" }).text, "$(cloud) REST remote");
});
