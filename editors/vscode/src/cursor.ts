// Where the editor's cursor is, for the server's `restLsp/cursor` notification: it prefills the prompt there
// before a request comes (a file just opened, a click), which no edit tells it. Debounced, and only for a place
// other than the last one sent. No `vscode` import here: node:test checks this module without VS Code.

export const CURSOR_NOTIFICATION = "restLsp/cursor";
// Arrow keys held down or a drag move the cursor many times a second: only where it rests is worth warming.
export const CURSOR_DEBOUNCE_MS = 150;

export interface CursorParams {
  textDocument: { uri: string };
  position: { line: number; character: number };
}

export interface Timers {
  set(run: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

const realTimers: Timers = {
  set: (run, ms) => setTimeout(run, ms),
  clear: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

const samePlace = (a: CursorParams, b: CursorParams | undefined) =>
  b !== undefined &&
  a.textDocument.uri === b.textDocument.uri &&
  a.position.line === b.position.line &&
  a.position.character === b.position.character;

export class CursorHints {
  private pending: CursorParams | undefined;
  private handle: unknown;
  private last: CursorParams | undefined;

  constructor(
    private readonly send: (params: CursorParams) => void,
    private readonly timers: Timers = realTimers,
    private readonly delayMs = CURSOR_DEBOUNCE_MS,
  ) {}

  /** The cursor rests here now (an empty selection): sent once it stays `delayMs`, unless it was the last sent. */
  moved(params: CursorParams): void {
    this.pending = params;
    if (this.handle !== undefined) this.timers.clear(this.handle);
    this.handle = this.timers.set(() => this.flush(), this.delayMs);
  }

  /** A new server knows no place yet: the next one is sent even if it is the last one sent. Drops a pending one. */
  reset(): void {
    this.dispose();
    this.last = undefined;
  }

  dispose(): void {
    if (this.handle !== undefined) this.timers.clear(this.handle);
    this.handle = undefined;
    this.pending = undefined;
  }

  private flush(): void {
    const params = this.pending;
    this.handle = undefined;
    this.pending = undefined;
    if (params === undefined || samePlace(params, this.last)) return;
    this.last = params;
    this.send(params);
  }
}
