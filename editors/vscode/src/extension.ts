// Wires the rest-lsp server into VS Code: starts it, shows its state in the status bar, and forwards
// acceptances. The logic worth testing lives in settings.ts, status.ts and stats.ts.

import * as fs from "node:fs";
import * as readline from "node:readline";
import type { Readable } from "node:stream";
import * as vscode from "vscode";
import {
  CancellationToken,
  CloseAction,
  DidChangeConfigurationNotification,
  ErrorAction,
  ErrorHandler,
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  Middleware,
  ServerOptions,
  State,
} from "vscode-languageclient/node";
import { CURSOR_NOTIFICATION, CursorHints, CursorParams } from "./cursor";
import { cursorHint } from "./hint";
import { classifyChange, documentSelector, readSettings, RestLspSettings, serverLaunch, serverOptions } from "./settings";
import { ServerLogReader } from "./serverlog";
import { checkProgram, LaunchProblem, Probe, startFailureMessage } from "./startup";
import { formatStats, modelSettled, speedFromStats, stateFromStats } from "./stats";
import { ProgressTracker, ServerState, Speed, statusText } from "./status";

const STOP_TIMEOUT_MS = 10000;
const SECTION = "restLsp";
const SERVER_ACCEPT = "rest-lsp.accept";
const SERVER_STATS = "rest-lsp.stats";
// Items' accept commands are routed through this one, so that the acceptance reaches the server even if it did
// not list its commands in `executeCommandProvider`, and so that the status bar refreshes after it.
const FORWARD_ACCEPT = "restLsp.accept";
const MODEL_POLL_MS = 1000;

const probe: Probe = (file) => {
  try {
    if (!fs.statSync(file).isFile()) return "missing";
  } catch {
    return "missing";
  }
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return "ok";
  } catch {
    return "not-executable";
  }
};

const eachLine = (input: Readable, handle: (line: string) => void) =>
  readline.createInterface({ input, crlfDelay: Infinity, terminal: false, historySize: 0 }).on("line", handle);

/** A language client that leaves start-up failures to the extension, which reports each once, with its fix:
 *  left alone, the client adds notices of its own ("couldn't create connection", "connection got closed"). */
class RestLanguageClient extends LanguageClient {
  starting = true;

  override error(message: string, data?: unknown, showNotification: boolean | "force" = true): void {
    super.error(message, data, this.starting ? false : showNotification);
  }
}

