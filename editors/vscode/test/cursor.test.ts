import { strict as assert } from "node:assert";
import { test } from "node:test";
import { CursorHints, CursorParams, Timers } from "../src/cursor";

/** Timers run by hand: `advance(ms)` fires those due. */
class ManualTimers implements Timers {
  now = 0;
  private due = new Map<number, { at: number; run: () => void }>();
  private next = 0;
  set(run: () => void, ms: number): unknown {
    this.due.set(++this.next, { at: this.now + ms, run });
    return this.next;
  }
  clear(handle: unknown): void {
    this.due.delete(handle as number);
  }
  advance(ms: number): void {
    this.now += ms;
    for (const [handle, { at, run }] of [...this.due]) {
      if (at <= this.now) {
        this.due.delete(handle);
        run();
      }
    }
  }
}

const at = (uri: string, line: number, character: number): CursorParams => ({
  textDocument: { uri },
  position: { line, character },
});

test("only where the cursor rests for the debounce is sent", () => {
  const timers = new ManualTimers();
  const sent: CursorParams[] = [];
  const hints = new CursorHints((p) => sent.push(p), timers, 150);
  hints.moved(at("file:///a.py", 1, 0));
  timers.advance(100);
  hints.moved(at("file:///a.py", 2, 0));
  timers.advance(100);
  assert.deepEqual(sent, []);
  timers.advance(50);
  assert.deepEqual(sent, [at("file:///a.py", 2, 0)]);
});

test("the place last sent is not sent again, until a new server", () => {
  const timers = new ManualTimers();
  const sent: CursorParams[] = [];
  const hints = new CursorHints((p) => sent.push(p), timers, 150);
  hints.moved(at("file:///a.py", 2, 4));
  timers.advance(150);
  hints.moved(at("file:///a.py", 3, 0));
  hints.moved(at("file:///a.py", 2, 4)); // away and back within the debounce
  timers.advance(150);
  hints.moved(at("file:///b.py", 2, 4)); // the same position in another document is another place
  timers.advance(150);
  assert.deepEqual(sent, [at("file:///a.py", 2, 4), at("file:///b.py", 2, 4)]);
  hints.reset();
  hints.moved(at("file:///b.py", 2, 4));
  timers.advance(150);
  assert.equal(sent.length, 3);
});

test("a pending place is dropped on dispose", () => {
  const timers = new ManualTimers();
  const sent: CursorParams[] = [];
  const hints = new CursorHints((p) => sent.push(p), timers, 150);
  hints.moved(at("file:///a.py", 1, 0));
  hints.dispose();
  timers.advance(500);
  assert.deepEqual(sent, []);
});
