-- engine ps: lists the live local sandboxes recorded in the state directory
-- (id, age, owner, image, memory used, labels). Returns the exit status.
local engine = require "engine"
local sandbox = require "engine.sandbox"

local USAGE = [[
usage: engine ps [--json]   list live sandboxes (state in ENGINE_STATE_DIR/sandboxes,
                            default /run/engine/sandboxes); `engine gc` removes dead ones
]]

local human = require("engine.report").human_bytes

local function age(t)
  local s = math.floor(math.max(0, engine.now() - (t or 0)))
  if s < 120 then return s .. "s" end
  if s < 7200 then return (s // 60) .. "m" end
  if s < 172800 then return (s // 3600) .. "h" end
  return (s // 86400) .. "d"
end

local function labels(t)
  local keys = {}
  for k in pairs(type(t) == "table" and t or {}) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for i, k in ipairs(keys) do keys[i] = k .. "=" .. tostring(t[k]) end
  return table.concat(keys, ",")
end

return function(argv)
  if argv[1] == "-h" or argv[1] == "--help" then io.stdout:write(USAGE) return 0 end
  if argv[1] and argv[1] ~= "--json" then io.stderr:write(USAGE) return 2 end
  local recs = sandbox.records()
  if argv[1] == "--json" then
    local json = require "engine.json"
    for _, r in ipairs(recs) do io.stdout:write(json.encode(r), "\n") end
    return 0
  end
  io.stdout:write(string.format("%-14s %6s %-12s %8s  %-20s %s\n", "ID", "AGE", "OWNER", "MEMORY", "IMAGE", "LABELS"))
  for _, r in ipairs(recs) do
    local owner = tostring(math.tointeger(r.owner_pid) or "?") .. (r.owner_alive and "" or " (dead)")
    io.stdout:write(string.format("%-14s %6s %-12s %8s  %-20s %s\n", r.id, age(r.created_at), owner,
      human(r.memory), tostring(r.image), labels(r.labels)))
  end
  return 0
end
