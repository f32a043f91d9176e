-- A tour of tasks: many concurrent sleepers, a cancellation that still runs
-- its cleanup, and host processes (once engine.proc is in).
local engine = require "engine"

local t0 = engine.monotonic()
local tasks = {}
for i = 1, 1000 do
  tasks[i] = engine.spawn(function() engine.sleep(0.05); return i end)
end
local sum = 0
for _, t in ipairs(tasks) do sum = sum + select(2, t:join()) end
print(string.format("1000 tasks slept 50 ms each in %.0f ms (sum %d)",
  (engine.monotonic() - t0) * 1000, sum))

local slow = engine.spawn(function()
  local _ <close> = setmetatable({}, { __close = function(_, err)
    print("cleanup ran after: " .. tostring(err))
  end })
  engine.sleep(3600)
end)
engine.sleep(0.01)
slow:cancel()
print("cancelled task:", slow:join())
