-- Inline completion as ghost text, for Neovim versions without vim.lsp.inline_completion (0.11).
--
-- In insert mode, after `debounce_ms` without typing, the buffer's rest-lsp client is asked for
-- `textDocument/inlineCompletion`; the first item is drawn after the cursor with an extmark (the first
-- line inline, the others as virtual lines). The accept key inserts it and sends the item's command to the
-- server; typing, moving the cursor, leaving insert mode or the buffer dismisses it. A reply that arrives
-- after the text or the cursor changed is dropped, and a new request cancels the one in flight.

local M = {}

local api = vim.api
local buffer = require("rest_lsp.buffer")
local ns = api.nvim_create_namespace("rest_lsp.ghost")

---@class rest_lsp.Ghost
---@field row integer 0-based row of the cursor it was computed for
---@field col integer 0-based byte column of the cursor
---@field tick integer changedtick it was computed for
---@field text string what is shown (and inserted at the cursor on accept)
---@field replace {[1]: integer, [2]: integer, [3]: integer, [4]: integer} range the item replaces (0-based, bytes)
---@field insert string the item's whole insert text (for the replace range)
---@field command? table the item's lsp.Command
---@field client_id integer
---@field extmark integer

---@class rest_lsp.BufState
---@field timer? uv.uv_timer_t
---@field request? {client_id: integer, id: integer}
---@field seq integer
---@field ghost? rest_lsp.Ghost

---@type table<integer, rest_lsp.BufState>
local states = {}

---@type {debounce_ms: integer, client_name: string, on_accept?: fun(buf: integer, ghost: rest_lsp.Ghost)}
local opts = { debounce_ms = 75, client_name = "rest_lsp" }

local function state(buf)
  local s = states[buf]
  if not s then
    s = { seq = 0 }
    states[buf] = s
  end
  return s
end

local function client_for(buf)
  return vim.lsp.get_clients({ bufnr = buf, name = opts.client_name })[1]
end

local function cursor(buf)
  local win = vim.fn.bufwinid(buf)
  if win == -1 then
    return nil
  end
  local pos = api.nvim_win_get_cursor(win)
  return pos[1] - 1, pos[2]
end

local function cancel_request(s)
  if s.request then
    local client = vim.lsp.get_client_by_id(s.request.client_id)
    if client then
      client:cancel_request(s.request.id)
    end
    s.request = nil
  end
end

--- Removes the ghost text (if any) and cancels pending work for `buf`.
function M.dismiss(buf)
  local s = states[buf]
  if not s then
    return
  end
  s.seq = s.seq + 1 -- replies to earlier requests are now stale
  if s.timer then
    s.timer:stop()
  end
  cancel_request(s)
  if s.ghost then
    pcall(api.nvim_buf_del_extmark, buf, ns, s.ghost.extmark)
    s.ghost = nil
  end
end

--- The ghost text shown in `buf`, or nil.
---@return rest_lsp.Ghost?
function M.current(buf)
  local s = states[buf]
  return s and s.ghost
end

-- LSP position -> 0-based byte column, in the client's offset encoding.
local function byte_col(buf, position, encoding)
  local line = api.nvim_buf_get_lines(buf, position.line, position.line + 1, false)[1] or ""
  return vim.str_byteindex(line, encoding, position.character, false)
end

local function draw(buf, row, col, text)
  local lines = vim.split(text, "\n", { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], "RestLspGhost" } }
  end
  return api.nvim_buf_set_extmark(buf, ns, row, col, {
    virt_text = { { lines[1], "RestLspGhost" } },
    virt_text_pos = "inline",
    virt_lines = #virt_lines > 0 and virt_lines or nil,
  })
end

