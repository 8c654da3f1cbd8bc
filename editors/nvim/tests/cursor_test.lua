-- Where the cursor rests goes to the real server as restLsp/cursor: once it has rested (not at each move on the
-- way), never twice for the same place, with the character in the position encoding; and the server prepares the suggestion
-- there before anything is asked (its stats count a guess).

local H = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, "S").source:sub(2)), "helpers.lua"))

local MAIN = [[
label = "😀x"


def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
]]

local root = H.workspace({ ["main.py"] = MAIN })
local child = H.spawn({ cmd = H.server_cmd, filetypes = { "python" }, settings = { index_workspace = false } }, root)
H.lua(child, "vim.cmd.edit(...)", root .. "/main.py")
local ready, info = H.wait_ready(child)
if not ready then
  H.abort(child, "server ready: %s", info)
end

-- Installed in the child: records the rest-lsp client's cursor notifications (and still sends them).
H.lua(child, [[
  local client = vim.lsp.get_clients({ name = "rest_lsp" })[1]
  _G.cursors = {}
  local notify = client.notify
  client.notify = function(self, method, params)
    if method == "restLsp/cursor" then
      table.insert(_G.cursors, { uri = params.textDocument.uri, line = params.position.line,
        character = params.position.character })
    end
    return notify(self, method, params)
  end
]])

local function cursors()
  return H.lua(child, "return _G.cursors")
end

local function stats()
  return H.lua(child, [[
    local c = vim.lsp.get_clients({ name = "rest_lsp" })[1]
    local r = c:request_sync("workspace/executeCommand", { command = "rest-lsp.stats", arguments = {} }, 5000, 0)
    return r and r.result or vim.NIL
  ]])
end

local guessed = stats().guessed
-- a jump to the end of the file, then down and back up the first lines on the way to the body of perimeter()
H.type(child, "Ggg")
H.type(child, "jjjjjjj")
local sent = H.must(child, 5000, "a cursor notification", function()
  local c = cursors()
  return #c > 0 and c
end)
vim.wait(500)
sent = cursors()
H.check(#sent == 1, "one notification for where the cursor rested (%d sent: %s)", #sent, vim.inspect(sent))
H.check(sent[1].line == 7 and sent[1].character == 0, "at line 7, character 0 (%s)", vim.inspect(sent[1]))
H.check(vim.endswith(sent[1].uri, "/main.py"), "for main.py (%s)", sent[1].uri)
H.must(child, 60000, "the server's guess at the cursor", function()
  return stats().guessed > guessed
end)
H.check(true, "the server guessed the suggestion at the cursor before any request")

-- away and back before the debounce ends: the same place, not sent again
H.type(child, "jk")
vim.wait(500)
H.check(#cursors() == 1, "no notification for the place last sent (%d sent)", #cursors())

-- the character counts the units of the position encoding the server chose, as in every request: the emoji is 4
-- UTF-8 bytes, 2 UTF-16 units, 1 UTF-32 unit
H.type(child, "ggfx")
local after_emoji = H.must(child, 5000, "the notification on line 0", function()
  local c = cursors()
  return #c == 2 and c[2]
end)
local encoding = H.lua(child, "return vim.lsp.get_clients({ name = 'rest_lsp' })[1].offset_encoding")
local expected = ({ ["utf-8"] = 13, ["utf-16"] = 11, ["utf-32"] = 10 })[encoding]
H.check(after_emoji.line == 0 and after_emoji.character == expected, "x is at %s character %s (%s)", encoding,
  expected, vim.inspect(after_emoji))

-- insert mode moves count as well
H.type(child, "Go")
local inserted = H.must(child, 5000, "the notification in insert mode", function()
  local c = cursors()
  return #c == 3 and c[3]
end)
H.check(inserted.line == 9 and inserted.character == 0, "at the new line (%s)", vim.inspect(inserted))
H.type(child, "<Esc>")

H.finish(child)
