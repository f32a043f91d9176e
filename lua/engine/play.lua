-- engine.play: playing one task of an environment by hand (engine repl
-- ENV.lua --task NAME). start() provisions the task's sandbox and runs the
-- env's setup, and returns what the REPL exposes as globals:
--
--   task       the task table
--   sb         the sandbox (stays valid across reset(); execs are traced)
--   ctx        the episode's ctx, as the env's hooks see it
--   sh(cmd)    runs cmd in the sandbox, prints its output and exit code
--   score()    runs the env's scorer now, prints and returns the reward
--   reset()    a fresh sandbox, set up again
--   play:finish()  scores the final state, stops the sandbox and records the
--              session as an episode with agent "human" in a run directory
--
-- Everything works inside or outside a task: blocking steps run in one.
local engine = require "engine"
local envlib = require "engine.env"
local trace = require "engine.trace"
local json = require "engine.json"
local runner = require "engine.runner"
local agents = require "engine.agents"

local M = {}
local R = runner.internal

-- Runs fn(...) inside a task (spawning one when called outside any).
local function in_task(fn, ...)
  if engine.current() then return fn(...) end
  local res = table.pack(engine.spawn(fn, ...):join())
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

local function fail(msg) error(envlib.error(msg), 0) end

-- Loads an env file -> env table; raises one line.
local function load_env(path)
  local env_table, err = envlib.load(path)
  if not env_table then fail(err) end
  return env_table
end

