-- Ghost text on Neovim 0.11 against the real server: typing shows the server's completion, moving the cursor
-- and <Esc> dismiss it, the accept key inserts it and the server receives rest-lsp.accept, :RestLspStats
-- prints the stats. The model's words are never assumed: every check compares with what the server answered.

local H = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, "S").source:sub(2)), "helpers.lua"))

local LIB = [[
def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def factorial(n):
    """Return n factorial."""
    if n < 2:
        return 1
    return n * factorial(n - 1)
]]

local MAIN = [[
from lib import factorial, fibonacci


def print_table(limit):
    for i in range(limit):
        print(i, fibonacci(i), factorial(i))


def sum_of_squares(values):
    total = 0
    for value in values:
        total = total + value]]

-- Waits for what the screen must show: generous (a loaded CI machine), and a timeout is a failure.
local WAIT_MS = 20000

local root = H.workspace({ ["lib.py"] = LIB, ["main.py"] = MAIN })
local child = H.spawn({
  cmd = H.server_cmd,
  filetypes = { "python" },
  ghost = "plugin", -- this test is about the plugin's own ghost text (the 0.11 path)
  debounce_ms = 30,
  settings = { max_new_tokens = 24, cache_dir = vim.fn.tempname() }, -- the index stays out of the workspace
}, root)

H.lua(child, "vim.cmd.edit(...)", root .. "/main.py")
local ready, info = H.wait_ready(child)
if not ready then
  H.abort(child, "server ready: %s", info)
end
H.log("server ready: model %s", tostring(info.model))

local function line_text()
  return H.lua(child, "return vim.api.nvim_get_current_line()")
end

local function mode()
  return H.lua(child, "return vim.api.nvim_get_mode().mode")
end

local function reply_count()
  return H.lua(child, "return #_G.replies")
end

