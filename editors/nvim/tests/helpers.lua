-- Test helpers: the test script (run with `nvim --headless -l`) drives a second Neovim started with
-- `--embed`, over RPC, the way a user's keystrokes would (nvim_input), with the plugin and the real server.
--
-- Environment:
--   REST_LSP_SERVER   the server command: space-separated, or a JSON list (default: "rest-lsp --stdio")
--   REST_LSP_TIMEOUT  seconds to wait for the model to load (default 180)

local H = {}

H.plugin_dir = vim.fs.dirname(vim.fs.dirname(vim.fs.normalize(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":p"))))
local server = os.getenv("REST_LSP_SERVER") or "rest-lsp --stdio"
H.server_cmd = vim.startswith(server, "[") and vim.json.decode(server) or vim.split(server, " ", { trimempty = true })
H.load_timeout_ms = (tonumber(os.getenv("REST_LSP_TIMEOUT")) or 180) * 1000

local failures = 0

function H.log(fmt, ...)
  io.stdout:write((fmt):format(...) .. "\n")
end

function H.check(cond, fmt, ...)
  local msg = (fmt):format(...)
  if cond then
    H.log("ok: %s", msg)
  else
    failures = failures + 1
    H.log("FAIL: %s", msg)
  end
  return cond
end

--- Ends the test: exit status 1 if any check failed.
function H.finish(child)
  if child then
    pcall(vim.fn.jobstop, child.job)
  end
  H.log(failures == 0 and "PASSED" or ("FAILED (%d checks)"):format(failures))
  os.exit(failures == 0 and 0 or 1)
end

--- Stops the test now with a failure, printing what the child can tell about it.
function H.abort(child, fmt, ...)
  failures = failures + 1
  H.log("FAIL: " .. fmt, ...)
  if child then
    local ok, info = pcall(H.lua, child, [[
      local clients = {}
      for _, c in ipairs(vim.lsp.get_clients({ _uninitialized = true })) do
        clients[#clients + 1] = ("%s (id %d, initialized %s, stopped %s)"):format(c.name, c.id,
          tostring(c.initialized), tostring(c:is_stopped()))
      end
      return { messages = vim.api.nvim_exec2("messages", { output = true }).output, clients = clients,
        buffer = vim.api.nvim_buf_get_name(0), filetype = vim.bo.filetype, log = vim.lsp.get_log_path() }
    ]])
    H.log("child state: %s", ok and vim.inspect(info) or tostring(info))
  end
  H.finish(child)
end

--- A temporary workspace with `files` ({ [name] = text }); returns its path.
function H.workspace(files)
  local root = vim.fs.normalize(vim.fn.tempname())
  vim.fn.mkdir(root .. "/.git", "p") -- a root marker
  for name, text in pairs(files) do
    local path = root .. "/" .. name
    vim.fn.mkdir(vim.fs.dirname(path), "p")
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
  end
  return root
end

--- Starts a child Neovim with the plugin set up by `setup` (a table passed to require("rest_lsp").setup).
function H.spawn(setup, cwd)
  local init = vim.fn.tempname() .. ".lua"
  local f = assert(io.open(init, "w"))
  f:write(([[
vim.opt.runtimepath:prepend(%q)
vim.opt.swapfile = false
vim.o.shada = ""
vim.cmd("runtime plugin/rest_lsp.lua")
require("rest_lsp").setup(vim.json.decode(%q, { luanil = { object = true } }))
]]):format(H.plugin_dir, vim.json.encode(setup)))
  f:close()
  local job = vim.fn.jobstart({ vim.v.progpath, "--embed", "--headless", "--clean", "-n", "-u", init },
    { rpc = true, cwd = cwd })
  assert(job > 0, "could not start a child Neovim")
  local child = { job = job }
  return child
end

--- Runs Lua in the child and returns its result.
function H.lua(child, code, ...)
  return vim.rpcrequest(child.job, "nvim_exec_lua", code, { ... })
