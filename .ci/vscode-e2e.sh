#!/usr/bin/env bash
# The VS Code extension in a real VS Code: code-server (VS Code in a browser, from npm) driven by Debian's
# Chromium through Playwright (pip), against the real server and the default model (editors/vscode/e2e).
#
# Needs what ./dev.sh sets up (.venv with rest-lsp, playwright and the default model) and the .vsix that
# .ci/editors.sh builds. Installs, once per machine, into $REST_LSP_CI_CACHE (default ~/.cache/rest-lsp-ci):
#   - Debian: chromium, ripgrep (VS Code's file search), libkrb5-dev (to build code-server's kerberos module);
#   - code-server $CODE_SERVER_VERSION, built from npm with this machine's Node 20 (see install_code_server).
# A second run finds both and starts the test at once.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PY:-$REPO/.venv/bin/python}
CACHE=${REST_LSP_CI_CACHE:-${HOME:-/root}/.cache/rest-lsp-ci}
CODE_SERVER_VERSION=4.96.4
CS_DIR=$CACHE/code-server-$CODE_SERVER_VERSION
CS_BIN=$CS_DIR/node_modules/.bin/code-server
CHROMIUM=${REST_LSP_CHROMIUM:-/usr/bin/chromium}

install_debian_packages() {
    local missing=()
    [ -x "$CHROMIUM" ] || missing+=(chromium)
    command -v rg >/dev/null || missing+=(ripgrep)
    dpkg -s libkrb5-dev >/dev/null 2>&1 || missing+=(libkrb5-dev)
    [ ${#missing[@]} -eq 0 ] && return
    if [ "$(id -u)" != 0 ]; then
        echo "vscode-e2e: needs the Debian packages ${missing[*]}: run 'sudo apt-get install ${missing[*]}' first." >&2
        exit 1
    fi
    echo "== vscode-e2e: apt-get install ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
}

# code-server's npm package builds VS Code's native modules on install, and its scripts reach for two things
# this network does not have: a git dependency (VS Code's proxy agent, also published to the npm registry with
# the same integrity hash) and a ripgrep binary downloaded by @vscode/ripgrep. So: install without scripts,
# resolve the git dependency from the registry, give @vscode/ripgrep Debian's rg, then build everything with
# Node's own headers (/usr/include/node: node-gyp would otherwise download them).
install_code_server() {
    local stamp=$CS_DIR/.installed
    [ -f "$stamp" ] && [ -x "$CS_BIN" ] && return
    [ -f /usr/include/node/node.h ] || { echo "vscode-e2e: Node's headers (/usr/include/node) are missing." >&2; exit 1; }
    rm -rf "$CS_DIR"
    mkdir -p "$CS_DIR"
    local npm_quiet=(--no-audit --no-fund --loglevel=error)
    (cd "$CS_DIR" && npm install "${npm_quiet[@]}" --ignore-scripts "code-server@$CODE_SERVER_VERSION")
    local vscode=$CS_DIR/node_modules/code-server/lib/vscode
    node -e '
        const fs = require("fs"); const file = process.argv[1];
        const lock = JSON.parse(fs.readFileSync(file, "utf8"));
        for (const [name, entry] of Object.entries(lock.packages))
            if (typeof entry.resolved === "string" && entry.resolved.startsWith("git")) delete entry.resolved;
        fs.writeFileSync(file, JSON.stringify(lock, null, 2));' "$vscode/npm-shrinkwrap.json"
    (cd "$vscode" && npm install "${npm_quiet[@]}" --omit=dev --ignore-scripts)
    mkdir -p "$vscode/node_modules/@vscode/ripgrep/bin"
    ln -sf "$(command -v rg)" "$vscode/node_modules/@vscode/ripgrep/bin/rg"
    (cd "$vscode" && npm_config_nodedir=/usr npm rebuild "${npm_quiet[@]}")
    (cd "$CS_DIR" && npm_config_nodedir=/usr npm rebuild "${npm_quiet[@]}" argon2)
    # The package's own postinstall: links, and the built-in extensions' dependencies.
    (cd "$CS_DIR/node_modules/code-server" && npm_config_unsafe_perm=true npm run "${npm_quiet[@]}" postinstall)
    "$CS_BIN" --version
    touch "$stamp"
}

install_debian_packages
if [ ! -f "$CS_DIR/.installed" ]; then
    mkdir -p "$CACHE"
    log=$CACHE/code-server-install.log
    echo "== vscode-e2e: installing code-server $CODE_SERVER_VERSION into $CS_DIR (a few minutes, once; log: $log)"
    install_code_server >"$log" 2>&1 || { tail -n 60 "$log"; echo "vscode-e2e: the code-server install failed (log above)." >&2; exit 1; }
fi
install_code_server  # a no-op once installed; checks that the script is there
[ -s editors/vscode/rest-lsp.vsix ] || bash .ci/editors.sh
"$PY" -c "import playwright" 2>/dev/null || {
    echo "vscode-e2e: $PY has no playwright: pip install -e '.[test]' (./dev.sh does)." >&2; exit 1; }

echo "== editors/vscode: end-to-end test in code-server $("$CS_BIN" --version | head -1 | cut -d' ' -f1) and $("$CHROMIUM" --version 2>/dev/null | head -1)"
export REST_LSP_CODE_SERVER=$CS_BIN REST_LSP_CHROMIUM=$CHROMIUM REST_LSP_VSIX=$REPO/editors/vscode/rest-lsp.vsix
"$PY" -m pytest -q -p no:cacheprovider editors/vscode/e2e