--- The text of the first item of a reply (minus what was typed since the range's start), or nil.
local function reply_text(reply)
  local result = reply.result
  if result == nil or result == vim.NIL then
    return nil
  end
  local item = (result.items or result)[1]
  if not item then
    return nil
  end
  local text = type(item.insertText) == "table" and item.insertText.value or item.insertText
  if item.range then
    local typed = reply.position.character - item.range.start.character
    text = text:sub(typed + 1)
  end
  return text ~= "" and text or nil
end

--- Types `keys` one by one until a reply with an item arrives for the buffer as it is; returns the reply's
--- text and the ghost the child shows, or nil when no key gave a completion.
local function type_until_completion(keys)
  for _, key in ipairs(keys) do
    local before = reply_count()
    H.type(child, key)
    local reply = H.wait(60000, function()
      local r = H.lua(child, [[
        local r = _G.replies[#_G.replies]
        if #_G.replies > ... and r.tick == vim.api.nvim_buf_get_changedtick(0) then return r end
        return vim.NIL
      ]], before)
      return r ~= vim.NIL and r or nil
    end)
    if reply then
      local text = reply_text(reply)
      if text then
        local ghost = H.wait(WAIT_MS, function()
          return H.ghost(child)
        end)
        return text, ghost
      end
      H.log("note: the server had no completion after %q; typing on", key)
      -- an empty answer must show nothing
      H.check(H.ghost(child) == nil, "an empty reply shows no ghost text")
    end
  end
  return nil
end

local function insert_mode()
  H.must(child, WAIT_MS, "insert mode", function()
    return mode() == "i"
  end)
end

-- 1. Typing in insert mode shows the server's completion as ghost text.
H.type(child, "GA")
insert_mode()
local text, ghost = type_until_completion({ "<CR>", "r", "e", "t", "u", "r", "n", " " })
if not text then
  H.abort(child, "the server gave a completion while typing")
end
H.check(ghost ~= nil, "ghost text is shown after the server answered")
H.check(ghost and ghost.text == text, "the ghost text is the server's completion: %s", vim.inspect(text))
local cur = H.lua(child, "local c = vim.api.nvim_win_get_cursor(0); return { c[1] - 1, c[2] }")
H.check(ghost and ghost.row == cur[1] and ghost.col == cur[2], "it is drawn at the cursor")
H.check(ghost and ghost.count == 1, "one ghost at a time")

-- 2. Moving the cursor dismisses it.
H.type(child, "<Left>")
H.check(H.wait(WAIT_MS, function()
  return H.ghost(child) == nil
end), "moving the cursor dismisses the ghost text")
H.type(child, "<End>")

-- 3. <Esc> dismisses it too. The cursor is back where the first completion was shown: typing its first
-- characters gets the rest of it from the server (type-through), so a second completion always comes.
local first_line = vim.split(text, "\n", { plain = true })[1]
local keys = {}
for i = 1, math.min(3, #first_line) do
  local c = first_line:sub(i, i)
  keys[#keys + 1] = c == "<" and "<lt>" or c
end
local first_text = text
text, ghost = type_until_completion(keys)
if not text then
  H.abort(child, "a second completion while typing the start of the first one (%s)", vim.inspect(first_text))
end
H.check(ghost and ghost.text == text, "after typing again the ghost is the new completion")
H.type(child, "<Esc>")
H.check(H.wait(WAIT_MS, function()
  return mode() == "n" and H.ghost(child) == nil
end), "<Esc> leaves insert mode and dismisses the ghost text")

-- 4. The accept key inserts the completion and the server receives rest-lsp.accept.
H.type(child, "o")
insert_mode()
text, ghost = type_until_completion({ "r", "e", "s", "u", "l", "t", " ", "=", " " })
if not text then
  H.abort(child, "the server gave a completion to accept")
end
local before_line = line_text()
local before_lines = H.lua(child, "return vim.api.nvim_buf_line_count(0)")
local row = H.lua(child, "return vim.api.nvim_win_get_cursor(0)[1]")
local commands_before = H.lua(child, "return #_G.commands")
H.type(child, "<Tab>")
-- The first command sent after the key, once the server has answered it.
local accepted = H.wait(WAIT_MS, function()
  local c = H.lua(child, "local c = _G.commands[... + 1]; return (c and c.answered) and c or vim.NIL", commands_before)
  return c ~= vim.NIL and c or nil
end)
local lines = vim.split(text, "\n", { plain = true })
local got = H.lua(child, "return vim.api.nvim_buf_get_lines(0, ..., ... + select(2, ...), false)", row - 1, #lines)
local want = vim.deepcopy(lines)
want[1] = before_line .. want[1]
H.check(vim.deep_equal(got, want), "the accept key inserted the completion: %s", vim.inspect(got))
H.check(H.lua(child, "return vim.api.nvim_buf_line_count(0)") == before_lines + #lines - 1,
  "and nothing else (line count)")
local cursor = H.lua(child, "return vim.api.nvim_win_get_cursor(0)")
H.check(cursor[1] == row + #lines - 1 and cursor[2] == #got[#got], "the cursor ends after the inserted text")
H.check(accepted and accepted.command == "rest-lsp.accept", "the item's command was sent: %s",
  accepted and accepted.command)
H.check(accepted and type(accepted.arguments) == "table" and accepted.arguments[1].text == text,
  "with the accepted text as its argument")
H.check(accepted and accepted.result == true, "the server took the acceptance (answered %s)",
  accepted and vim.inspect(accepted.result))

-- 5. The accept key with no ghost text is an ordinary key.
H.lua(child, "require('rest_lsp.ghost').dismiss(0)")
H.type(child, "<End>")
local plain = H.must(child, WAIT_MS, "the cursor at the end of the line", function()
  local l = line_text()
  return H.lua(child, "return vim.fn.col('.') - 1") == #l and l or nil
end)
H.type(child, "<Tab>")
H.check(H.wait(WAIT_MS, function()
  local l = line_text()
  return plain and #l > #plain and l:sub(1, #plain) == plain and l:sub(#plain + 1):match("^%s+$")
end), "the accept key types itself (white space) when nothing is shown")
H.type(child, "<Esc>")

-- 6. :RestLspStats prints the server's stats.
-- no "-- More --" pager: the stats may outgrow the child's 24 screen lines, and the pager would hold the child
H.lua(child, "vim.o.more = false; vim.cmd('messages clear'); vim.cmd('RestLspStats')")
local messages = H.wait(WAIT_MS, function()
  local out = H.lua(child, "return vim.api.nvim_exec2('messages', { output = true }).output")
  return out:find("completions served", 1, true) and out or nil
end)
H.check(messages ~= nil, ":RestLspStats prints the stats")
H.log("---- :RestLspStats\n%s\n----", messages and vim.trim(messages) or "")
local served = messages and tonumber(messages:match("completions served: (%d+)"))
H.check(served and served >= 2, "the stats count the completions served (%s)", tostring(served))

H.finish(child)
