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

-- Runs the C baseline for n samples; returns them (seconds).
local function baseline_samples(mode, n)
  local out = sh(string.format("BASELINE_MNT=%s/mnt %s %s %d raw", sandbox.state_dir(), BASELINE, mode, n))
  local t = {}
  for x in out:gmatch("%S+") do t[#t + 1] = tonumber(x) end
  if #t ~= n then error("baseline failed: " .. out) end
  return t
end

local function baseline(mode, n)
  return stats(baseline_samples(mode, n))
end

-- Interleaves the contenders in ROUNDS rounds so that load changes on a
-- shared machine hit all of them alike; returns {name = samples}.
local ROUNDS = 10
local function interleaved(n, contenders)
  local samples = {}
  for _ = 1, ROUNDS do
    for _, c in ipairs(contenders) do
      local got = c.fn(math.max(1, n // ROUNDS))
      samples[c.name] = table.move(got, 1, #got, #(samples[c.name] or {}) + 1, samples[c.name] or {})
    end
  end
  return samples
end

local function time_samples(n, fn)
  local t = {}
  for i = 1, n do
    local t0 = engine.monotonic()
    fn(i)
    t[i] = engine.monotonic() - t0
  end
  return t
end

local function time_runs(n, fn)
  return stats(time_samples(n, fn))
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
print(string.format("create -> exec(\"true\") -> stop, %d times each, interleaved in %d rounds", N, ROUNDS))
sandbox.new({}):stop()              -- warm: state dir, seccomp program, caches
wait_clean()
local function box_once()
  local sb = assert(sandbox.new {})
  assert(sb:exec({ "true" }).code == 0)
  sb:stop()
end
local has_bwrap = (proc.run({ "bwrap", "--version" }) or {}).code == 0
local contenders = {
  { name = "baseline", fn = function(n) return baseline_samples("box", n) end },
  { name = "sandbox", fn = function(n) local t = time_samples(n, box_once) wait_clean() return t end },
  { name = "reaped", fn = function(n) return time_samples(n, function() box_once() wait_clean() end) end },
}
if has_bwrap then
  contenders[#contenders + 1] = { name = "bwrap", fn = function(n)
    return time_samples(n, function()
      local r = proc.run({ "bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true" })
      assert(r.code == 0, r.stderr)
    end)
  end }
end
local S = interleaved(N, contenders)
local b50, b95 = stats(S.baseline)
ref("bare C baseline (clone+overlay+pivot+exec)", b50, b95)
local s50, s95 = stats(S.sandbox)
row("engine.sandbox (stop returned)", s50, s95, b50, b95)
local f50, f95 = stats(S.reaped)
row("engine.sandbox (until reaped, cgroups gone)", f50, f95, b50, b95)
if has_bwrap then
  local w50, w95 = stats(S.bwrap)
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
do
  local sb <close> = assert(sandbox.new {})
  local E = interleaved(N * 5, {
    { name = "spawn", fn = function(n) return baseline_samples("spawn", n) end },
    { name = "exec", fn = function(n) return time_samples(n, function() assert(sb:exec({ "/bin/true" }).code == 0) end) end },
    { name = "proc", fn = function(n) return time_samples(n, function() assert(proc.run({ "/bin/true" }).code == 0) end) end },
  })
  local p50, p95 = stats(E.spawn)
  ref("host posix_spawn + waitpid", p50, p95)
  local e50, e95 = stats(E.exec)
  row("sb:exec({\"/bin/true\"})", e50, e95, p50, p95)
  local h50, h95 = stats(E.proc)
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
