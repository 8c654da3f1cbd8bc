// The server's stderr, a line at a time, at the level the server logged it at. Left to the language client, every
// stderr line lands in the output as [error], "model ready" included.
// No `vscode` import here: node:test checks this module without VS Code.

export type Level = "debug" | "info" | "warn" | "error";

const LEVELS: Record<string, Level> = { DEBUG: "debug", INFO: "info", WARNING: "warn", ERROR: "error", CRITICAL: "error" };
// rest_lsp/commands/lsp.py's format: "%(asctime)s %(levelname)s %(name)s: %(message)s".
const LOG_LINE = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)? (DEBUG|INFO|WARNING|ERROR|CRITICAL) (.*)$/;

export class ServerLogReader {
  // A line that is not a log record continues the record before it (a traceback after an ERROR); before the
  // first record it is the interpreter's own complaint (a crash before logging started): an error.
  private last: Level = "error";

  line(text: string): { level: Level; text: string } {
    const record = LOG_LINE.exec(text);
    if (record) {
      this.last = LEVELS[record[1]];
      return { level: this.last, text: `[server] ${record[2]}` };
    }
    return { level: this.last, text: `[server] ${text}` };
  }
}
