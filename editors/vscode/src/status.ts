// The server's state as the status bar shows it, and how `$/progress` moves it.
// No `vscode` import here: node:test checks this module without VS Code.

export type ServerState =
  | { kind: "off" }
  | { kind: "starting" }
  | { kind: "indexing"; title: string; message?: string; percentage?: number }
  | { kind: "ready" }
  | { kind: "error"; message: string };

/** The speed of the last completion, as far as the server told it. */
export interface Speed {
  tokensPerStep?: number;
  msPerToken?: number;
  latencyMs?: number;
  /** The team server's URL when completions come from one (`rest-lsp --remote`). */
  remote?: string;
}

export interface StatusText {
  text: string;
  tooltip: string;
}

const fmt = (x: number, digits: number) => x.toFixed(digits);

export function statusText(state: ServerState, speed?: Speed): StatusText {
  switch (state.kind) {
    case "off":
      return { text: "$(circle-slash) REST off", tooltip: "REST LSP completions are off. Click to turn them on." };
    case "starting":
      return { text: "$(loading~spin) REST starting", tooltip: "The rest-lsp server is starting (loading the model)." };
    case "indexing": {
      const pct = state.percentage === undefined ? "" : ` ${Math.round(state.percentage)}%`;
      const detail = state.message ? `: ${state.message}` : "";
      return { text: `$(sync~spin) REST indexing${pct}`, tooltip: `${state.title}${detail}` };
    }
    case "error":
      return {
        text: "$(error) REST error",
        tooltip: `${state.message}\nClick to restart the server; the "REST LSP" output has the details.`,
      };
    case "ready": {
      const parts: string[] = [];
      if (speed?.tokensPerStep !== undefined) parts.push(`${fmt(speed.tokensPerStep, 1)} tok/step`);
      if (speed?.msPerToken !== undefined) parts.push(`${fmt(speed.msPerToken, 0)} ms/tok`);
      else if (speed?.latencyMs !== undefined) parts.push(`${fmt(speed.latencyMs, 0)} ms`);
      if (speed?.remote !== undefined) parts.unshift("remote");
      const tip = [speed?.remote !== undefined ? `REST LSP is ready: completions from ${speed.remote}.` : "REST LSP is ready."];
      if (speed?.latencyMs !== undefined) tip.push(`Last completion: ${fmt(speed.latencyMs, 0)} ms.`);
      tip.push("Click for stats.");
      return {
        text: parts.length ? `$(${speed?.remote !== undefined ? "cloud" : "zap"}) REST ${parts.join(" · ")}` : "$(check) REST ready",
        tooltip: tip.join(" "),
      };
    }
  }
}

/** A `$/progress` value: begin, report or end (LSP WorkDoneProgress). */
export interface ProgressValue {
  kind: "begin" | "report" | "end";
  title?: string;
  message?: string;
  percentage?: number;
}

/** Follows the server's work-done progress: while any is open the state is "indexing", after the last ends
 *  it is "ready". An error or "off" is not overwritten by progress. */
export class ProgressTracker {
  private open = new Map<string, { title: string; message?: string; percentage?: number }>();

  apply(state: ServerState, token: string | number, value: ProgressValue): ServerState {
    if (state.kind === "error" || state.kind === "off") return state;
    const key = String(token);
    if (value.kind === "begin") {
      this.open.set(key, { title: value.title ?? "Indexing", message: value.message, percentage: value.percentage });
    } else if (value.kind === "report") {
      const entry = this.open.get(key);
      if (entry === undefined) return state;
      if (value.message !== undefined) entry.message = value.message;
      if (value.percentage !== undefined) entry.percentage = value.percentage;
    } else {
      this.open.delete(key);
    }
    const latest = [...this.open.values()].pop();
    if (latest === undefined) return state.kind === "indexing" ? { kind: "ready" } : state;
    return { kind: "indexing", ...latest };
  }

  reset(): void {
    this.open.clear();
  }
}
