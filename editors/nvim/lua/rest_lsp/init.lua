-- rest-lsp for Neovim: starts the server for the configured filetypes and shows its inline completions.
--
--   require("rest_lsp").setup({ filetypes = { "python", "lua" }, accept_key = "<Tab>" })
--
-- On Neovim 0.12+ the ghost text is vim.lsp.inline_completion's; on 0.11 it is this plugin's own
-- (rest_lsp.ghost). Where the cursor rests goes to the server too (rest_lsp.cursor), which prepares a suggestion
-- there before it is asked.

local M = {}

local CLIENT_NAME = "rest_lsp"
local STATS_COMMAND = "rest-lsp.stats"

---@class rest_lsp.Config
local defaults = {
  -- The server command; nil means { "rest-lsp", "--stdio" }, or the module under `python` when that is set.
  cmd = nil,
  -- A Python interpreter with rest-lsp installed; the server then runs as `python -m rest_lsp.cli --stdio`.
  python = nil,
  -- Filetypes that get completions; "*" for all of them.
  filetypes = { "python", "lua", "javascript", "typescript", "javascriptreact", "typescriptreact", "go", "rust",
    "c", "cpp", "java", "ruby", "sh", "php", "cs", "kotlin", "swift", "scala", "zig", "haskell", "ocaml",
    "elixir", "sql", "html", "css", "markdown", "yaml", "toml", "json" },
  -- The workspace root is the nearest folder above the file holding one of these (else the current folder).
  root_markers = { ".git", "pyproject.toml", "package.json", "Cargo.toml", "go.mod", ".hg" },
  -- The server's settings (rest_lsp/settings.py), sent as initializationOptions; nil leaves the server's default.
  settings = {
    model = nil, -- Hugging Face id, local folder or .gguf file (default: the bundled SmolLM2-135M)
    device = nil, -- "cpu", "cuda", "cuda:1", "mps"
    dtype = nil, -- "float32" (exact), "float16", "bfloat16", "float16-weights", "q8_0", "gguf"
    max_new_tokens = nil, -- server default 64
    max_lines = nil, -- most lines per suggestion at a line start or block opener; 0 = no limit (server default 1)
    draft_budget = nil, -- draft tokens checked per step; 0 = plain decoding (server default 16)
    debounce_ms = nil, -- the server's own wait before decoding (server default 20)
    ignore = nil, -- extra gitignore patterns the indexer skips
  },
  -- Insert-mode key that accepts the ghost text (false: map it yourself with require("rest_lsp").accept()).
  accept_key = "<Tab>",
  -- How long to wait after the last keystroke before asking (Neovim 0.11 ghost text only).
  debounce_ms = 75,
  -- "auto": vim.lsp.inline_completion where Neovim has it (0.12+), else the plugin's own ghost text.
  -- "builtin" or "plugin" force one of them.
  ghost = "auto",
}

---@type rest_lsp.Config
M.config = vim.deepcopy(defaults)

--- The server command line from the config.
---@param config rest_lsp.Config
---@return string[]
function M.server_cmd(config)
  if config.cmd then
    return config.cmd
  end
  if config.python then
    return { config.python, "-m", "rest_lsp.cli", "--stdio" }
  end
  return { "rest-lsp", "--stdio" }
end

--- The workspace root for `buf`.
function M.root_dir(buf, config)
  config = config or M.config
  local root = vim.fs.root(buf, config.root_markers)
  return vim.fs.normalize(root or vim.uv.cwd())
end

local function use_builtin(config)
  local has = vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil
  if config.ghost == "builtin" then
    return true
  elseif config.ghost == "plugin" then
    return false
  end
  return has
end

local function filetype_enabled(config, ft)
  return config.filetypes == "*" or vim.tbl_contains(config.filetypes, "*") or vim.tbl_contains(config.filetypes, ft)
end

local function check_config(config)
  vim.validate("cmd", config.cmd, "table", true)
  vim.validate("python", config.python, "string", true)
  vim.validate("filetypes", config.filetypes, { "table", "string" })
  vim.validate("root_markers", config.root_markers, "table")
  vim.validate("settings", config.settings, "table")
  vim.validate("accept_key", config.accept_key, { "string", "boolean" })
  vim.validate("debounce_ms", config.debounce_ms, "number")
  vim.validate("ghost", config.ghost, function(v)
    return v == "auto" or v == "builtin" or v == "plugin"
  end, false, '"auto", "builtin" or "plugin"')
end

local function on_attach(client, buf)
  local config = M.config
  require("rest_lsp.cursor").attach(buf, CLIENT_NAME)
  if use_builtin(config) then
    vim.lsp.inline_completion.enable(true, { bufnr = buf })
    if config.accept_key then
      local key = config.accept_key
      vim.keymap.set("i", key, function()
        if not vim.lsp.inline_completion.get() then
          return key
        end
      end, { buffer = buf, expr = true, replace_keycodes = true, desc = "rest-lsp: accept the inline completion" })
    end
  else
    require("rest_lsp.ghost").attach(buf, {
      debounce_ms = config.debounce_ms,
      accept_key = config.accept_key,
      client_name = CLIENT_NAME,
    })
  end
