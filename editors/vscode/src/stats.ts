// Reading the answer of the server's `rest-lsp.stats` command.
// No `vscode` import here: node:test checks this module without VS Code.

import type { ServerState, Speed } from "./status";

// The keys of `rest-lsp.stats` that the status bar shows (see rest_lsp/service/counters.py).
export const STAT_KEYS = {
  tokensPerStep: "mean_tokens_per_step",
  msPerToken: "mean_ms_per_token",
  latencyMs: "last_latency_ms",
} as const;

const isRecord = (x: unknown): x is Record<string, unknown> => typeof x === "object" && x !== null && !Array.isArray(x);
const finite = (x: unknown): number | undefined => (typeof x === "number" && Number.isFinite(x) ? x : undefined);

/** The speed fields of a stats answer; a field the server left out or sent as null stays undefined. */
export function speedFromStats(stats: unknown): Speed {
  if (!isRecord(stats)) return {};
  return {
    tokensPerStep: finite(stats[STAT_KEYS.tokensPerStep]),
    msPerToken: finite(stats[STAT_KEYS.msPerToken]),
    latencyMs: finite(stats[STAT_KEYS.latencyMs]),
    ...(stats.mode === "remote" && typeof stats.remote === "string" ? { remote: stats.remote } : {}),
  };
}

// Means and times are measurements: always two decimals, so that a mean of exactly 1 reads "1.00", not a count.
const isMeasurement = (key: string) => key.startsWith("mean_") || key.endsWith("_ms");

function formatValue(key: string, v: unknown): string {
  if (typeof v === "number") {
    return Number.isInteger(v) && !isMeasurement(key) ? v.toLocaleString("en-US") : v.toFixed(2);
  }
  if (v === null || v === undefined) return "-";
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

/** One "label: value" line per field, in the server's order; nested objects are flattened with dots. */
export function formatStats(stats: unknown): string[] {
  if (!isRecord(stats)) return [`The server answered something that is not a stats object: ${JSON.stringify(stats)}`];
  const lines: string[] = [];
  const walk = (obj: Record<string, unknown>, prefix: string) => {
    for (const [key, value] of Object.entries(obj)) {
      const label = prefix + key.replace(/_/g, " ");
      if (isRecord(value)) walk(value, `${label}.`);
      else lines.push(`${label}: ${formatValue(key, value)}`);
    }
  };
  walk(stats, "");
  return lines.length ? lines : ["The server has no stats yet."];
}

/** The state that the stats' `ready` and `load_error` imply: a model that failed to load is an error, a model
 *  still loading means "starting", a loaded one ends "starting". Indexing progress and "off" are kept. */
export function stateFromStats(current: ServerState, stats: unknown): ServerState {
  if (!isRecord(stats) || current.kind === "off") return current;
  const error = stats.load_error;
  if (typeof error === "string" && error !== "") {
    return { kind: "error", message: `The model did not load: ${error}` };
  }
  if (stats.ready === false) return current.kind === "indexing" ? current : { kind: "starting" };
  if (stats.ready === true && (current.kind === "starting" || current.kind === "error")) return { kind: "ready" };
  return current;
}

/** Whether the stats say the model is loaded or has failed to load (so there is nothing more to wait for). */
export function modelSettled(stats: unknown): boolean {
  if (!isRecord(stats)) return true;
  return stats.ready !== false || (typeof stats.load_error === "string" && stats.load_error !== "");
}
