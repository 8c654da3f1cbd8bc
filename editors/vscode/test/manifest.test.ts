// package.json declares the settings and commands VS Code shows; these tests keep it and the code in step.
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DEFAULT_SETTINGS, readSettings } from "../src/settings";

// Compiled to out/test/, so the manifest and sources are two folders up.
const root = join(__dirname, "..", "..");
const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
const properties: Record<string, { default: unknown; scope?: string }> = manifest.contributes.configuration.properties;

test("every declared setting is read, and its declared default is the code's default", () => {
  const asked = new Set<string>();
  const { settings, problems } = readSettings((key) => {
    asked.add(`restLsp.${key}`);
    return properties[`restLsp.${key}`]?.default;
  });
  assert.deepEqual(problems, []);
  assert.deepEqual(settings, DEFAULT_SETTINGS);
  assert.deepEqual([...asked].sort(), Object.keys(properties).sort());
});

test("every declared command is registered by the extension, and the entry point is the compiled one", () => {
  const source = readFileSync(join(root, "src", "extension.ts"), "utf8");
  for (const { command } of manifest.contributes.commands) {
    assert.ok(source.includes(`registerCommand("${command}"`), `${command} is declared but not registered`);
  }
  assert.equal(manifest.main, "./out/src/extension.js");
  assert.ok(source.includes("export async function activate"));
});

test("the settings that choose which program runs are machine-scoped, and only those", () => {
  // A repository's .vscode/settings.json must not be able to make VS Code run another program (README).
  const machine = Object.keys(properties).filter((key) => properties[key].scope === "machine").sort();
  assert.deepEqual(machine, ["restLsp.server.command", "restLsp.server.extraArgs", "restLsp.server.python"]);
});