--- Turns the first usable item of a reply into a ghost for the cursor at (row, col); nil if none fits.
local function ghost_from(buf, client, result, row, col)
  local items = result and (result.items or result) or {}
  for _, item in ipairs(items) do
    local insert = item.insertText
    if type(insert) == "table" then
      insert = insert.value -- a snippet: shown and inserted as its text
    end
    if type(insert) == "string" and insert ~= "" then
      local replace = { row, col, row, col }
      if item.range then
        replace = {
          item.range.start.line,
          byte_col(buf, item.range.start, client.offset_encoding),
          item.range["end"].line,
          byte_col(buf, item.range["end"], client.offset_encoding),
        }
      end
      -- What the user typed between the range's start and the cursor must begin the insert text; the rest
      -- of it is what is shown.
      if replace[1] == row and replace[2] <= col then
        local typed = api.nvim_buf_get_text(buf, row, replace[2], row, col, {})[1]
        if insert:sub(1, #typed) == typed and #insert > #typed then
          return { text = insert:sub(#typed + 1), insert = insert, replace = replace, command = item.command }
        end
      end
    end
  end
  return nil
end

local function request(buf)
  local s = state(buf)
  if api.nvim_get_current_buf() ~= buf or not vim.startswith(api.nvim_get_mode().mode, "i") then
    return
  end
  local client = client_for(buf)
  if not client or not client.initialized then
    return
  end
  local row, col = cursor(buf)
  if not row then
    return
  end
  cancel_request(s)
  s.seq = s.seq + 1
  local seq, tick = s.seq, api.nvim_buf_get_changedtick(buf)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = 2 } -- Automatic
  local ok, id = client:request("textDocument/inlineCompletion", params, function(err, result)
    if s.request and s.request.id == id then
      s.request = nil
    end
    if err or seq ~= s.seq or not api.nvim_buf_is_valid(buf) then
      return
    end
    -- Dropped if anything moved while the server worked.
    local now_row, now_col = cursor(buf)
    if api.nvim_buf_get_changedtick(buf) ~= tick or now_row ~= row or now_col ~= col
      or not vim.startswith(api.nvim_get_mode().mode, "i") then
      return
    end
    local ghost = ghost_from(buf, client, result, row, col)
    if not ghost then
      return
    end
    ghost.row, ghost.col, ghost.tick, ghost.client_id = row, col, tick, client.id
    ghost.extmark = draw(buf, row, col, ghost.text)
    s.ghost = ghost
  end, buf)
  if ok then
    s.request = { client_id = client.id, id = id }
  end
end

--- Asks for a completion after the debounce (restarts the wait if one is pending).
function M.schedule(buf)
  M.dismiss(buf)
  local s = state(buf)
  s.timer = s.timer or vim.uv.new_timer()
  s.timer:start(opts.debounce_ms, 0, vim.schedule_wrap(function()
    if api.nvim_buf_is_valid(buf) then
      request(buf)
    end
  end))
end

--- Inserts the ghost text and sends its command to the server. Returns false when nothing is shown.
function M.accept(buf)
  local s = states[buf]
  local ghost = s and s.ghost
  if not ghost then
    return false
  end
  local row, col = cursor(buf)
  if row ~= ghost.row or col ~= ghost.col or api.nvim_buf_get_changedtick(buf) ~= ghost.tick then
    M.dismiss(buf)
    return false
  end
  M.dismiss(buf)
  local r = ghost.replace
  local lines = vim.split(ghost.insert, "\n", { plain = true })
  api.nvim_buf_set_text(buf, r[1], r[2], r[3], r[4], lines)
  local end_row = r[1] + #lines - 1
  local end_col = (#lines == 1 and r[2] or 0) + #lines[#lines]
  api.nvim_win_set_cursor(vim.fn.bufwinid(buf), { end_row + 1, end_col })
  local client = vim.lsp.get_client_by_id(ghost.client_id)
  if client and ghost.command then
    -- Sent as a request (not client:exec_cmd) so that it reaches the server even if it did not list the
    -- command in executeCommandProvider.
    client:request("workspace/executeCommand", {
      command = ghost.command.command,
      arguments = ghost.command.arguments,
    }, function() end, buf)
  end
  if opts.on_accept then
    opts.on_accept(buf, ghost)
  end
  return true
end

--- Turns ghost text on for `buf`: requests while typing in insert mode, the accept key, dismissal.
---@param o {debounce_ms: integer, accept_key: string|false, client_name: string, on_accept?: function}
function M.attach(buf, o)
  opts.debounce_ms = o.debounce_ms
  opts.client_name = o.client_name
  opts.on_accept = o.on_accept
  if state(buf).attached then
    return
  end
  state(buf).attached = true
  local group = api.nvim_create_augroup("rest_lsp.ghost." .. buf, { clear = true })
  api.nvim_create_autocmd({ "TextChangedI", "TextChangedP" }, {
    group = group,
    buffer = buf,
    callback = function()
      M.schedule(buf)
    end,
  })
  api.nvim_create_autocmd("CursorMovedI", {
    group = group,
    buffer = buf,
    callback = function()
      local g = M.current(buf)
      if g then
        local row, col = cursor(buf)
        if row ~= g.row or col ~= g.col then
          M.dismiss(buf)
        end
      end
    end,
  })
  api.nvim_create_autocmd({ "InsertLeave", "BufLeave" }, {
    group = group,
    buffer = buf,
    callback = function()
      M.dismiss(buf)
    end,
  })
  buffer.on_leave(buf, group, opts.client_name, function()
    M.detach(buf)
  end)
  if o.accept_key then
    local key = o.accept_key
    vim.keymap.set("i", key, function()
      if M.current(buf) then
        -- Buffer text cannot change inside an <expr> mapping: insert right after it.
        vim.schedule(function()
          M.accept(buf)
        end)
        return ""
      end
      return key
    end, { buffer = buf, expr = true, replace_keycodes = true, desc = "rest-lsp: accept the ghost text" })
  end
  state(buf).accept_key = o.accept_key
end

--- Turns ghost text off for `buf`.
function M.detach(buf)
  local s = states[buf]
  if not s then
    return
  end
  M.dismiss(buf)
  if s.timer then
    s.timer:close()
  end
  pcall(api.nvim_del_augroup_by_name, "rest_lsp.ghost." .. buf)
  if s.accept_key and api.nvim_buf_is_valid(buf) then
    pcall(vim.keymap.del, "i", s.accept_key, { buffer = buf })
  end
  states[buf] = nil
end

M.namespace = ns
return M
