-- Commands exist as soon as the plugin is on the runtimepath; the server starts only after setup().
if vim.g.loaded_rest_lsp then
  return
end
vim.g.loaded_rest_lsp = true

vim.api.nvim_create_user_command("RestLspStats", function()
  require("rest_lsp").print_stats()
end, { desc = "rest-lsp: print the server's stats" })
