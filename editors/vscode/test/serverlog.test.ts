import { strict as assert } from "node:assert";
import { test } from "node:test";
import { ServerLogReader } from "../src/serverlog";

test("server log records keep their level; the server's own timestamp and level are dropped", () => {
  const reader = new ServerLogReader();
  assert.deepEqual(reader.line("2026-11-30 09:21:39,092 INFO rest_lsp.lsp.server: rest-lsp: model x ready on cpu."),
    { level: "info", text: "[server] rest_lsp.lsp.server: rest-lsp: model x ready on cpu." });
  assert.deepEqual(reader.line("2026-11-30 09:21:40,001 WARNING rest_lsp.service.completion: slow"),
    { level: "warn", text: "[server] rest_lsp.service.completion: slow" });
  assert.equal(reader.line("2026-11-30 09:21:41,000 DEBUG pygls: x").level, "debug");
  assert.equal(reader.line("2026-11-30 09:21:41,000 CRITICAL x: y").level, "error");
});

test("a traceback continues its record's level; text before any record is an error", () => {
  const reader = new ServerLogReader();
  assert.equal(reader.line("/usr/bin/python: No module named rest_lsp").level, "error");
  reader.line("2026-11-30 09:21:39,092 ERROR rest_lsp.lsp.server: boom");
  assert.deepEqual(reader.line("Traceback (most recent call last):"), { level: "error", text: "[server] Traceback (most recent call last):" });
  reader.line("2026-11-30 09:21:39,092 INFO rest_lsp.lsp.server: indexing");
  assert.equal(reader.line("  a second line of that message").level, "info");
});
