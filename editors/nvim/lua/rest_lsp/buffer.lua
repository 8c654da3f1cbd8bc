-- What the per-buffer parts of the plugin (ghost text, cursor hints) share.

local api = vim.api

local M = {}

--- Calls `detach()` when `buf` is wiped out or the `client_name` client detaches from it (another client
--- detaching leaves it alone); the autocmd joins `group`.
function M.on_leave(buf, group, client_name, detach)
  api.nvim_create_autocmd({ "BufWipeout", "LspDetach" }, {
    group = group,
    buffer = buf,
    callback = function(ev)
      if ev.event == "LspDetach" then
        local client = vim.lsp.get_client_by_id(ev.data.client_id)
        if not client or client.name ~= client_name then
          return
        end
      end
      detach()
    end,
  })
end

return M
