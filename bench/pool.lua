-- bench/pool.lua: what the pool saves, as ratios against baselines measured in
-- the same run.  Run by hand:  ./build/engine run bench/pool.lua [fresh] [warm]
--
-- 1. A warm lease + release of an idle box against creating (and stopping) a
--    fresh local sandbox. Target: at least 100x cheaper.
-- 2. Leases per second with 1,000 keys and 64 concurrent tasks. Boxes come
--    from a null provider (a table with alive/stop), so this measures the
--    pool's own cost; the baseline is a bare engine.sync mutex per key doing
--    the same lock/unlock pattern.
local engine = require "engine"
local sync = require "engine.sync"
local pool = require "engine.pool"

local FRESH = tonumber(arg and arg[1]) or 10
local WARM = tonumber(arg and arg[2]) or 20000
local KEYS, TASKS, PER_TASK = 1000, 64, 2000

local function clock() return engine.monotonic() end

-- Seconds per fresh sandbox: create, then stop (what a pool miss costs).
local function fresh_cost(sandbox, spec)
  local t0 = clock()
  for _ = 1, FRESH do
    local sb = assert(sandbox.new(spec))
    sb:stop()
  end
  return (clock() - t0) / FRESH
end

-- Seconds per warm lease + release of the same idle box.
local function warm_cost(p, spec)
  do local _ <close> = assert(p:lease("warm", spec)) end
  local t0 = clock()
  for _ = 1, WARM do
    local l <close> = assert(p:lease("warm", spec))
  end
  local dt = (clock() - t0) / WARM
  assert(p:usage().created == 1, "the warm box was replaced")
  return dt
end

local function bench_ratio()
  local ok, sandbox = pcall(require, "engine.sandbox")
  if not ok then
    print("warm vs fresh: skipped (engine.sandbox unavailable: "
      .. tostring(sandbox):match("^[^\n]*") .. ")")
    return
  end
  local spec = { image = "host" }
  local fresh = fresh_cost(sandbox, spec)
  local p <close> = pool.new { ttl = 600, max_idle = 4 }
  local warm = warm_cost(p, spec)
  print(string.format("fresh sandbox create+stop: %.3f ms (n=%d)", fresh * 1e3, FRESH))
  print(string.format("warm lease+release:        %.4f ms (n=%d)", warm * 1e3, WARM))
  print(string.format("ratio fresh/warm:          %.0fx (target >= 100x)", fresh / warm))
end

-- The null provider: what the pool needs of a box, and nothing else.
local null_box = {}
null_box.__index = null_box
function null_box:alive() return not self.stopped end
function null_box:stop() self.stopped = true end
local n_null = 0
local function null_create(spec)
  n_null = n_null + 1
  return setmetatable({ id = "null-" .. n_null, info = { spec = spec } }, null_box)
end

-- Runs TASKS tasks, each doing PER_TASK rounds of op(key) on pseudo-random
-- keys; returns operations per second.
local function drive(op)
  local t0, tasks = clock(), {}
  for i = 1, TASKS do
    tasks[i] = engine.spawn(function()
      local k = i
      for _ = 1, PER_TASK do
        k = (k * 7919 + 17) % KEYS
        op(k)
      end
    end)
  end
  for i = 1, TASKS do assert(tasks[i]:join()) end
  return TASKS * PER_TASK / (clock() - t0)
end

local function bench_throughput()
  local p <close> = pool.new { ttl = 600, max_idle = KEYS, create = null_create }
  local spec = { image = "host" }
  local leases = drive(function(k)
    local l <close> = assert(p:lease(k, spec))
    engine.sleep(0)
  end)
  local locks = {}
  for k = 0, KEYS - 1 do locks[k] = sync.mutex() end
  local base = drive(function(k)
    local g <close> = locks[k]:guard()
    engine.sleep(0)
  end)
  local u = p:usage()
  print(string.format("leases/s, %d keys, %d tasks: %.0f (created %d, reused %d)",
    KEYS, TASKS, leases, u.created, u.reused))
  print(string.format("bare mutex lock/unlock/s:     %.0f  (pool/mutex ratio %.2f)",
    base, leases / base))
end

bench_ratio()
bench_throughput()