end

--- Types keys into the child as a user would.
function H.type(child, keys)
  vim.rpcrequest(child.job, "nvim_input", keys)
end

--- Waits until `fn()` is truthy; returns its value, or nil after `timeout_ms`.
function H.wait(timeout_ms, fn, interval)
  local value
  vim.wait(timeout_ms, function()
    value = fn()
    return value
  end, interval or 50)
  return value
end

--- Waits until `fn()` is truthy and returns its value; after `timeout_ms` the test stops as a failure saying
--- what did not happen. For waits that must succeed: a wait whose result is ignored proves nothing.
function H.must(child, timeout_ms, what, fn)
  local value = H.wait(timeout_ms, fn)
  if not value then
    H.abort(child, "timed out after %d ms waiting for: %s", timeout_ms, what)
  end
  return value
end

-- Installed in the child: records every inline completion reply and every executeCommand (with the
-- server's answer) that the rest-lsp client exchanges, without changing them.
H.RECORDER = [[
local client = vim.lsp.get_clients({ name = "rest_lsp" })[1]
if not client then return false end
_G.replies, _G.commands = _G.replies or {}, _G.commands or {}
if client._recording then return true end
client._recording = true
local request = client.request
client.request = function(self, method, params, handler, bufnr)
  local inner = handler or function() end
  if method == "textDocument/inlineCompletion" then
    handler = function(err, result, ctx, config)
      table.insert(_G.replies, { err = err, result = result, position = params.position,
        tick = vim.api.nvim_buf_get_changedtick(ctx.bufnr) })
      return inner(err, result, ctx, config)
    end
  elseif method == "workspace/executeCommand" then
    local entry = { command = params.command, arguments = params.arguments }
    table.insert(_G.commands, entry)
    handler = function(err, result, ctx, config)
      entry.err, entry.result, entry.answered = err, result, true
      return inner(err, result, ctx, config)
    end
  end
  return request(self, method, params, handler, bufnr)
end
return true
]]

--- Waits for the child's rest-lsp client to start and its model to load; installs the recorder.
function H.wait_ready(child)
  local ok = H.wait(30000, function()
    return H.lua(child, H.RECORDER)
  end, 200)
  if not ok then
    return false, "the rest-lsp client did not start"
  end
  local stats = H.wait(H.load_timeout_ms, function()
    local s = H.lua(child, [[
      local client = vim.lsp.get_clients({ name = "rest_lsp" })[1]
      local r = client and client:request_sync("workspace/executeCommand",
        { command = "rest-lsp.stats", arguments = {} }, 5000, 0)
      return r and r.result or vim.NIL
    ]])
    if type(s) == "table" and (s.ready or s.load_error ~= nil and s.load_error ~= vim.NIL) then
      return s
    end
  end, 500)
  if not stats then
    return false, "the model did not load in time"
  end
  if stats.load_error and stats.load_error ~= vim.NIL then
    return false, "the model failed to load: " .. tostring(stats.load_error)
  end
  return true, stats
end

--- The ghost text the child shows now: its text (lines joined by "\n") and position, or nil.
H.GHOST = [[
local ns = require("rest_lsp.ghost").namespace
local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
if #marks == 0 then return vim.NIL end
local m = marks[1]
local parts = {}
for _, chunk in ipairs(m[4].virt_text or {}) do parts[#parts + 1] = chunk[1] end
local lines = { table.concat(parts) }
for _, vl in ipairs(m[4].virt_lines or {}) do
  local p = {}
  for _, chunk in ipairs(vl) do p[#p + 1] = chunk[1] end
  lines[#lines + 1] = table.concat(p)
end
return { text = table.concat(lines, "\n"), row = m[2], col = m[3], count = #marks }
]]

function H.ghost(child)
  local g = H.lua(child, H.GHOST)
  return g ~= vim.NIL and g or nil
end

return H
