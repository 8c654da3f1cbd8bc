-- The plugin's own logic, without a server: the server command, setup() checks, the stats text, the
-- commands it defines.

local H = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, "S").source:sub(2)), "helpers.lua"))
vim.opt.runtimepath:prepend(H.plugin_dir)
vim.cmd("runtime plugin/rest_lsp.lua")
local rest = require("rest_lsp")

H.check(vim.deep_equal(rest.server_cmd({}), { "rest-lsp", "--stdio" }), "the default server command")
H.check(vim.deep_equal(rest.server_cmd({ python = "/venv/bin/python" }),
  { "/venv/bin/python", "-m", "rest_lsp.cli", "--stdio" }), "a Python interpreter runs the module")
H.check(vim.deep_equal(rest.server_cmd({ cmd = { "x", "--tcp", "h:1" }, python = "p" }), { "x", "--tcp", "h:1" }),
  "an explicit cmd wins")

local ok, err = pcall(rest.setup, { ghost = "fancy" })
H.check(not ok and tostring(err):find('ghost: expected "auto", "builtin" or "plugin", got fancy', 1, true) ~= nil,
  "a bad `ghost` value is one clear error: %s", tostring(err))
ok, err = pcall(rest.setup, { debounce_ms = "soon" })
H.check(not ok and tostring(err):find("debounce_ms: expected number, got string", 1, true) ~= nil,
  "a bad `debounce_ms` is one clear error: %s", tostring(err))

rest.setup({ filetypes = { "python" }, cmd = { "rest-lsp-not-installed" } })
H.check(vim.deep_equal(rest.config.filetypes, { "python" }), "a filetype list replaces the default list")
H.check(rest.config.accept_key == "<Tab>" and rest.config.ghost == "auto", "unset options keep their defaults")
H.check(vim.fn.exists(":RestLspStats") == 2, ":RestLspStats exists")

-- A missing server is reported once and starts nothing.
local notes = {}
vim.notify_once = function(msg, level)
  notes[#notes + 1] = { msg, level }
end
vim.cmd("enew")
vim.bo.filetype = "python"
H.check(#vim.lsp.get_clients({ _uninitialized = true }) == 0, "no client starts when the server is missing")
H.check(#notes == 1 and notes[1][1]:find('"rest-lsp-not-installed" is not executable', 1, true) ~= nil
  and notes[1][2] == vim.log.levels.ERROR, "the user is told why: %s", notes[1] and notes[1][1])

local lines = rest.format_stats({
  zeta = 1, documents = 12, tokens = 3400, mean_tokens_per_step = 2.3456, last_latency_ms = vim.NIL,
  model = "m.gguf", ready = true,
})
H.check(vim.deep_equal(lines, {
  "model: m.gguf", "ready: true", "documents: 12", "tokens: 3400", "mean tokens per step: 2.35",
  "last latency ms: -", "zeta: 1",
}), "stats are printed known fields first, then the rest: %s", vim.inspect(lines))
H.check(rest.format_stats("x")[1]:find("not a stats object", 1, true) ~= nil, "a non-object answer is reported")

local said
rest.stats(function(e)
  said = e
end)
H.check(said and said:find("not running", 1, true) ~= nil, "stats without a server say so: %s", said)

H.finish()
