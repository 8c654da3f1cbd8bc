#!/usr/bin/env bash
# Runs every editors/nvim/tests/*_test.lua in a headless Neovim 0.11+ and prints "N passed, N failed".
# NVIM (default: nvim on PATH) and REST_LSP_SERVER (default: "rest-lsp --stdio") choose the binaries.
set -uo pipefail
cd "$(dirname "$0")"
nvim_bin="${NVIM:-nvim}"
passed=0
failed=0
for test in *_test.lua; do
  echo "== $test"
  if timeout 600 "$nvim_bin" --headless --clean -l "$test"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
