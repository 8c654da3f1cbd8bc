#!/usr/bin/env bash
# A newcomer's install must be quiet: building rest-lsp (as `pip install .` does, in an isolated build
# environment with a current setuptools) prints no deprecation warning. `project.license` as a table did.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
log=$(python3 -m pip wheel --no-deps --no-cache-dir -v -w "$out" . 2>&1) || { echo "$log"; exit 1; }
if grep -i -B2 -A6 "deprecat" <<<"$log"; then
    echo "install-check: building rest-lsp prints the deprecation warning above." >&2
    exit 1
fi
echo "install-check: rest-lsp builds without warnings ($(ls "$out"))"
