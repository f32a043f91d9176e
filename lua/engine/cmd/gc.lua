-- engine gc: removes what killed engines left behind (state files, cgroups,
-- stray processes) and every sandbox past its ttl. Returns the exit status.
local sandbox = require "engine.sandbox"

local USAGE = [[
usage: engine gc [--all]   remove sandboxes whose engine is gone or whose ttl passed
                           (--all: every recorded sandbox, live engines' too)
]]

return function(argv)
  if argv[1] == "-h" or argv[1] == "--help" then io.stdout:write(USAGE) return 0 end
  if argv[1] and argv[1] ~= "--all" then io.stderr:write(USAGE) return 2 end
  local removed, failed = sandbox.gc { all = argv[1] == "--all" }
  for _, id in ipairs(removed) do io.stdout:write("removed ", id, "\n") end
  for _, id in ipairs(failed) do io.stderr:write("engine gc: could not remove all of ", id, " (still busy)\n") end
  if #removed == 0 and #failed == 0 then io.stdout:write("nothing to remove\n") end
  return #failed == 0 and 0 or 1
end
