-- Tells the server where the cursor rests (the `restLsp/cursor` notification), so that it prefills the prompt
-- there before a request comes: a file just opened, a jump or a click has no edit to tell it. Debounced, and
-- only for a place other than the last one sent to that client.

local api = vim.api
local buffer = require("rest_lsp.buffer")

local M = {}

M.NOTIFICATION = "restLsp/cursor"
-- Keys held down or a scroll move the cursor many times a second: only where it rests is worth warming.
M.debounce_ms = 150

---@class rest_lsp.CursorState
---@field timer uv.uv_timer_t
---@field client_name string
---@field last? string the client id and position last sent

---@type table<integer, rest_lsp.CursorState>
local states = {}

local function send(buf)
  local s = states[buf]
  if not s or not api.nvim_buf_is_valid(buf) or api.nvim_get_current_buf() ~= buf then
    return
  end
  if vim.fn.mode():find("^[vVsS\22\19]") then
    return -- a selection, not a cursor
  end
  local client = vim.lsp.get_clients({ bufnr = buf, name = s.client_name })[1]
  if not client then
    return
  end
  -- the character in the client's encoding (UTF-16 unless the server chose otherwise), like every LSP position
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  local key = ("%d:%d:%d"):format(client.id, params.position.line, params.position.character)
  if key == s.last then
    return
  end
  s.last = key
  client:notify(M.NOTIFICATION, params)
end

--- Sends the cursor of `buf` once it has rested M.debounce_ms.
function M.schedule(buf)
  local s = states[buf]
  if not s then
    return
  end
  s.timer:stop()
  s.timer:start(M.debounce_ms, 0, vim.schedule_wrap(function()
    send(buf)
  end))
end

--- Starts telling the `client_name` client where the cursor of `buf` rests, beginning with where it is now.
function M.attach(buf, client_name)
  if states[buf] then
    return
  end
  states[buf] = { timer = vim.uv.new_timer(), client_name = client_name }
  local group = api.nvim_create_augroup("rest_lsp.cursor." .. buf, { clear = true })
  api.nvim_create_autocmd({ "CursorMoved", "CursorMovedI", "BufEnter" }, {
    group = group,
    buffer = buf,
    callback = function()
      M.schedule(buf)
    end,
  })
  buffer.on_leave(buf, group, client_name, function()
    M.detach(buf)
  end)
  M.schedule(buf)
end

function M.detach(buf)
  local s = states[buf]
  if not s then
    return
  end
  s.timer:stop()
  s.timer:close()
  pcall(api.nvim_del_augroup_by_name, "rest_lsp.cursor." .. buf)
  states[buf] = nil
end

return M
