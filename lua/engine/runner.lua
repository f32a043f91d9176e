-- engine.runner: `engine run ENV.lua [flags]`, the episodes of an environment.
--
-- Each episode runs in a worker task (at most -c at once) through five
-- phases: provision, setup, agent, score, cleanup. Every phase runs in a
-- child task under its own timeout, so a phase that overruns is cancelled
-- (its pending operation's cleanup runs) and cleanup always follows.
-- Infrastructure failures before the agent starts are retried with backoff;
-- once the agent has started, an episode ends with whatever happened.
--
-- Failure kinds: env_error (the env script raised), infra_error (sandbox or
-- provider), agent_error, timeout, score_error. Ctrl-C stops launching,
-- cancels running episodes, runs their cleanup, writes the run as
-- interrupted and returns 130; --resume RUN_DIR finishes it.
local engine = require "engine"
local sync = require "engine.sync"
local envlib = require "engine.env"
local trace = require "engine.trace"
local json = require "engine.json"
local report = require "engine.report"
local agents = require "engine.agents"

local M = {}

-- Sandbox providers by name; specs may add their own ({new = fn(spec)}).
-- A name not here goes to engine.sandbox, which knows its own providers.
M.providers = {}
M.GRACE = 10          -- seconds a cancelled phase gets to unwind
M.BACKOFF = 0.5       -- first retry delay, doubled per retry, at most 10 s

local INFRA_KINDS = { sandbox = true, infra = true, infra_error = true, provider = true }

local function first_line(e)
  if type(e) == "table" and e.message then e = e.message end
  return (tostring(e):match("^[^\n]*"))
end

-- ---- hashing ------------------------------------------------------------------

-- FNV-1a 64-bit of a string, as 16 hex digits (Lua integers wrap).
function M.hash(s)
  local h = -3750763034362895579          -- 0xcbf29ce484222325
  for i = 1, #s do
    h = (h ~ s:byte(i)) * 1099511628211
  end
  return string.format("%016x", h)
end

-- A canonical serialization (sorted keys) for hashing tables.
local function canonical(v, out, seen)
  local t = type(v)
  if t == "table" then
    if seen[v] then out[#out + 1] = "<cycle>"; return end
    seen[v] = true
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    out[#out + 1] = "{"
    for _, k in ipairs(keys) do
      out[#out + 1] = tostring(k) .. "="
      canonical(v[k], out, seen)
      out[#out + 1] = ","
    end
    out[#out + 1] = "}"
    seen[v] = nil
  elseif t == "string" then
    out[#out + 1] = string.format("%q", v)
  elseif t == "function" or t == "userdata" or t == "thread" then
    out[#out + 1] = "<" .. t .. ">"
  else
    out[#out + 1] = tostring(v)
  end
end

function M.hash_value(v)
  local out = {}
  canonical(v, out, {})
  return M.hash(table.concat(out))
end

local function file_hash(path)
  local s = trace.read_file(path)
  return s and M.hash(s)
end

-- ---- tasks --------------------------------------------------------------------

-- A glob (* and ?) as an anchored Lua pattern.
local function glob_pattern(glob)
  local p = glob:gsub("[%^%$%(%)%%%.%[%]%+%-]", "%%%0"):gsub("%*", ".*"):gsub("%?", ".")
  return "^" .. p .. "$"
end

local function matches(id, patterns)
  if not patterns or #patterns == 0 then return true end
  for _, p in ipairs(patterns) do
    if id == p or id:match(glob_pattern(p)) then return true end
  end
  return false
end

-- Calls the env's tasks and returns an iterator of tasks, and the count when
-- known. Raises a one-line env error.
-- "tasks: MSG", naming the env file unless MSG carries its own file:line.
local function tasks_error(env_table, e)
  local msg = first_line(e)
  if msg:match("^[^%s:]+:%d+: ") then return envlib.error("tasks: " .. msg) end
  return envlib.error(env_table.source .. ": tasks: " .. msg)
end

local function task_iterator(env_table, config)
  local src = env_table.tasks
  if type(src) == "function" then
    local ok, res = pcall(src, config)
    if not ok then error(tasks_error(env_table, res), 0) end
    src = res
  end
  if type(src) == "table" then
    local i = 0
    return function() i = i + 1; return src[i] end, #src
  end
  if type(src) == "function" then return src, nil end
  error(envlib.error(env_table.source .. ": tasks must return a list or an iterator, got " .. type(src)), 0)
end

-- The episodes to run: next() -> item | nil. Raises env errors (a task
-- without an id, a duplicate id, a generator that raises).
local function item_source(st)
  local iter, count = task_iterator(st.env, st.config)
  local R = st.config.rollouts
  local patterns = st.config.task
  local seen, taken, index = {}, 0, 0
  local task, hash, rollout = nil, nil, R
  local limit = st.config.n
  if count and (not patterns or #patterns == 0) then
    st.total = math.min(count, limit or count) * R
  elseif limit then
    st.total = limit * R
  end
  local function next_task()
    while true do
      if limit and taken >= limit then return nil end
      local ok, t = pcall(iter)
      if not ok then error(tasks_error(st.env, t), 0) end
      if t == nil then return nil end
      index = index + 1
      if type(t) ~= "table" then error(envlib.error(st.env.source .. ": task #" .. index .. " is not a table"), 0) end
      if type(t.id) == "number" then t.id = tostring(t.id) end
      if type(t.id) ~= "string" or t.id == "" then
        error(envlib.error(st.env.source .. ": task #" .. index .. " has no id"), 0)
      end
      if seen[t.id] then error(envlib.error(st.env.source .. ": duplicate task id " .. t.id), 0) end
      seen[t.id] = true
      if matches(t.id, patterns) then
        taken = taken + 1
        return t
      end
    end
  end
  return function()
    while true do
      if rollout >= R then
        task = next_task()
        if not task then
          if st.total == nil or st.total > taken * R then st.total = taken * R end
          return nil
        end
        hash, rollout = M.hash_value(task), 0
      end
      local r = rollout
      rollout = rollout + 1
      local key = task.id .. ":" .. r .. ":" .. hash
      if not st.completed[key] then
        return { task = task, rollout = r, hash = hash, key = key, id = task.id .. ".r" .. r }
      end
      st.progress.done = st.progress.done + 1
    end
  end
end

-- ---- sandboxes ----------------------------------------------------------------

-- provider(name | table) -> provider with new(spec) | nil, err
function M.provider(name)
  if type(name) == "table" then return name end
  local p = M.providers[name or "local"]
  if p then return p end
  local ok, mod = pcall(require, "engine.sandbox")
  if not ok then return nil, "no sandbox provider '" .. tostring(name or "local") .. "': " .. first_line(mod) end
  return mod
end

local function excerpt(s, limit)
  if type(s) ~= "string" then return s end
  limit = limit or 2048
  if #s <= 2 * limit then return s end
  return s:sub(1, limit) .. "\n...[" .. (#s - 2 * limit) .. " bytes elided]...\n" .. s:sub(-limit)
end

local function traced_exec(sb, ep, cmd, opts)
  local t0 = engine.monotonic()
  local ok, r, err = pcall(sb.exec, sb, cmd, opts)
  local d = engine.monotonic() - t0
  if not ok then
    ep:event("exec", { cmd = cmd, error = first_line(r), duration = d })
    error(r, 0)
  end
  if type(r) ~= "table" then
    ep:event("exec", { cmd = cmd, error = err, duration = d })
    return r, err
  end
  ep:event("exec", { cmd = cmd, code = r.code, signal = r.signal, timed_out = r.timed_out or nil,
    truncated = r.truncated or nil, duration = r.duration or d,
    stdout = excerpt(r.stdout), stderr = excerpt(r.stderr) })
  return r, err
end

local FILE_OPS = {
  read = function(a, r) return { path = a[1], bytes = type(r) == "string" and #r or nil } end,
  write = function(a) return { path = a[1], bytes = type(a[2]) == "string" and #a[2] or nil } end,
  upload = function(a) return { src = a[1], path = a[2] } end,
  download = function(a) return { path = a[1], dst = a[2] } end,
  remove = function(a) return { path = a[1] } end,
}

-- A proxy of sb whose exec and file transfers are recorded in ep's trace;
-- everything else goes straight to sb. proxy.raw is sb.
function M.traced_sandbox(sb, ep)
  local proxy, cache = { raw = sb }, {}
  local function wrap(k, v)
    if k == "exec" then return function(_, cmd, opts) return traced_exec(sb, ep, cmd, opts) end end
    local describe = FILE_OPS[k]
    if describe then
      return function(_, ...)
        local args = table.pack(...)
        local res = table.pack(v(sb, ...))
        local data = describe(args, res[1])
        if res[1] == nil then data.error = res[2] end
        ep:event(k, data)
        return table.unpack(res, 1, res.n)
      end
    end
    return function(self, ...)
      if self == proxy then return v(sb, ...) end
      return v(self, ...)
    end
  end
  return setmetatable(proxy, {
    __index = function(_, k)
      local v = sb[k]
      if type(v) ~= "function" then return v end
      local w = cache[k]
      if not w then w = wrap(k, v); cache[k] = w end
      return w
    end,
    __tostring = function() return tostring(sb) end,
  })
end

local function usage_add(st, seconds, created)
  local u = st.usage
  u.created = u.created + (created or 0)
  u.seconds = u.seconds + (seconds or 0)
end

-- The sandbox spec for a task: the env's, with labels; and its pool key.
-- Pooled specs carry only the run label (a per-episode label would make
-- every box look drifted). Without pool_key, each worker has its own key,
-- so boxes are reused by the next episode of the same worker and spec.
local function sandbox_spec(st, ctx)
  local s = st.env.sandbox
  if type(s) == "function" then
    local ok, res = pcall(s, ctx.task, st.config)
    if not ok then error(envlib.error(first_line(res)), 0) end
    s = res
  end
  local spec = {}
  for k, v in pairs(s or { image = "host" }) do spec[k] = v end
  local labels = {}
  for k, v in pairs(spec.labels or {}) do labels[k] = v end
  labels.engine_run = ctx.run.id
  if not st.pool then labels.engine_task, labels.engine_episode = ctx.task.id, ctx.run.episode_id end
  spec.labels = labels
  local key
  if st.pool then
    key = st.env.pool_key and st.env.pool_key(ctx.task, ctx) or (M.hash_value(spec) .. "/w" .. tostring(ctx.worker))
  end
  return spec, key
end

-- Provisions ctx's sandbox (from the pool when there is one). Returns the
-- runtime info; raises on failure.
local function provision(st, ctx)
  local spec, key = sandbox_spec(st, ctx)
  local sb, lease, borrowed
  if st.pool then
    local err
    lease, err = st.pool:lease(key, spec)
    if not lease then error({ kind = "infra_error", message = "pool: " .. tostring(err) }, 0) end
    sb, borrowed = lease.sandbox, lease.borrowed and true or false
  else
    local p, perr = M.provider(spec.provider)
    if not p then error({ kind = "infra_error", message = perr }, 0) end
    local err
    sb, err = p.new(spec)
    if not sb then error({ kind = "infra_error", message = "sandbox: " .. tostring(err) }, 0) end
    borrowed = false
  end
  local info = type(sb.info) == "table" and sb.info or {}
  return { sb = sb, lease = lease, created = engine.monotonic(), runtime = {
    provider = info.provider or (type(spec.provider) == "string" and spec.provider) or "local",
    id = sb.id, image = type(info.image) == "string" and info.image or (type(spec.image) == "string" and spec.image or nil),
    borrowed = borrowed, reason = lease and lease.reason or nil } }
end

local function close_lease(lease, broken, reason)
  if type(lease.release) == "function" then return lease:release({ healthy = not broken, reason = reason }) end
  local mt = getmetatable(lease)
  if mt and mt.__close then return mt.__close(lease, nil) end
end

-- Gives the box back: parks it in the pool after a clean episode, else
-- stops it. Never raises.
local function release(st, box, broken, reason)
  if not box or box.released then return end
  box.released = true
  if box.lease then
    local ok, err = pcall(close_lease, box.lease, broken, reason)
    if not ok then io.stderr:write("engine: releasing a pooled sandbox: ", first_line(err), "\n") end
    return
  end
  pcall(box.sb.stop, box.sb)
  usage_add(st, engine.monotonic() - box.created, 1)
end

-- ---- phases -------------------------------------------------------------------

-- Runs fn(...) in a child task under a timeout. Returns
-- {ok = true, values = pack} or {ok = false, err =, traceback =, timeout =}.
-- A phase that finished anyway as its deadline passed still times out, with
-- its values as late_values (a provisioned box must not be dropped).
-- Re-raises cancellation of the calling task after cancelling the child.
function M.run_phase(seconds, fn, ...)
  local args, tb = table.pack(...), {}
  local function handler(e)
    tb.text = debug.traceback(type(e) == "table" and first_line(e) or tostring(e), 2)
    return e
  end
  local child = engine.spawn(function()
    return table.pack(xpcall(fn, handler, table.unpack(args, 1, args.n)))
  end)
  local guard <close> = setmetatable({}, { __close = function()
    if child:status() == "done" or child:status() == "failed" or child:status() == "cancelled" then return end
    child:cancel()
    pcall(sync.with_timeout, M.GRACE, child.join, child)
  end })
  local ok, res = sync.with_timeout(seconds, child.join, child)
  if ok == nil and res == "timeout" then
    child:cancel()
    local _, jok, jres = pcall(sync.with_timeout, M.GRACE, child.join, child)
    local late = jok and type(jres) == "table" and jres[1] and table.pack(table.unpack(jres, 2, jres.n)) or nil
    return { ok = false, timeout = true, err = "timeout", late_values = late }
  end
  if not ok then
    if engine.is_cancel(res) then error(res, 0) end
    return { ok = false, err = res, traceback = tostring(res) }
  end
  if res[1] then return { ok = true, values = table.pack(table.unpack(res, 2, res.n)) } end
  if engine.is_cancel(res[2]) then error(res[2], 0) end
  return { ok = false, err = res[2], traceback = tb.text }
end

local function kind_of(err, default)
  if type(err) == "table" then
    local k = err.kind
    if INFRA_KINDS[k] then return "infra_error" end
    if k == "env_error" or k == "agent_error" or k == "score_error" or k == "timeout" then return k end
  end
  return default
end

local function fail(out, kind, phase, r)
  out.error = { kind = kind, phase = phase, message = r.timeout and (phase .. " timed out") or first_line(r.err) }
  out.ctx.trace:event("error", { kind = kind, phase = phase, message = out.error.message, traceback = r.traceback })
end

-- Runs one phase, timing it into out.phases; returns the phase result.
local function phase(out, name, fn, ...)
  local ctx = out.ctx
  local t0 = engine.monotonic()
  ctx.trace:event("phase", { phase = name, attempt = out.attempt })
  local r = M.run_phase(ctx.timeouts[name], fn, ...)
  out.phases[name] = (out.phases[name] or 0) + engine.monotonic() - t0
  return r
end

local function default_run(ctx) return ctx.agent:act(ctx) end

-- reward, rewards from what score returned; nil, message if unusable.
local function parse_reward(v, detail)
  local rewards = type(detail) == "table" and type(detail.rewards) == "table" and detail.rewards or nil
  if type(v) == "table" then
    rewards = v.rewards or rewards
    v = v.reward
  end
  if type(v) == "boolean" then v = v and 1 or 0 end
  if type(v) ~= "number" or v ~= v then return nil, "score returned no number (got " .. type(v) .. ")" end
  return v, rewards
end

local function score_phase(st, out)
  local ctx = out.ctx
  local r = phase(out, "score", st.env.score, ctx)
  if r.timeout then return fail(out, "timeout", "score", r) end
  if not r.ok then return fail(out, kind_of(r.err, "score_error"), "score", r) end
  local reward, rewards = parse_reward(r.values[1], r.values[2])
  if reward == nil then return fail(out, "score_error", "score", { err = rewards }) end
  out.reward, out.rewards = reward, rewards
  ctx.score_detail = r.values[2]
  -- A scorer may name what went wrong (tbench2: reward_file_missing, ...):
  -- the reward stands, and the episode records the error kind.
  local detail = r.values[2]
  if type(detail) == "table" and type(detail.error) == "string" then
    out.error = { kind = detail.error, message = type(detail.message) == "string" and detail.message or detail.error }
  end
  ctx.trace:event("score", { reward = reward, rewards = rewards, detail = r.values[2] })
end

-- The cleanup phase: the env's cleanup hook, then the sandbox goes. The box
-- is released even when this task is cancelled during the hook (Ctrl-C):
-- the cancellation is re-raised after.
local function cleanup(st, out, box, err)
  local ctx = out.ctx
  local t0 = engine.monotonic()
  local ok, r = true, nil
  if st.env.cleanup then
    ctx.trace:event("phase", { phase = "cleanup", attempt = out.attempt })
    ok, r = pcall(M.run_phase, ctx.timeouts.cleanup, st.env.cleanup, ctx)
    if not ok then
      out.cleanup_error = engine.is_cancel(r) and "cleanup cancelled" or first_line(r)
    elseif not r.ok then
      out.cleanup_error = r.timeout and "cleanup timed out" or first_line(r.err)
      ctx.trace:event("cleanup_error", { message = out.cleanup_error, traceback = r.traceback })
    end
  end
  -- A box whose episode failed in any way is not reused: its state is unknown.
  local broken = err ~= nil or out.error ~= nil or not ok
  local why = broken and ("episode " .. tostring(ctx.run.episode_id) .. " ended with " ..
    (out.error and out.error.kind or "an error")) or nil
  release(st, box, broken, why)
  out.phases.cleanup = (out.phases.cleanup or 0) + engine.monotonic() - t0
  if not ok then error(r, 0) end
end

-- One attempt of an episode. Returns out, retryable.
local function attempt(st, out)
  local ctx = out.ctx
  local r = phase(out, "provision", provision, st, ctx)
  if r.late_values then release(st, r.late_values[1], true, "provision timed out") end
  if not r.ok then
    local kind = r.timeout and "infra_error" or kind_of(r.err, "infra_error")
    fail(out, kind, "provision", r)
    return out, kind == "infra_error"
  end
  local box = r.values[1]
  out.runtime = box.runtime
  st.live = st.live + 1
  local guard <close> = setmetatable({}, { __close = function(_, e)
    st.live = st.live - 1
    out.finished = e == nil          -- the attempt's result stands, whatever cleanup does
    cleanup(st, out, box, e)
  end })
  ctx.sandbox, ctx.borrowed = M.traced_sandbox(box.sb, ctx.trace), box.runtime.borrowed
  ctx.lease = box.lease
  ctx.trace:event("sandbox", box.runtime)
  if st.env.setup then
    r = phase(out, "setup", st.env.setup, ctx)
    if r.timeout then fail(out, "timeout", "setup", r); return out, false end
    if not r.ok then
      local kind = kind_of(r.err, "env_error")
      fail(out, kind, "setup", r)
      return out, kind == "infra_error"
    end
  end
  out.agent_started = true
  r = phase(out, "agent", st.env.run or default_run, ctx)
  if r.timeout then
    out.agent_timed_out = true
    fail(out, "timeout", "agent", r)
  elseif not r.ok then
    fail(out, kind_of(r.err, "agent_error"), "agent", r)
    return out, false
  elseif type(r.values[1]) == "table" and r.values[1].status ~= nil then
    out.agent_result = r.values[1]           -- e.g. the llm agent's {status, turns, usage}
    ctx.trace:event("agent_result", out.agent_result)
  end
  score_phase(st, out)
  return out, false
end

local function new_ctx(st, item, ep, n)
  local ctx = { task = item.task, worker = item.worker, env = st.env, agent = st.agent, trace = ep, config = st.config,
    pool = st.pool, rollout = item.rollout, attempt = n,
    timeouts = envlib.timeouts(st.env, item.task, st.config),
    run = { id = st.run_id, dir = st.dir, env = st.env.name, file = st.path, episode_id = ep.id } }
  return ctx
end

-- Runs an episode through its attempts and returns its record fields
-- (also kept in holder.out, for a cancellation that comes during cleanup).
local function episode_attempts(st, item, ep, holder)
  local out
  local retries = st.config.retries
  for n = 1, retries + 1 do
    out = { phases = {}, attempt = n }
    holder.out = out
    out.ctx = new_ctx(st, item, ep, n)
    local _, retryable = attempt(st, out)
    if not retryable or n > retries or st.stopping then break end
    local delay = math.min(M.BACKOFF * 2 ^ (n - 1), 10)
    ep:event("retry", { attempt = n, delay = delay, error = out.error })
    engine.sleep(delay)
  end
  return out
end

local function status_of(out)
  if not out.error then return "ok" end
  if out.error.kind == "timeout" then return "timeout" end
  return "error"
end

-- Runs one episode and appends its record; cancellation abandons it (no
-- record: --resume runs it again), unless it came during the cleanup of a
-- finished attempt: that record is written, then the cancellation goes on.
local function run_episode(st, item)
  local ep = st.run:episode({ key = item.key, id = item.id, task = item.task.id, task_hash = item.hash,
    rollout = item.rollout, agent = st.config.agent })
  ep:event("task", { id = item.task.id, prompt = item.task.prompt })
  local started, t0 = engine.now(), engine.monotonic()
  st.in_flight = st.in_flight + 1
  st.progress:running(st.in_flight)
  local holder = {}
  local ok, out = pcall(episode_attempts, st, item, ep, holder)
  st.in_flight = st.in_flight - 1
  st.progress:running(st.in_flight)
  local cancelled
  if not ok then
    if holder.out and holder.out.finished and engine.is_cancel(out) then
      cancelled, out = out, holder.out
    elseif engine.is_cancel(out) or st.interrupted then
      ep:abandon("cancelled")
      error(out, 0)
    else
      out = { phases = {}, attempt = 1, error = { kind = "env_error", message = first_line(out) } }
    end
  end
  local rec = ep:finish({ reward = out.reward, rewards = out.rewards, status = status_of(out),
    error = out.error, attempt = out.attempt, phases = out.phases, runtime = out.runtime,
    agent_timed_out = out.agent_timed_out, cleanup_error = out.cleanup_error, agent_result = out.agent_result,
    started_at = started, ended_at = engine.now(), duration = engine.monotonic() - t0 })
  st.new_records = st.new_records + 1
  st.progress:episode(rec)
  if cancelled then error(cancelled, 0) end
end

local function worker(st, index)
  while not st.stopping do
    local ok, item = pcall(st.next_item)
    if not ok then
      st.fatal = st.fatal or item
      st.stopping = true
      return
    end
    if not item then return end
    item.worker = index
    run_episode(st, item)
  end
end

-- ---- the run ------------------------------------------------------------------

local function say(msg) io.stderr:write("engine: ", msg, "\n") end

-- Reads a run to resume: its run.json, and argv to parse before ours.
local function load_resume(dir, env_table)
  local meta, err = trace.read(dir)
  if not meta then return nil, err end
  if type(meta.env) == "table" and meta.env.name and meta.env.name ~= env_table.name then
    return nil, dir .. " is a run of env '" .. tostring(meta.env.name) .. "', not '" .. env_table.name .. "'"
  end
  return meta
end

-- Flags: saved ones first when resuming, then argv. -> config | nil, err
local function configure(env_table, args)
  local config, err = envlib.parse_flags(args, env_table)
  if not config then return nil, err end
  if config.help or not config.resume then return config end
  local meta
  meta, err = load_resume(config.resume, env_table)
  if not meta then return nil, err end
  local saved = type(meta.argv) == "table" and meta.argv or {}
  local base, berr = envlib.parse_flags(saved, env_table)
  if not base then return nil, config.resume .. "/run.json: saved flags: " .. berr end
  local merged = envlib.parse_flags(args, env_table, base)
  merged.prior = meta
  return merged
end

local function check_config(c)
  if c.concurrency < 1 then return "-c must be at least 1" end
  if c.rollouts < 1 then return "-r must be at least 1" end
  if c.n and c.n < 0 then return "-n must not be negative" end
  if c.retries < 0 then return "--retries must not be negative" end
  if c.timeout_multiplier <= 0 then return "--timeout-multiplier must be positive" end
end

local function new_run_id(name)
  return os.date("!%Y%m%dT%H%M%S") .. "-" .. trace.safe_id(name) .. "-" .. string.format("%04x", math.random(0, 0xffff))
end

local function plain_config(c)
  local out = {}
  for k, v in pairs(c) do if k ~= "explicit" and k ~= "prior" then out[k] = v end end
  return out
end

-- Creates the pool when the env or the flags ask for one.
local function make_pool(env_table, config)
  local want = env_table.pool or config.pool or config.pool_ttl or config.pool_max_idle
  if config.pool == false or not want then return nil end
  local ok, pool = pcall(require, "engine.pool")
  if not ok then return nil, "pool unavailable: " .. first_line(pool) end
  local o = type(env_table.pool) == "table" and env_table.pool or {}
  local function create(spec)
    local p, err = M.provider(spec.provider)
    if not p then return nil, err end
    return p.new(spec)
  end
  return pool.new({ ttl = config.pool_ttl or o.ttl or 600, create = create,
    max_idle = config.pool_max_idle or o.max_idle or config.concurrency })
end

-- Sandbox usage of this session: the pool's, or the runner's own count.
local function session_usage(st)
  if st.pool_final then return st.pool_final end
  local u = { created = st.usage.created, reused = 0, seconds = st.usage.seconds }
  if st.pool then
    local ok, pu = pcall(st.pool.usage, st.pool)
    if ok and type(pu) == "table" then
      u = { created = pu.created or 0, reused = pu.reused or 0, seconds = pu.seconds or 0,
        live = pu.live, idle = pu.idle }
    end
  end
  return u
end

-- Sums sandbox usage over the sessions of a run.
local function total_usage(sessions)
  local t = { created = 0, reused = 0, seconds = 0 }
  for _, s in ipairs(sessions) do
    local u = s.sandboxes or {}
    t.created, t.reused, t.seconds = t.created + (u.created or 0), t.reused + (u.reused or 0), t.seconds + (u.seconds or 0)
  end
  return t
end

-- The summary table of a run directory's records and run.json.
function M.summary(meta, records)
  local sessions = type(meta.sessions) == "table" and meta.sessions or {}
  local wall = 0
  for _, s in ipairs(sessions) do
    if s.started_at and s.ended_at then wall = wall + (s.ended_at - s.started_at) end
  end
  local s = report.summarize(records, { rollouts = type(meta.config) == "table" and meta.config.rollouts or nil,
    sandboxes = total_usage(sessions), wall = wall > 0 and wall or nil, status = meta.status })
  s.run_id, s.env, s.agent = meta.id, type(meta.env) == "table" and meta.env.name or nil, meta.agent
  return s
end

function M.header(meta, dir)
  return string.format("run %s  env %s  agent %s\n%s", tostring(meta.id),
    type(meta.env) == "table" and tostring(meta.env.name) or "?", tostring(meta.agent), dir)
end

-- Ctrl-C: the first stops launching and cancels the workers; the second
-- says cleanup is running; the third exits at once.
local function install_interrupt(st)
  engine.on_interrupt(function()
    st.interrupts = st.interrupts + 1
    if st.interrupts == 1 then
      st.stopping, st.interrupted = true, true
      st.progress:say("engine: interrupted; cleaning up (Ctrl-C again to hurry)")
      for _, w in ipairs(st.workers) do w:cancel() end
    elseif st.interrupts == 2 then
      io.stderr:write("\nengine: cleaning up; interrupt again to exit at once\n")
    else
      io.stderr:write("\nengine: exiting without cleanup\n")
      os.exit(130, false)
    end
  end)
end

local function start_ticker(st)
  if st.config.quiet or not st.progress.tty then return nil end
  return engine.spawn(function()
    while true do
      engine.sleep(1)
      st.progress:draw()
    end
  end)
end

-- Waits for every worker; a cancel of this task (SIGTERM) counts as an
-- interrupt and cancels the workers too.
local function join_workers(st)
  for _, w in ipairs(st.workers) do
    while true do
      local ok, err, werr = pcall(w.join, w)
      if ok then
        if not err and not engine.is_cancel(werr) then st.fatal = st.fatal or werr end
        break
      end
      if engine.is_cancel(err) then
        st.stopping, st.interrupted = true, true
        for _, x in ipairs(st.workers) do x:cancel() end
      else
        error(err, 0)
      end
    end
  end
end

local function absolute(path)
  if path:sub(1, 1) == "/" then return path end
  local ok, lfs = pcall(require, "lfs")
  local cwd = ok and lfs.currentdir()
  return cwd and (cwd .. "/" .. path) or path
end

local function open_run(st, env_path, args)
  local c = st.config
  local prior = c.prior
  local dir = c.resume or (c.out .. "/" .. new_run_id(st.env.name))
  st.dir = dir:gsub("/+$", "")
  st.run_id = prior and prior.id or st.dir:match("([^/]+)$")
  local argv = json.array()             -- [] in run.json even when empty
  for _, a in ipairs(prior and prior.argv or {}) do argv[#argv + 1] = a end
  -- flags a resume inherits: not --resume itself, nor how output is shown
  local skip, PRESENTATION = false, { ["-q"] = true, ["--quiet"] = true, ["--json"] = true }
  for _, a in ipairs(args) do
    if skip then skip = false
    elseif a == "--resume" then skip = true
    elseif not a:match("^%-%-resume=") and not PRESENTATION[a] then argv[#argv + 1] = a end
  end
  st.sessions = prior and type(prior.sessions) == "table" and prior.sessions or {}
  for _, s in ipairs(st.sessions) do   -- read back from run.json: lists are arrays again
    if type(s) == "table" and type(s.argv) == "table" then s.argv = json.array(s.argv) end
  end
  st.session = { started_at = engine.now(), argv = json.array(table.move(args, 1, #args, 1, {})) }
  st.sessions[#st.sessions + 1] = st.session
  local command = { "engine", "run", env_path }
  for _, a in ipairs(args) do command[#command + 1] = a end
  local run, err = trace.open(st.dir, { id = st.run_id, command = command, argv = argv,
    env = { name = st.env.name, file = env_path, path = absolute(env_path), hash = file_hash(env_path) },
    agent = c.agent, started_at = prior and prior.started_at or st.session.started_at,
    status = "running", config = plain_config(c), sessions = st.sessions })
  if not run then return nil, err end
  st.run = run
  st.completed = run:completed()
  return true
end

local function finish_run(st)
  local status = st.fatal and "failed" or (st.interrupted and "interrupted" or "done")
  st.session.ended_at, st.session.status = engine.now(), status
  st.session.episodes = st.new_records
  st.session.sandboxes = session_usage(st)
  local meta = st.run.meta
  meta.status, meta.ended_at, meta.sessions = status, st.session.ended_at, st.sessions
  local summary = M.summary(meta, st.run:records())
  summary.run_episodes = st.new_records
  summary.wall = st.session.ended_at - st.session.started_at
  summary.sandboxes = total_usage(st.sessions)
  summary.run_dir = st.dir
  summary.model_usage = st.model_usage
  st.run:close({ status = status, ended_at = st.session.ended_at, sessions = st.sessions,
    totals = { episodes = summary.episodes, mean_reward = summary.mean_reward, stderr = summary.stderr,
      errors = summary.errors, pass_at_k = summary.pass_at_k, sandboxes = summary.sandboxes,
      model_usage = summary.model_usage } })
  return status, summary
end

local function print_summary(st, summary)
  if st.config.json then
    io.stdout:write(trace.encode(trace.plain(summary)), "\n")
  else
    io.stdout:write(report.format(summary, M.header(st.run.meta, st.dir)))
  end
  io.stdout:flush()
end

-- runner.main(env, path, args) -> exit status
function M.main(env_table, env_path, args)
  local config, err = configure(env_table, args or {})
  if not config then say("run: " .. err); return 2 end
  if config.help then io.stdout:write(envlib.help(env_table, env_path)); return 0 end
  err = check_config(config)
  if err then say("run: " .. err); return 2 end
  if config.agent == "human" then
    say("run: the human agent plays in the REPL: engine repl " .. tostring(env_path) .. " --task NAME")
    return 2
  end
  local agent
  agent, err = agents.get(config.agent, config)
  if not agent then say(err); return 2 end
  return M.execute(env_table, env_path, args or {}, config, agent)
end

-- Runs the episodes with a parsed config; returns the exit status.
function M.execute(env_table, env_path, args, config, agent)
  local st = { env = env_table, path = env_path, config = config, agent = agent, in_flight = 0, live = 0,
    usage = { created = 0, seconds = 0 }, new_records = 0, workers = {}, interrupts = 0 }
  st.progress = report.progress({ quiet = config.quiet, now = engine.monotonic })
  if not config.resume then trace.mkdirs(config.out) end   -- the run's own directory comes later
  local ok, err = pcall(item_source, st)
  if not ok then say(first_line(err)); return 1 end
  st.next_item = err
  ok, err = open_run(st, env_path, args)
  if not ok then say(err); return 1 end
  st.progress.total = st.total
  local perr
  st.pool, perr = make_pool(env_table, config)
  if perr then say(perr) end
  install_interrupt(st)
  local ticker = start_ticker(st)
  for i = 1, config.concurrency do st.workers[i] = engine.spawn(worker, st, i) end
  local jok, jerr = pcall(join_workers, st)
  engine.on_interrupt(nil)
  if ticker then ticker:cancel(); pcall(ticker.join, ticker) end
  st.progress:finish()
  if st.pool then
    local sum = session_usage(st)
    st.pool_final = sum
    pcall(st.pool.close, st.pool)
  end
  if not jok then st.fatal = st.fatal or jerr end
  if type(agent.usage) == "function" then
    local uok, u = pcall(agent.usage, agent)
    if uok and type(u) == "table" then st.model_usage = u end
  end
  local status, summary = finish_run(st)
  if st.pool_final then summary.pool = st.pool_final end
  print_summary(st, summary)
  if st.fatal then say(first_line(st.fatal)); return 1 end
  if status == "interrupted" then return 128 + (engine.signal() or 2) end
  return 0
end

-- `engine run --resume RUN_DIR [flags]`: finds the env the run used (from
-- run.json), loads it and resumes. -> exit status
function M.resume_command(argv)
  local dir = argv[1] == "--resume" and argv[2] or (argv[1] or ""):match("^%-%-resume=(.+)$")
  if not dir then say("run: --resume needs a RUN_DIR"); return 2 end
  local meta, err = trace.read(dir)
  if not meta then say(err); return 1 end
  local env = type(meta.env) == "table" and meta.env or {}
  local path = env.path or env.file
  if type(path) ~= "string" then say(dir .. "/run.json: no env file recorded"); return 1 end
  local f = io.open(path)
  if not f and env.file then path = env.file; f = io.open(path) end
  if not f then say(dir .. ": the run's env file " .. tostring(path) .. " is gone"); return 1 end
  f:close()
  local env_table, lerr = envlib.load(path)
  if not env_table then say(lerr); return 1 end
  local args = { "--resume", dir }
  for i = argv[1] == "--resume" and 3 or 2, #argv do args[#args + 1] = argv[i] end
  return M.main(env_table, path, args)
end

-- What engine.play shares with the runner: one episode's building blocks.
M.internal = {
  tasks_error = tasks_error, task_iterator = task_iterator, provision = provision, release = release,
  new_ctx = new_ctx, new_run_id = new_run_id, first_line = first_line, file_hash = file_hash,
  parse_reward = parse_reward,
}

return M