class RestLspExtension implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private settings: RestLspSettings;
  private state: ServerState = { kind: "off" };
  private speed: Speed = {};
  private readonly progress = new ProgressTracker();
  private readonly output = vscode.window.createOutputChannel("REST LSP", { log: true });
  private readonly item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  // Start, stop and restart run one after the other, never interleaved.
  private lifecycle: Promise<void> = Promise.resolve();
  private statsInFlight = false;
  private stopping = false;
  private readonly hints = new CursorHints((params) => this.sendCursor(params));

  constructor() {
    this.settings = this.read();
    this.item.show();
    this.render();
  }

  private read(): RestLspSettings {
    const config = vscode.workspace.getConfiguration(SECTION);
    const { settings, problems } = readSettings((key) => config.get(key));
    for (const p of problems) this.output.warn(`[settings] ${p}`);
    if (problems.length) void vscode.window.showWarningMessage(`REST LSP: ${problems[0]}`);
    return settings;
  }

  private setState(state: ServerState): void {
    this.state = state;
    this.render();
  }

  private render(): void {
    const { text, tooltip } = statusText(this.state, this.speed);
    this.item.text = text;
    this.item.tooltip = tooltip;
    this.item.command =
      this.state.kind === "off" ? "restLsp.toggle" : this.state.kind === "error" ? "restLsp.restart" : "restLsp.showStats";
    this.item.backgroundColor =
      this.state.kind === "error" ? new vscode.ThemeColor("statusBarItem.errorBackground") : undefined;
  }

  private queue(step: () => Promise<void>): Promise<void> {
    this.lifecycle = this.lifecycle.then(step, step);
    return this.lifecycle;
  }

  start(): Promise<void> {
    return this.queue(() => this.startNow());
  }

  stop(): Promise<void> {
    return this.queue(async () => {
      await this.stopNow();
      this.setState({ kind: "off" });
    });
  }

  restart(): Promise<void> {
    return this.queue(async () => {
      await this.stopNow();
      await this.startNow();
    });
  }

  private async startNow(): Promise<void> {
    if (!this.settings.enable) {
      this.setState({ kind: "off" });
      return;
    }
    const launch = serverLaunch(this.settings);
    const missing = checkProgram(launch.command, process.env.PATH, probe);
    if (missing !== undefined) {
      this.failToStart(missing);
      return;
    }
    const serverOpts: ServerOptions = { command: launch.command, args: launch.args };
    let client: RestLanguageClient | undefined;
    const clientOpts: LanguageClientOptions = {
      documentSelector: documentSelector(this.settings.languages),
      initializationOptions: serverOptions(this.settings),
      outputChannel: this.output,
      middleware: this.middleware(),
      // A server that dies while starting is reported by failToStart, and not restarted in a loop.
      initializationFailedHandler: () => false,
      errorHandler: this.errorHandler(() => client),
      stdioOptions: {
        stdout: (input, channel) => eachLine(input, (line) => channel.info(line)),
        stderr: (input, channel) => {
          const reader = new ServerLogReader();
          eachLine(input, (line) => {
            const { level, text } = reader.line(line);
            channel[level](text);
          });
        },
      },
    };
    client = new RestLanguageClient("restLsp", "REST LSP", serverOpts, clientOpts);
    client.onDidChangeState((e) => {
      if (e.newState === State.Stopped && !this.stopping && this.client === client) {
        this.setState({ kind: "error", message: "The rest-lsp server stopped." });
      }
    });
    this.client = client;
    this.hints.reset();
    this.progress.reset();
    this.speed = {};
    this.setState({ kind: "starting" });
    this.output.info(`[client] starting: ${launch.command} ${launch.args.join(" ")}`);
    try {
      await client.start();
      client.starting = false;
      void this.watchModel(client);
    } catch (err) {
      // `starting` stays true: the failed client's late notices ("connection is erroring") stay quiet too.
      this.failToStart({ kind: "failed", detail: err instanceof Error ? err.message : String(err) });
    }
  }

  private errorHandler(client: () => RestLanguageClient | undefined): ErrorHandler {
    let fallback: ErrorHandler | undefined;
    const usual = () => (fallback ??= client()!.createDefaultErrorHandler());
    return {
      error: (error, message, count) =>
        client()?.starting ? { action: ErrorAction.Shutdown, handled: true } : usual().error(error, message, count),
      closed: () => (client()?.starting ? { action: CloseAction.DoNotRestart, handled: true } : usual().closed()),
    };
  }

  /** The status bar turns red, and one notice says what failed and what to set. */
  private failToStart(problem: LaunchProblem): void {
    const remote = vscode.env.remoteName !== undefined;
    const message = startFailureMessage(this.settings, serverLaunch(this.settings), problem, remote);
    this.output.error(`[client] ${message}`);
    this.setState({ kind: "error", message });
    const settingsButton = "Open Settings";
    const logButton = "Show Output";
    void vscode.window.showErrorMessage(message, settingsButton, logButton).then((choice) => {
      if (choice === settingsButton) {
        const command = remote ? "workbench.action.openRemoteSettings" : "workbench.action.openSettings";
        void vscode.commands.executeCommand(command, { query: "restLsp.server" });
      } else if (choice === logButton) {
        this.output.show();
      }
    });
  }

  private async stopNow(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (client === undefined) return;
    this.stopping = true;
    try {
      // The server answers `shutdown` once its decoding thread has ended the step it is in and the acceptance
      // table is saved: under a loaded CPU that takes longer than the client's default 2 s.
      if (client.isRunning()) await client.stop(STOP_TIMEOUT_MS);
    } catch (err) {
      this.output.warn(`[client] stopping the server failed: ${err instanceof Error ? err.message : err}`);
    } finally {
      this.stopping = false;
    }
  }

  private middleware(): Middleware {
    const showInSuggestList = this.settings.showInSuggestList;
    return {
      handleWorkDoneProgress: (token, params, next) => {
        this.setState(this.progress.apply(this.state, token, params));
        next(token, params);
      },
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        const result = await next(document, position, context, token);
        const items = result === null || result === undefined ? [] : Array.isArray(result) ? result : result.items;
        for (const item of items) item.command = this.forwardAccept(item.command);
        if (items.length > 0) void this.refreshSpeed();
        return result;
      },
      provideCompletionItem: async (document, position, context, token, next) => {
        // Off by default: the ghost text shows the same completion, and each request runs the model.
        if (!showInSuggestList) return undefined;
        const result = await next(document, position, context, token);
        const items = result === null || result === undefined ? [] : Array.isArray(result) ? result : result.items;
        for (const item of items) item.command = this.forwardAccept(item.command);
        return result;
      },
    };
  }

  /** The cursor of `editor` rests somewhere: the server warms the prompt there, for the request that follows (a
   *  file just opened, a click, has no edit to tell it). Only an empty selection in the active editor, in a
   *  document the client handles. */
  cursorMoved(editor: vscode.TextEditor | undefined): void {
    const client = this.client;
    if (client === undefined || !client.isRunning() || editor === undefined) return;
    const converter = client.code2ProtocolConverter;
    const hint = cursorHint({
      active: editor === vscode.window.activeTextEditor,
      selections: editor.selections,
      served: vscode.languages.match(documentSelector(this.settings.languages), editor.document) !== 0,
      uri: converter.asTextDocumentIdentifier(editor.document).uri,
      position: converter.asPosition(editor.selection.active),
    });
    if (hint !== undefined) this.hints.moved(hint);
  }

  private sendCursor(params: CursorParams): void {
    const client = this.client;
    if (client === undefined || !client.isRunning()) return;
    client.sendNotification(CURSOR_NOTIFICATION, params).catch((err: unknown) => {
      this.output.warn(`[client] ${CURSOR_NOTIFICATION} failed: ${err instanceof Error ? err.message : err}`);
    });
  }

  private forwardAccept(command: vscode.Command | undefined): vscode.Command | undefined {
    if (command === undefined || command.command !== SERVER_ACCEPT) return command;
    return { title: command.title, command: FORWARD_ACCEPT, arguments: command.arguments ?? [] };
  }

  async accept(...args: unknown[]): Promise<void> {
    const client = this.client;
    if (client === undefined || !client.isRunning()) return;
    try {
      await client.sendRequest(ExecuteCommandRequest.type, { command: SERVER_ACCEPT, arguments: args });
    } catch (err) {
      this.output.warn(`[client] ${SERVER_ACCEPT} failed: ${err instanceof Error ? err.message : err}`);
    }
  }

  private async stats(token?: CancellationToken): Promise<unknown> {
    const client = this.client;
    if (client === undefined || !client.isRunning()) throw new Error("The rest-lsp server is not running.");
    return client.sendRequest(ExecuteCommandRequest.type, { command: SERVER_STATS, arguments: [] }, token);
  }

  // The server loads its model in the background after `initialize`: ask until it is loaded or has failed.
  private async watchModel(client: LanguageClient): Promise<void> {
    while (this.client === client && client.isRunning()) {
      try {
        const stats = await this.stats();
        this.setState(stateFromStats(this.state, stats));
        if (modelSettled(stats)) return;
      } catch (err) {
        this.output.warn(`[client] ${SERVER_STATS} failed: ${err instanceof Error ? err.message : err}`);
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, MODEL_POLL_MS));
    }
  }

  private async refreshSpeed(): Promise<void> {
    if (this.statsInFlight) return;
    this.statsInFlight = true;
    try {
      const stats = await this.stats();
      this.speed = speedFromStats(stats);
      this.setState(stateFromStats(this.state, stats));
    } catch (err) {
      this.output.warn(`[client] ${SERVER_STATS} failed: ${err instanceof Error ? err.message : err}`);
    } finally {
      this.statsInFlight = false;
    }
  }

  async showStats(): Promise<void> {
    if (this.client === undefined) {
      void vscode.window.showInformationMessage("REST LSP is off; run \"REST LSP: Toggle Completions\" to start it.");
      return;
    }
    try {
      const stats = await this.stats();
      this.speed = speedFromStats(stats);
      this.setState(stateFromStats(this.state, stats));
      const lines = formatStats(stats);
      this.output.info(`[stats] ${lines.join("; ")}`);
      void vscode.window.showInformationMessage("REST LSP stats", { modal: true, detail: lines.join("\n") });
    } catch (err) {
      void vscode.window.showErrorMessage(`REST LSP: could not get stats: ${err instanceof Error ? err.message : err}`);
    }
  }

  async toggle(): Promise<void> {
    const config = vscode.workspace.getConfiguration(SECTION);
    // The configuration listener starts or stops the server.
    await config.update("enable", !this.settings.enable, vscode.ConfigurationTarget.Global);
  }

  async onConfigurationChanged(): Promise<void> {
    const before = this.settings;
    const after = this.read();
    this.settings = after;
    switch (classifyChange(before, after)) {
      case "start":
      case "restart":
        await this.restart();
        break;
      case "stop":
        await this.stop();
        break;
      case "notify": {
        const client = this.client;
        if (client?.isRunning()) {
          await client.sendNotification(DidChangeConfigurationNotification.type, { settings: serverOptions(after) });
          // A new model, device or dtype is loaded again: show "starting" until it is.
          void this.watchModel(client);
        }
        break;
      }
      case "none":
        break;
    }
  }

  dispose(): void {
    this.hints.dispose();
    void this.stopNow();
    this.item.dispose();
    this.output.dispose();
  }
}

let extension: RestLspExtension | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const ext = new RestLspExtension();
  extension = ext;
  context.subscriptions.push(
    ext,
    vscode.commands.registerCommand("restLsp.restart", () => ext.restart()),
    vscode.commands.registerCommand("restLsp.showStats", () => ext.showStats()),
    vscode.commands.registerCommand("restLsp.toggle", () => ext.toggle()),
    vscode.commands.registerCommand(FORWARD_ACCEPT, (...args: unknown[]) => ext.accept(...args)),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration(SECTION)) void ext.onConfigurationChanged();
    }),
    vscode.window.onDidChangeTextEditorSelection((e) => ext.cursorMoved(e.textEditor)),
    vscode.window.onDidChangeActiveTextEditor((editor) => ext.cursorMoved(editor)),
  );
  await ext.start();
}

export async function deactivate(): Promise<void> {
  const ext = extension;
  extension = undefined;
  if (ext !== undefined) await ext.stop();
}
