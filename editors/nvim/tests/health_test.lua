-- :checkhealth rest_lsp with the default model: it finds the server, the model and the workspace index, and
-- reports no error. Then, with a server command that does not exist, it reports exactly that as an error.

local H = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, "S").source:sub(2)), "helpers.lua"))

local root = H.workspace({
  ["pkg/shapes.py"] = "class Square:\n    def __init__(self, side):\n        self.side = side\n\n"
    .. "    def area(self):\n        return self.side * self.side\n",
  ["main.py"] = "from pkg.shapes import Square\n\nprint(Square(3).area())\n",
})
local cache = vim.fn.tempname()
local child = H.spawn({ cmd = H.server_cmd, filetypes = { "python" }, settings = { cache_dir = cache } }, root)
H.lua(child, "vim.cmd.edit(...)", root .. "/main.py")
local ready, info = H.wait_ready(child)
if not ready then
  H.abort(child, "server ready: %s", info)
end

-- The index is saved once the workspace is indexed: wait for the server to count its files.
local indexed = H.wait(60000, function()
  local s = H.lua(child, [[
    local c = vim.lsp.get_clients({ name = "rest_lsp" })[1]
    local r = c:request_sync("workspace/executeCommand", { command = "rest-lsp.stats", arguments = {} }, 5000, 0)
    return r and r.result or vim.NIL
  ]])
  return type(s) == "table" and s.documents and s.documents >= 2 and s or nil
end, 500)
H.check(indexed ~= nil, "the server indexed the workspace (%s documents)", indexed and indexed.documents)
-- The manifest is written after the index is built: wait for the save.
H.must(child, 60000, "the index saved to " .. cache, function()
  return #vim.fn.glob(cache .. "/index/*/manifest.json", false, true) > 0
end)

local function checkhealth()
  return H.lua(child, [[
    vim.cmd("checkhealth rest_lsp")
    local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
    vim.cmd("tabclose")
    return lines
  ]])
end

local function has(lines, pattern)
  for _, line in ipairs(lines) do
    if line:find(pattern) then
      return line
    end
  end
  return nil
end

local report = checkhealth()
H.log("---- :checkhealth rest_lsp\n%s\n----", table.concat(report, "\n"))
H.check(has(report, "ERROR") == nil, "no errors (%s)", has(report, "ERROR") or "none")
H.check(has(report, "WARNING") == nil, "no warnings (%s)", has(report, "WARNING") or "none")
H.check(has(report, "OK Server command: .*rest%-lsp") ~= nil, "it finds the server command")
H.check(has(report, "OK rest%-lsp [%w.]+ in ") ~= nil, "it runs the server's Python and imports rest_lsp")
H.check(has(report, "OK default model: .*%.gguf") ~= nil, "it finds the default model")
H.check(has(report, "OK Index of " .. vim.pesc(root) .. ": %d+ files") ~= nil, "it finds the workspace's saved index")
H.check(has(report, "OK Running: model .* ready") ~= nil, "it reports the running server")

-- A server command that is not there is an error with a way out.
H.lua(child, "require('rest_lsp').config.cmd = { 'rest-lsp-not-installed', '--stdio' }")
local broken = checkhealth()
H.check(has(broken, 'ERROR The server command "rest%-lsp%-not%-installed" is not found') ~= nil,
  "a missing server command is reported as an error")
H.check(has(broken, "pip install") ~= nil, "with advice on installing it")

H.finish(child)