-- The task named `name` (the first one when name is nil).
local function find_task(env_table, config, name)
  local iter = R.task_iterator(env_table, config)
  local ids = {}
  while true do
    local ok, t = pcall(iter)
    if not ok then error(R.tasks_error(env_table, t), 0) end
    if t == nil then break end
    if type(t) == "table" and t.id ~= nil then
      if name == nil or tostring(t.id) == name then t.id = tostring(t.id); return t end
      if #ids < 10 then ids[#ids + 1] = tostring(t.id) end
    end
  end
  fail("env " .. env_table.name .. " has no task '" .. tostring(name) .. "' (tasks: " .. table.concat(ids, ", ") ..
    (#ids == 10 and ", ..." or "") .. ")")
end

local Play = {}
Play.__index = Play

-- Provisions a box and runs setup; the box goes into self._box.
function Play:_bring_up()
  local ctx = self.ctx
  local r = runner.run_phase(ctx.timeouts.provision, R.provision, self._st, ctx)
  if r.late_values then R.release(self._st, r.late_values[1], true, "provision timed out") end
  if not r.ok then fail("provision: " .. (r.timeout and "timed out" or R.first_line(r.err))) end
  self._box = r.values[1]
  ctx.sandbox = runner.traced_sandbox(self._box.sb, ctx.trace)
  ctx.trace:event("sandbox", self._box.runtime)
  if self.env.setup then
    r = runner.run_phase(ctx.timeouts.setup, self.env.setup, ctx)
    if not r.ok then fail("setup: " .. (r.timeout and "timed out" or R.first_line(r.err))) end
  end
end

function Play:_bring_down(broken)
  if self._box then R.release(self._st, self._box, broken) end
  self._box = nil
end

-- A sandbox handle that always means the current box (reset() swaps it).
local function stable_sandbox(play)
  local handle = {}
  return setmetatable(handle, { __index = function(_, k)
    local cur = play.ctx.sandbox
    if not cur then error("play: no sandbox (finished?)", 2) end
    local v = cur[k]
    if type(v) ~= "function" then return v end
    return function(self, ...)
      if self == handle then return v(cur, ...) end
      return v(self, ...)
    end
  end })
end

-- play.start(env_path, {task = NAME, out = DIR, args = {...}, print = fn}) -> play
function M.start(env_path, opts)
  opts = opts or {}
  local env_table = type(env_path) == "table" and env_path or load_env(env_path)
  local path = type(env_path) == "string" and env_path or env_table.source
  local config, err = envlib.parse_flags(opts.args or {}, env_table)
  if not config then fail(err) end
  config.agent, config.out = "human", opts.out or config.out
  local task = find_task(env_table, config, opts.task)
  local self = setmetatable({ env = env_table, task = task, _config = config, _out = opts.print or print }, Play)
  local run_id = R.new_run_id(env_table.name)
  local dir = config.out .. "/" .. run_id
  local hash = runner.hash_value(task)
  local run, terr = trace.open(dir, { id = run_id, command = { "engine", "repl", path, "--task", task.id },
    argv = json.array(), env = { name = env_table.name, file = path, hash = R.file_hash(path) }, agent = "human",
    started_at = engine.now(), status = "running", config = { rollouts = 1 } })
  if not run then fail(terr) end
  self._run, self.run_dir, self._started = run, dir, engine.now()
  local ep = run:episode({ key = task.id .. ":0:" .. hash, id = task.id .. ".human", task = task.id,
    task_hash = hash, rollout = 0, agent = "human" })
  ep:event("task", { id = task.id, prompt = task.prompt })
  self._st = { env = env_table, path = path, config = config, run_id = run_id, dir = dir,
    usage = { created = 0, seconds = 0 }, agent = agents.get("human") }
  self.ctx = R.new_ctx(self._st, { task = task, rollout = 0, worker = 1 }, ep, 1)
  self.ctx.play = true
  local ok, berr = pcall(in_task, self._bring_up, self)
  if not ok then
    self:_bring_down(true)
    ep:abandon("failed to start")
    run:close({ status = "failed", ended_at = engine.now() })
    error(berr, 0)
  end
  self.sb = stable_sandbox(self)
  self.sh = function(cmd, o) return self:_sh(cmd, o) end
  self.score = function() return (self:_score()) end
  self.reset = function() return self:_reset() end
  if task.prompt then self._out("task " .. task.id .. ": " .. task.prompt) end
  return self
end

-- sh(cmd): prints stdout, stderr and "[exit N]"; returns nothing (use
-- sb:exec for the result table).
function Play:_sh(cmd, o)
  if self._finished then error("play: session finished", 2) end
  local r = in_task(function()
    return self.ctx.sandbox:exec(cmd, { timeout = (o and o.timeout) or self._config.command_timeout or 600 })
  end)
  if type(r) ~= "table" then self._out("error: " .. tostring(r)); return end
  if r.stdout and r.stdout ~= "" then self._out((r.stdout:gsub("\n$", ""))) end
  if r.stderr and r.stderr ~= "" then self._out((r.stderr:gsub("\n$", ""))) end
  self._out(string.format("[exit %s%s]", tostring(r.code), r.timed_out and ", timed out" or ""))
end

-- Runs the scorer -> reward, rewards (and prints them); nil, err on failure.
function Play:_score(quiet)
  if self._finished then error("play: session finished", 2) end
  local ctx = self.ctx
  local r = in_task(runner.run_phase, ctx.timeouts.score, self.env.score, ctx)
  local v, rewards, msg
  if r.ok then
    v, rewards = R.parse_reward(r.values[1], r.values[2])
    if v == nil then msg = rewards end
  else
    msg = r.timeout and "score timed out" or R.first_line(r.err)
  end
  if msg then
    ctx.trace:event("error", { kind = "score_error", phase = "score", message = msg })
    if not quiet then self._out("score failed: " .. msg) end
    return nil, msg
  end
  ctx.trace:event("score", { reward = v, rewards = rewards, detail = r.values[2] })
  self.last_reward, self.last_rewards = v, rewards
  if not quiet then
    local parts = {}
    for k, x in pairs(rewards or {}) do parts[#parts + 1] = k .. "=" .. tostring(x) end
    table.sort(parts)
    self._out("reward " .. tostring(v) .. (#parts > 0 and (" (" .. table.concat(parts, ", ") .. ")") or ""))
  end
  return v, rewards
end

-- reset(): stops the box and brings up a fresh one, set up again.
function Play:_reset()
  if self._finished then error("play: session finished", 2) end
  self.ctx.trace:event("reset", {})
  self._resets = (self._resets or 0) + 1
  self:_bring_down(false)
  in_task(self._bring_up, self)
  self._out("fresh sandbox " .. tostring(self._box and self._box.runtime.id))
end

-- play:finish() -> record: scores the final state, stops the sandbox,
-- writes the episode and closes the run. Idempotent.
function Play:finish()
  if self._finished then return self._record end
  local reward, rewards = nil, nil
  if self._box then reward, rewards = self:_score(true) end
  local err
  local runtime = self._box and self._box.runtime or nil
  if self._box and reward == nil then err = { kind = "score_error", message = "final score failed" } end
  in_task(self._bring_down, self, false)
  self._finished = true
  self.ctx.sandbox = nil
  self._record = self.ctx.trace:finish({ reward = reward, rewards = rewards, status = err and "error" or "ok",
    error = err, attempt = 1, agent = "human", resets = self._resets, started_at = self._started,
    ended_at = engine.now(), duration = engine.now() - self._started,
    runtime = runtime })
  self._run:close({ status = "done", ended_at = engine.now(),
    sessions = { { started_at = self._started, ended_at = engine.now(), status = "done", episodes = 1,
      sandboxes = self._st.usage } } })
  self._out("session recorded in " .. self.run_dir)
  return self._record
end

return M
