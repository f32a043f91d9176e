-- The root module: tasks, sleep and clocks from the C core.
local core = require "engine.core"

local M = {}
for k, v in pairs(core) do M[k] = v end

return M
