// Why the server could not start, said in one sentence that ends with the fix.
// No `vscode` import here: node:test checks this module without VS Code.

import * as path from "node:path";
import type { Launch, RestLspSettings } from "./settings";

/** What a path on disk is, as far as starting a program goes. */
export type Probe = (file: string) => "ok" | "missing" | "not-executable";

export type LaunchProblem =
  | { kind: "missing"; program: string }
  | { kind: "not-executable"; program: string }
  | { kind: "failed"; detail: string };

/** Finds the program the way a spawn would: a name with a slash is a path, any other name is looked up on PATH.
 *  Returns undefined when it is there and executable. */
export function checkProgram(command: string, pathEnv: string | undefined, probe: Probe): LaunchProblem | undefined {
  if (command.includes("/") || command.includes("\\")) {
    const found = probe(command);
    return found === "ok" ? undefined : { kind: found, program: command };
  }
  let notExecutable: string | undefined;
  for (const dir of (pathEnv ?? "").split(path.delimiter)) {
    if (dir === "") continue;
    const candidate = path.join(dir, command);
    const found = probe(candidate);
    if (found === "ok") return undefined;
    if (found === "not-executable") notExecutable ??= candidate;
  }
  return notExecutable ? { kind: "not-executable", program: notExecutable } : { kind: "missing", program: command };
}

const firstLine = (text: string, max = 160) => {
  const line = text.split("\n").find((l) => l.trim() !== "")?.trim() ?? "";
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
};

/** One sentence: what went wrong, then what to set (and where) to fix it. */
/** `remote`: the window is remote (SSH, WSL, a container, code-server), where VS Code reads these machine-scoped
 *  settings from the Remote settings only. */
export function startFailureMessage(
  settings: RestLspSettings,
  launch: Launch,
  problem: LaunchProblem,
  remote = false,
): string {
  const usesPython = settings.python !== "";
  const setting = usesPython ? "restLsp.server.python" : "restLsp.server.command";
  const where = remote ? "in the Remote settings (Preferences: Open Remote Settings)" : "in your user settings";
  const fix = usesPython
    ? `set restLsp.server.python ${where} to a Python that has rest-lsp installed`
    : "install rest-lsp (pip install . in its checkout), or set restLsp.server.command to its full path " +
      `(or restLsp.server.python to the Python that has it) ${where}`;
  switch (problem.kind) {
    case "missing": {
      const where = problem.program.includes("/") || problem.program.includes("\\")
        ? `"${problem.program}" (${setting}) does not exist`
        : `"${problem.program}" was not found on VS Code's PATH`;
      return `REST LSP could not start its server: ${where}; ${fix}.`;
    }
    case "not-executable":
      return `REST LSP could not start its server: "${problem.program}" (${setting}) is not executable; ${fix}.`;
    case "failed": {
      const detail = firstLine(problem.detail);
      const shown = [launch.command, ...launch.args].join(" ");
      return `REST LSP could not start its server: "${shown}" stopped before it answered` +
        `${detail ? ` (${detail})` : ""}; the "REST LSP" output has its error, and ${fix}.`;
    }
  }
}
