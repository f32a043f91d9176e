-- The root module: tasks, sleep and clocks from the C core.
local core = require "engine.core"

local M = {}
for k, v in pairs(core) do M[k] = v end

-- Raises unless err is the cancellation error; lets cleanup code re-raise it.
function M.check_cancel(err)
  if core.is_cancel(err) then error(err, 0) end
end

return M