end

--- Starts (or reuses) the server for `buf`. Returns the client id, or nil.
function M.start(buf)
  buf = buf or vim.api.nvim_get_current_buf()
  local config = M.config
  local cmd = M.server_cmd(config)
  if vim.fn.executable(cmd[1]) ~= 1 then
    vim.notify_once(("rest-lsp: the server command %q is not executable; set `cmd` or `python` in "
      .. "require('rest_lsp').setup() (see :checkhealth rest_lsp)."):format(cmd[1]), vim.log.levels.ERROR)
    return nil
  end
  local init_options = {}
  for k, v in pairs(config.settings) do
    init_options[k] = v
  end
  return vim.lsp.start({
    name = CLIENT_NAME,
    cmd = cmd,
    root_dir = M.root_dir(buf, config),
    init_options = init_options,
    on_attach = on_attach,
  }, { bufnr = buf })
end

--- The rest-lsp client of `buf` (or of any buffer), or nil.
function M.client(buf)
  return vim.lsp.get_clients({ bufnr = buf, name = CLIENT_NAME })[1]
    or vim.lsp.get_clients({ name = CLIENT_NAME })[1]
end

--- Accepts the ghost text in `buf`. Returns true when there was one.
function M.accept(buf)
  buf = buf or vim.api.nvim_get_current_buf()
  if use_builtin(M.config) then
    return vim.lsp.inline_completion.get({ bufnr = buf }) == true
  end
  return require("rest_lsp.ghost").accept(buf)
end

--- Asks the server for its stats; calls `callback(err, stats)`.
function M.stats(callback, buf)
  local client = M.client(buf or vim.api.nvim_get_current_buf())
  if not client then
    callback("rest-lsp is not running (open a file of a configured filetype first).", nil)
    return
  end
  client:request("workspace/executeCommand", { command = STATS_COMMAND, arguments = {} }, function(err, result)
    callback(err and (err.message or tostring(err)) or nil, result)
  end)
end

local ORDER = { "model", "ready", "load_error", "fim", "documents", "tokens", "completions_served",
  "completions_decoded", "type_through", "cancelled", "mean_tokens_per_step", "mean_ms_per_token",
  "last_latency_ms" }

--- Stats as "label: value" lines, known fields first in a fixed order, then any others sorted.
function M.format_stats(stats)
  if type(stats) ~= "table" then
    return { "rest-lsp answered something that is not a stats object: " .. vim.inspect(stats) }
  end
  local lines, seen = {}, {}
  local function add(key)
    local v = stats[key]
    if v == nil or v == vim.NIL then
      v = "-"
    elseif type(v) == "number" and math.floor(v) ~= v then
      v = ("%.2f"):format(v)
    elseif type(v) ~= "string" then
      v = vim.inspect(v)
    end
    lines[#lines + 1] = ("%s: %s"):format(key:gsub("_", " "), v)
    seen[key] = true
  end
  for _, key in ipairs(ORDER) do
    if stats[key] ~= nil then
      add(key)
    end
  end
  local rest = vim.tbl_filter(function(k)
    return not seen[k]
  end, vim.tbl_keys(stats))
  table.sort(rest)
  for _, key in ipairs(rest) do
    add(key)
  end
  return lines
end

--- :RestLspStats
function M.print_stats()
  M.stats(function(err, stats)
    if err then
      vim.notify("rest-lsp stats: " .. err, vim.log.levels.ERROR)
      return
    end
    vim.api.nvim_echo({ { table.concat(M.format_stats(stats), "\n") } }, true, {})
  end)
end

---@param opts? rest_lsp.Config
function M.setup(opts)
  local config = vim.tbl_deep_extend("force", vim.deepcopy(defaults), opts or {})
  if opts and opts.filetypes then
    config.filetypes = opts.filetypes -- a list replaces the default list, it is not merged into it
  end
  if opts and opts.root_markers then
    config.root_markers = opts.root_markers
  end
  check_config(config)
  M.config = config

  vim.api.nvim_set_hl(0, "RestLspGhost", { link = "Comment", default = true })
  local group = vim.api.nvim_create_augroup("rest_lsp", { clear = true })
  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    callback = function(ev)
      if vim.bo[ev.buf].buftype == "" and filetype_enabled(M.config, ev.match) then
        M.start(ev.buf)
      end
    end,
  })
  -- Buffers already open when setup() runs.
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(buf) and vim.bo[buf].buftype == "" and vim.bo[buf].filetype ~= ""
      and filetype_enabled(config, vim.bo[buf].filetype) then
      M.start(buf)
    end
  end
end

M.CLIENT_NAME = CLIENT_NAME
return M
