// Which editor cursor is a hint for the server (`restLsp/cursor`): the cursor of the active editor, resting as one
// empty selection, in a document the client serves. A selection is someone choosing text, another editor's cursor
// is not where they will type, and a document of another language gets no completions to warm.
// No `vscode` import here: node:test checks this module without VS Code.
import { CursorParams } from "./cursor";

/** What the extension reads off a `vscode.TextEditor` (positions already in LSP's terms). */
export interface EditorCursor {
  active: boolean; // the window's active editor
  selections: readonly { isEmpty: boolean }[];
  served: boolean; // the client's document selector matches the document
  uri: string;
  position: { line: number; character: number };
}

/** The hint this cursor gives, or undefined when it gives none. */
export function cursorHint(editor: EditorCursor | undefined): CursorParams | undefined {
  if (editor === undefined || !editor.active || !editor.served) return undefined;
  if (editor.selections.length !== 1 || !editor.selections[0].isEmpty) return undefined;
  return {
    textDocument: { uri: editor.uri },
    position: { line: editor.position.line, character: editor.position.character },
  };
}
