// The extension's settings as one typed value, and what the server is given from them.
// No `vscode` import here: node:test checks this module without VS Code.

export interface RestLspSettings {
  enable: boolean;
  serverCommand: string;
  python: string;
  extraArgs: string[];
  model: string;
  device: string;
  dtype: string;
  maxNewTokens: number;
  maxLines: number;
  budget: number;
  debounceMs: number;
  ignore: string[];
  languages: string[];
  showInSuggestList: boolean;
}

export const DEFAULT_SETTINGS: RestLspSettings = {
  enable: true,
  serverCommand: "rest-lsp",
  python: "",
  extraArgs: [],
  model: "",
  device: "",
  dtype: "",
  maxNewTokens: 64,
  maxLines: 1,
  budget: 16,
  debounceMs: 20,
  ignore: [],
  languages: ["*"],
  showInSuggestList: false,
};

const DTYPES = ["", "float32", "float16", "bfloat16", "float16-weights", "q8_0", "gguf"];

export interface ReadResult {
  settings: RestLspSettings;
  // One sentence per setting that was unusable; its default is used instead.
  problems: string[];
}

/** Reads `restLsp.*` through `get` (the key without the prefix), checking each value. */
export function readSettings(get: (key: string) => unknown): ReadResult {
  const problems: string[] = [];
  const d = DEFAULT_SETTINGS;

  const bool = (key: string, fallback: boolean): boolean => {
    const v = get(key);
    if (v === undefined || v === null) return fallback;
    if (typeof v === "boolean") return v;
    problems.push(`restLsp.${key} must be true or false; using ${fallback}.`);
    return fallback;
  };
  const str = (key: string, fallback: string): string => {
    const v = get(key);
    if (v === undefined || v === null) return fallback;
    if (typeof v === "string") return v.trim();
    problems.push(`restLsp.${key} must be a string; using "${fallback}".`);
    return fallback;
  };
  const int = (key: string, fallback: number, min: number, max: number): number => {
    const v = get(key);
    if (v === undefined || v === null) return fallback;
    if (typeof v === "number" && Number.isInteger(v) && v >= min && v <= max) return v;
    problems.push(`restLsp.${key} must be a whole number from ${min} to ${max}; using ${fallback}.`);
    return fallback;
  };
  const strings = (key: string, fallback: string[]): string[] => {
    const v = get(key);
    if (v === undefined || v === null) return fallback;
    if (Array.isArray(v) && v.every((x) => typeof x === "string")) {
      return v.map((x: string) => x.trim()).filter((x) => x.length > 0);
    }
    problems.push(`restLsp.${key} must be a list of strings; using [${fallback.map((x) => `"${x}"`).join(", ")}].`);
    return fallback;
  };

  let dtype = str("dtype", d.dtype);
  if (!DTYPES.includes(dtype)) {
    problems.push(`restLsp.dtype must be one of float32, float16, bfloat16, float16-weights, q8_0, gguf or empty; "${dtype}" is none of them, so the server chooses.`);
    dtype = d.dtype;
  }
  let serverCommand = str("server.command", d.serverCommand);
  if (serverCommand === "") {
    problems.push(`restLsp.server.command is empty; using "${d.serverCommand}".`);
    serverCommand = d.serverCommand;
  }
  let languages = strings("languages", d.languages);
  if (languages.length === 0) {
    problems.push(`restLsp.languages is empty, which would turn every completion off; use restLsp.enable for that. Using ["*"].`);
    languages = d.languages;
  }

  return {
    settings: {
      enable: bool("enable", d.enable),
      serverCommand,
      python: str("server.python", d.python),
      extraArgs: strings("server.extraArgs", d.extraArgs),
      model: str("model", d.model),
      device: str("device", d.device),
      dtype,
      maxNewTokens: int("maxNewTokens", d.maxNewTokens, 1, 1024),
      maxLines: int("maxLines", d.maxLines, 0, 1000),
      budget: int("budget", d.budget, 0, 256),
      debounceMs: int("debounceMs", d.debounceMs, 0, 5000),
      ignore: strings("ignore", d.ignore),
      languages,
      showInSuggestList: bool("showInSuggestList", d.showInSuggestList),
    },
    problems,
  };
}

export interface Launch {
  command: string;
  args: string[];
}

/** How the server process is started: the `rest-lsp` script, or a chosen Python running the module. */
export function serverLaunch(s: RestLspSettings): Launch {
  if (s.python !== "") {
    return { command: s.python, args: ["-m", "rest_lsp.cli", "--stdio", ...s.extraArgs] };
  }
  return { command: s.serverCommand, args: ["--stdio", ...s.extraArgs] };
}

/** The server's settings object (rest_lsp/settings.py names), sent as `initializationOptions` and on every
 *  configuration change. An empty string becomes null, the server's "use your default", so that clearing a
 *  setting in VS Code also clears it in a running server. */
export function serverOptions(s: RestLspSettings): Record<string, unknown> {
  const orNull = (x: string) => (x === "" ? null : x);
  return {
    model: orNull(s.model),
    device: orNull(s.device),
    dtype: orNull(s.dtype),
    max_new_tokens: s.maxNewTokens,
    max_lines: s.maxLines,
    draft_budget: s.budget,
    debounce_ms: s.debounceMs,
    ignore: s.ignore,
  };
}

export interface DocumentFilter {
  scheme: string;
  language?: string;
}

/** Which documents the client sends to the server: files and unsaved buffers of the enabled languages. */
export function documentSelector(languages: string[]): DocumentFilter[] {
  const schemes = ["file", "untitled"];
  if (languages.includes("*")) return schemes.map((scheme) => ({ scheme }));
  const unique = [...new Set(languages)];
  return unique.flatMap((language) => schemes.map((scheme) => ({ scheme, language })));
}

/** What a settings change needs: nothing, a configuration notification, a restart, or a start/stop. */
export type SettingsChange = "none" | "notify" | "restart" | "start" | "stop";

export function classifyChange(before: RestLspSettings, after: RestLspSettings): SettingsChange {
  if (before.enable !== after.enable) return after.enable ? "start" : "stop";
  if (!after.enable) return "none";
  const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);
  // The process, the document selector and the middleware are fixed when the client is created.
  if (
    !same(serverLaunch(before), serverLaunch(after)) ||
    !same(before.languages, after.languages) ||
    before.showInSuggestList !== after.showInSuggestList
  ) {
    return "restart";
  }
  return same(serverOptions(before), serverOptions(after)) ? "none" : "notify";
}
