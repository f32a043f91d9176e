-- engine.agents.script: a Lua agent from a file (--agent script:FILE.lua).
-- The file returns either a function(ctx), or a table with act(self, ctx)
-- (and optionally new(config) -> agent). It is loaded once per run.
local M = {}

-- script.new(path, config) -> agent | nil, "one-line message"
function M.new(path, config)
  local chunk, err = loadfile(path)
  if not chunk then return nil, "agent script: " .. tostring(err) end
  local ok, res = pcall(chunk, config)
  if not ok then return nil, "agent script " .. path .. ": " .. tostring(res):match("^[^\n]*") end
  local name = "script:" .. path
  if type(res) == "function" then
    return { name = name, act = function(_, ctx) return res(ctx) end }
  end
  if type(res) == "table" and type(res.new) == "function" then
    local ok2, agent = pcall(res.new, config)
    if not ok2 then return nil, "agent script " .. path .. ": " .. tostring(agent):match("^[^\n]*") end
    res = agent
  end
  if type(res) ~= "table" or type(res.act) ~= "function" then
    return nil, "agent script " .. path .. " must return a function(ctx) or a table with act(self, ctx)"
  end
  if res.name == nil then res.name = name end
  return res
end

return M
