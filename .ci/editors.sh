#!/usr/bin/env bash
# The VS Code extension: install its locked dependencies, compile, run its unit tests, package the .vsix.
# Called by ./dev.sh test (so by .ci/run), before .ci/vscode-e2e.sh runs the .vsix in code-server; the Neovim
# plugin is tested by pytest (tests/editors/test_nvim.py).
set -euo pipefail
cd "$(dirname "$0")/../editors/vscode"

echo "== editors/vscode: npm ci"
npm ci --no-audit --no-fund

echo "== editors/vscode: tsc"
npx tsc -p .

echo "== editors/vscode: unit tests (node --test)"
node --test out/test/

echo "== editors/vscode: vsce package"
rm -f rest-lsp.vsix
npx vsce package --allow-missing-repository --skip-license --out rest-lsp.vsix
test -s rest-lsp.vsix
# The packaged extension must hold its entry point and its runtime dependency.
python3 - <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile("rest-lsp.vsix").namelist())
missing = [n for n in ("extension/out/src/extension.js", "extension/node_modules/vscode-languageclient/package.json")
           if n not in names]
sys.exit(f"rest-lsp.vsix lacks {missing}" if missing else 0)
PY
echo "editors/vscode: packaged $(pwd)/rest-lsp.vsix ($(stat -c %s rest-lsp.vsix) bytes)"
