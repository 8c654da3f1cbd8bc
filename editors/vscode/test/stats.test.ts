import { strict as assert } from "node:assert";
import { test } from "node:test";
import { formatStats, speedFromStats, STAT_KEYS } from "../src/stats";

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
