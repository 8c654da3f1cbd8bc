-- The plugin's ghost text (the Neovim 0.11 path) against a scripted in-process server that answers only when
-- the test tells it to: typing while a request is in flight cancels it ($/cancelRequest), and the reply to it,
-- computed for an older version of the buffer, is never shown; the reply to the newest request is.
-- No model is involved: the server's replies are chosen by the test.

local H = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, "S").source:sub(2)), "helpers.lua"))

local root = H.workspace({ ["a.py"] = "value = " })
-- no filetype of ours: the plugin starts no real server; the scripted one below is attached by hand
local child = H.spawn({ filetypes = { "no-such-filetype" }, ghost = "plugin" }, root)
H.lua(child, "vim.cmd.edit(...)", root .. "/a.py")

local started = H.lua(child, [[
  -- The scripted server: records requests and cancels, answers initialize and shutdown, nothing else by itself.
  _G.server = { requests = {}, cancels = {} }
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
      notify = function(method, params)
        if method == "$/cancelRequest" then
          table.insert(_G.server.cancels, params.id)
        end
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
  -- every ghost the plugin ever draws, so that a reply shown and then replaced is still seen
  _G.drawn = {}
  local ns = require("rest_lsp.ghost").namespace
  local set_extmark = vim.api.nvim_buf_set_extmark
  vim.api.nvim_buf_set_extmark = function(buf, mark_ns, row, col, o)
    if mark_ns == ns then
      table.insert(_G.drawn, o.virt_text[1][1])
    end
    return set_extmark(buf, mark_ns, row, col, o)
  end
  return vim.lsp.start({
    name = "rest_lsp",
    cmd = scripted,
    root_dir = vim.fn.getcwd(),
    on_attach = function(_, buf)
      require("rest_lsp.ghost").attach(buf, { debounce_ms = 10, accept_key = false, client_name = "rest_lsp" })
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
must("the reply recorder installed", function()
  return H.lua(child, H.RECORDER)
end)

local function inline_requests()
  return H.lua(child, [[
    local ids = {}
    for _, r in ipairs(_G.server.requests) do
      if r.method == "textDocument/inlineCompletion" then
        ids[#ids + 1] = r.id
      end
    end
    return ids
  ]])
end

local function reply(id, text)
  H.lua(child, [[
    local id, text = ...
    for _, r in ipairs(_G.server.requests) do
      if r.id == id then
        r.reply({ items = { { insertText = text } } })
        return
      end
    end
    error("no request " .. id)
  ]], id, text)
end

H.type(child, "A")
must("insert mode", function()
  return H.lua(child, "return vim.api.nvim_get_mode().mode") == "i"
end)

-- 1. Typing sends a request; typing again while it is in flight cancels it and sends a new one.
H.type(child, "x")
local first = must("a request after the first key", function()
  local ids = inline_requests()
  return #ids == 1 and ids[1] or nil
end)
H.type(child, "y")
local second = must("a request after the second key", function()
  local ids = inline_requests()
  return #ids == 2 and ids[2] or nil
end)
local cancels = H.lua(child, "return _G.server.cancels")
H.check(vim.deep_equal(cancels, { first }), "the request in flight was cancelled: %s", vim.inspect(cancels))

-- 2. The reply to the older request (the buffer was "value = x") comes first anyway, then the newer one.
reply(first, "STALE")
reply(second, "FRESH")
must("both replies reached the plugin", function()
  return H.lua(child, "return #_G.replies") == 2
end)
local ghost = must("the newest reply shown", function()
  return H.ghost(child)
end)
H.check(ghost.text == "FRESH" and ghost.count == 1, "the ghost is the newest reply only: %s", vim.inspect(ghost))
local drawn = H.lua(child, "return _G.drawn")
H.check(vim.deep_equal(drawn, { "FRESH" }), "the reply for the older buffer was never drawn: %s", vim.inspect(drawn))

H.finish(child)
