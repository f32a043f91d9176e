-- bench/tasks.lua: the scheduler's costs as ratios of bare Lua coroutines
-- measured in the same run, plus the wall time and peak RSS of 10,000
-- concurrent sleeping tasks. Usage: engine run bench/tasks.lua [N]
local engine = require "engine"

local n = tonumber(arg[1]) or 200000

local function timed(fn)
  local t0 = engine.monotonic()
  fn()
  return engine.monotonic() - t0
end

local function hwm_kb()
  local f = assert(io.open("/proc/self/status"))
  local kb = f:read("a"):match("VmHWM:%s*(%d+)")
  f:close()
  return tonumber(kb)
end

local function noop() end

-- 10,000 tasks sleeping 10 ms at once (first, so VmHWM is theirs).
local hwm0 = hwm_kb()
local wall = timed(function()
  local tasks = {}
  for i = 1, 10000 do tasks[i] = engine.spawn(engine.sleep, 0.01) end
  for i = 1, 10000 do assert(tasks[i]:join()) end
end)
local hwm1 = hwm_kb()

-- Spawn + join vs coroutine.create + resume.
local bare_spawn = timed(function()
  for _ = 1, n do coroutine.resume(coroutine.create(noop)) end
end)
local task_spawn = timed(function()
  for _ = 1, n do engine.spawn(noop):join() end
end)

-- Ping-pong: two tasks alternating through sleep(0) vs resume/yield.
local bare_pp = timed(function()
  local co = coroutine.wrap(function() while true do coroutine.yield() end end)
  for _ = 1, n do co() end
end)
local task_pp = timed(function()
  local function player() for _ = 1, n // 2 do engine.sleep(0) end end
  local a, b = engine.spawn(player), engine.spawn(player)
  a:join()
  b:join()
end)

print(string.format("N = %d", n))
print(string.format("task spawn+join: ratio %.2f of bare coroutine create+resume (%.0f/s vs %.0f/s)",
  bare_spawn / task_spawn, n / task_spawn, n / bare_spawn))
print(string.format("sleep(0) ping-pong: ratio %.2f of bare resume/yield (%.0f switches/s vs %.0f/s)",
  bare_pp / task_pp, n / task_pp, n / bare_pp))
print(string.format("10,000 tasks sleeping 10 ms: wall %.3f s (%.1fx the 10 ms sleep); " ..
  "peak RSS (VmHWM) %.1f MB (%.1f MB before them)", wall, wall / 0.01, hwm1 / 1024, hwm0 / 1024))
