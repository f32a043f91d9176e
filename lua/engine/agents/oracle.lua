-- engine.agents.oracle: runs the reference solution. The env's solve(ctx)
-- wins; else the task's `solution`: a shell script (string), a list of
-- commands, or a function(ctx). Commands run in the sandbox with the agent's
-- remaining time as their timeout; a non-zero exit is left for the scorer
-- to judge; a command the sandbox could not run at all raises an
-- infra_error (the box is gone: the scorer would only see an empty box).
local M = {}

local Oracle = { name = "oracle" }
Oracle.__index = Oracle

function M.new(config)
  return setmetatable({ config = config or {} }, Oracle)
end

local function run_commands(ctx, cmds)
  for _, cmd in ipairs(cmds) do
    local r, err = ctx.sandbox:exec(cmd, { timeout = ctx.timeouts and ctx.timeouts.agent })
    if not r then error({ kind = "infra_error", message = "oracle: " .. tostring(err) }, 0) end
  end
end

function Oracle:act(ctx)
  if ctx.env and ctx.env.solve then return ctx.env.solve(ctx) end
  local sol = ctx.task.solution
  if type(sol) == "function" then return sol(ctx) end
  if type(sol) == "string" then return run_commands(ctx, { sol }) end
  if type(sol) == "table" then return run_commands(ctx, sol) end
  error({ kind = "agent_error", message = "task " .. tostring(ctx.task.id) .. " has no reference solution" }, 0)
end

return M
