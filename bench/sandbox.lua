-- bench/sandbox.lua: sandbox start and exec costs, each printed as a ratio
-- against baselines run in the same invocation.
--
--   engine run bench/sandbox.lua [N] [LIVE]     (as root; N = 200, LIVE = 200)
--
-- 1. create -> exec("true") -> stop, N times, p50/p95, against
--    bench/sandbox_baseline (clone with the same namespaces, the same
--    overlay and mask, pivot_root, exec true, wait), bwrap, and
--    `docker run --rm --network none` when a daemon answers.
-- 2. exec("true") in a live sandbox against posix_spawn + wait on the host.
-- 3. LIVE sandboxes alive at once, each answering an exec; memory per idle box.
local engine = require "engine"
local sandbox = require "engine.sandbox"
local core = require "engine.sandbox.core"
local proc = require "engine.proc"

local N = tonumber(arg and arg[1]) or 200
local LIVE = tonumber(arg and arg[2]) or 200

local function sh(cmd)
  local f = assert(io.popen(cmd))
  local out = f:read("a")
  f:close()
  return out
end

local exe = sh("readlink /proc/" .. core.getpid() .. "/exe"):gsub("%s+$", "")
local BASELINE = exe:gsub("/[^/]+$", "") .. "/bench/sandbox_baseline"

local function stats(t)
  table.sort(t)
  local sum = 0
  for _, x in ipairs(t) do sum = sum + x end
  return t[math.max(1, #t // 2)], t[math.max(1, math.floor(#t * 0.95))], sum / #t
end

local function baseline(mode, n)
  local out = sh(string.format("BASELINE_MNT=%s/mnt %s %s %d", sandbox.state_dir(), BASELINE, mode, n))
  local p50, p95, mean = out:match("(%S+) (%S+) (%S+)")
  if not p50 then error("baseline failed: " .. out) end
  return tonumber(p50), tonumber(p95), tonumber(mean)
end

local function time_runs(n, fn)
  local t = {}
  for i = 1, n do
    local t0 = engine.monotonic()
    fn(i)
    t[i] = engine.monotonic() - t0
  end
  return stats(t)
end

local function wait_clean()
  while core.live() > 0 do engine.sleep(0.001) end
end

local function row(name, p50, p95, b50, b95)
  print(string.format("  %-44s p50 %7.2f ms  p95 %7.2f ms   ratio p50 %5.2fx  p95 %5.2fx",
    name, p50 * 1e3, p95 * 1e3, p50 / b50, p95 / b95))
end

local function ref(name, p50, p95)
  print(string.format("  %-44s p50 %7.2f ms  p95 %7.2f ms   (baseline)", name, p50 * 1e3, p95 * 1e3))
end

-- ---- 1. start ------------------------------------------------------------------
print(string.format("create -> exec(\"true\") -> stop, %d times", N))
sandbox.new({}):stop()              -- warm: state dir, seccomp program, caches
wait_clean()
local b50, b95 = baseline("box", N)
ref("bare C baseline (clone+overlay+pivot+exec)", b50, b95)

local s50, s95 = time_runs(N, function()
  local sb = assert(sandbox.new {})
  assert(sb:exec({ "true" }).code == 0)
  sb:stop()
end)
wait_clean()
row("engine.sandbox (stop returned)", s50, s95, b50, b95)

local f50, f95 = time_runs(N, function()
  local sb = assert(sandbox.new {})
  assert(sb:exec({ "true" }).code == 0)
  sb:stop()
  wait_clean()
end)
row("engine.sandbox (until reaped, cgroups gone)", f50, f95, b50, b95)

local bw = proc.run({ "bwrap", "--version" })
if bw and bw.code == 0 then
  local w50, w95 = time_runs(N, function()
    local r = proc.run({ "bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true" })
    assert(r.code == 0, r.stderr)
  end)
  ref("bwrap --unshare-all ... true", w50, w95)
  print(string.format("  %-44s p50 %5.2fx  p95 %5.2fx (< 1 is faster)", "engine.sandbox / bwrap", s50 / w50, s95 / w95))
end

local dk = proc.run({ "docker", "info" }, { timeout = 10 })
if dk and dk.code == 0 then
  local dn = math.min(N, 20)
  local d50, d95 = time_runs(dn, function()
    local r = proc.run({ "docker", "run", "--rm", "--network", "none", "debian:12", "true" }, { timeout = 60 })
    assert(r.code == 0, r.stderr)
  end)
  ref(string.format("docker run --rm --network none (%d runs)", dn), d50, d95)
  print(string.format("  %-44s p50 %5.1fx faster", "engine.sandbox vs docker", d50 / s50))
else
  print("  docker: no daemon answering, skipped")
end

-- ---- 2. exec in a live sandbox --------------------------------------------------
print(string.format("\nexec(\"true\") in a live sandbox, %d times", N * 5))
local p50, p95 = baseline("spawn", N * 5)
ref("host posix_spawn + waitpid", p50, p95)
do
  local sb <close> = assert(sandbox.new {})
  local e50, e95 = time_runs(N * 5, function() assert(sb:exec({ "/bin/true" }).code == 0) end)
  row("sb:exec({\"/bin/true\"})", e50, e95, p50, p95)
  local h50, h95 = time_runs(N * 5, function() assert(proc.run({ "/bin/true" }).code == 0) end)
  row("proc.run({\"/bin/true\"}) on the host (reference)", h50, h95, p50, p95)
end

-- ---- 3. many alive at once --------------------------------------------------------
local function mem_available()
  return tonumber(sh("grep MemAvailable /proc/meminfo"):match("(%d+)")) * 1024
end
print(string.format("\n%d sandboxes alive at once", LIVE))
wait_clean()
local before = mem_available()
local boxes, t0 = {}, engine.monotonic()
for i = 1, LIVE do boxes[i] = assert(sandbox.new {}) end
local created = engine.monotonic() - t0
local tasks = {}
t0 = engine.monotonic()
for i = 1, LIVE do
  tasks[i] = engine.spawn(function() return boxes[i]:exec("echo " .. i).stdout end)
end
for i = 1, LIVE do
  local ok, out = tasks[i]:join()
  assert(ok and out == i .. "\n", out)
end
local answered = engine.monotonic() - t0
local after = mem_available()
local cg = 0
for i = 1, LIVE do cg = cg + math.max(0, boxes[i]:memory() or 0) end
print(string.format("  created in %.2f s (%.2f ms each); all %d answered an exec in %.2f s",
  created, created / LIVE * 1e3, LIVE, answered))
print(string.format("  memory per idle sandbox: %.0f KiB (host MemAvailable drop / %d; noisy on a shared host), " ..
  "%.0f KiB charged to its cgroup", (before - after) / LIVE / 1024, LIVE, cg / LIVE / 1024))
t0 = engine.monotonic()
for i = 1, LIVE do boxes[i]:stop() end
wait_clean()
print(string.format("  all stopped and cleaned up in %.2f s", engine.monotonic() - t0))
