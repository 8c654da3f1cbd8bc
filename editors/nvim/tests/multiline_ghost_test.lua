-- A suggestion of several lines (the server's maxLines above 1, at a line start or after a block opener) shows
-- every line: the first after the cursor, each other one as a virtual line below, in order; accepting it inserts
-- all of them. A scripted in-process server answers, so the lines are known (no model is involved).

local H = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, "S").source:sub(2)), "helpers.lua"))

local root = H.workspace({ ["a.py"] = "def total(values):" })
local child = H.spawn({ filetypes = { "no-such-filetype" }, ghost = "plugin" }, root)
H.lua(child, "vim.cmd.edit(...)", root .. "/a.py")

local started = H.lua(child, [[
  _G.server = { requests = {} }
  local function scripted(dispatchers)
    local next_id, closing = 0, false
    return {
      request = function(method, params, callback, notify_reply_callback)
        next_id = next_id + 1
        local id = next_id
        local function reply(result)
          vim.schedule(function()
            callback(nil, result)
            if notify_reply_callback then
              notify_reply_callback(id)
            end
          end)
        end
        if method == "initialize" then
          reply({ capabilities = { inlineCompletionProvider = true,
            textDocumentSync = { openClose = true, change = 1 } } })
        elseif method == "shutdown" then
          reply(vim.NIL)
        else
          table.insert(_G.server.requests, { id = id, method = method, params = params, reply = reply })
        end
        return true, id
      end,
      notify = function()
        return true
      end,
      is_closing = function()
        return closing
      end,
      terminate = function()
        closing = true
      end,
    }
  end
  return vim.lsp.start({
    name = "rest_lsp",
    cmd = scripted,
    root_dir = vim.fn.getcwd(),
    on_attach = function(_, buf)
      require("rest_lsp.ghost").attach(buf, { debounce_ms = 10, accept_key = "<Tab>", client_name = "rest_lsp" })
    end,
  }, { bufnr = 0 })
]])
if not started then
  H.abort(child, "the scripted server started")
end

local function must(what, fn)
  return H.must(child, 30000, what, fn)
end

must("the scripted client initialized", function()
  return H.lua(child, [[
    local c = vim.lsp.get_clients({ name = "rest_lsp" })[1]
    return c ~= nil and c.initialized and vim.lsp.buf_is_attached(0, c.id)
  ]])
end)

-- the cursor at the end of "def total(values):", then a new line: the body's first line starts here
H.type(child, "A")
must("insert mode", function()
  return H.lua(child, "return vim.api.nvim_get_mode().mode") == "i"
end)
H.type(child, "<CR>")
local request = must("an inline completion request at the body's start", function()
  local id = H.lua(child, [[
    for i = #_G.server.requests, 1, -1 do
      local r = _G.server.requests[i]
      if r.method == "textDocument/inlineCompletion" and r.params.position.line == 1 then return r.id end
    end
    return vim.NIL
  ]])
  return id ~= vim.NIL and id or nil
end)
local cursor = H.lua(child, "return vim.api.nvim_win_get_cursor(0)")

local LINES = { "result = 0", "    for v in values:", "        result += v", "    return result" }
H.lua(child, [[
  local id, text = ...
  for _, r in ipairs(_G.server.requests) do
    if r.id == id then
      r.reply({ items = { { insertText = text } } })
      return
    end
  end
  error("no request " .. id)
]], request, table.concat(LINES, "\n"))

local ghost = must("the suggestion shown", function()
  return H.ghost(child)
end)
H.check(ghost.text == table.concat(LINES, "\n"),
  "every line of the suggestion is shown, in order: %s", vim.inspect(ghost.text))
H.check(ghost.row == cursor[1] - 1, "the first line is drawn at the cursor's row: %s", vim.inspect(ghost))

-- accepting it inserts every line at the cursor
H.type(child, "<Tab>")
local buffer = must("the suggestion inserted", function()
  local lines = H.lua(child, "return vim.api.nvim_buf_get_lines(0, 0, -1, false)")
  return #lines >= 5 and lines or nil
end)
local want = { "def total(values):" }
local indent = buffer[2]:match("^(%s*)") -- the editor's own indentation of the new line
want[2] = indent .. LINES[1]
for i = 2, #LINES do
  want[#want + 1] = LINES[i]
end
H.check(vim.deep_equal(buffer, want), "the buffer holds every line: %s", vim.inspect(buffer))

H.finish(child)
