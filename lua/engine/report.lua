-- engine.report: the summary of a run's episodes, and the progress display.
--
--   report.summarize(records, opts) -> summary table (what --json prints)
--   report.format(summary) -> text
--   report.pass_at_k(n, c, k) -> unbiased estimate
--   report.progress{total=, quiet=, tty=, out=} -> p; p:start(), p:episode(rec),
--     p:running(n), p:finish()
local json = require "engine.json"

local M = {}

M.ERROR_KINDS = { "env_error", "infra_error", "agent_error", "timeout", "score_error" }

-- Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), computed as
-- a product so it never overflows.
function M.pass_at_k(n, c, k)
  if k > n then return nil end
  if n - c < k then return 1.0 end
  local p = 1.0
  for i = n - c + 1, n do p = p * (1 - k / i) end
  return 1 - p
end

local function quantile(sorted, q)
  local n = #sorted
  if n == 0 then return nil end
  local pos = q * (n - 1) + 1
  local lo = math.floor(pos)
  local hi = math.min(lo + 1, n)
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo)
end

local function mean_stderr(xs)
  local n = #xs
  if n == 0 then return nil, nil end
  local s = 0
  for _, x in ipairs(xs) do s = s + x end
  local mean = s / n
  if n < 2 then return mean, 0 end
  local v = 0
  for _, x in ipairs(xs) do v = v + (x - mean) ^ 2 end
  return mean, math.sqrt(v / (n - 1) / n)
end

-- Per task: n episodes, c with reward 1. Errors count as failures.
local function pass_table(records, max_k)
  local tasks, order = {}, {}
  for _, r in ipairs(records) do
    local k = tostring(r.task) .. "#" .. tostring(r.task_hash)
    if not tasks[k] then tasks[k] = { n = 0, c = 0 }; order[#order + 1] = k end
    tasks[k].n = tasks[k].n + 1
    if r.reward == 1 then tasks[k].c = tasks[k].c + 1 end
  end
  local out, k = json.array(), 1
  while k <= max_k do
    local s, m = 0, 0
    for _, key in ipairs(order) do
      local p = M.pass_at_k(tasks[key].n, tasks[key].c, k)
      if p then s, m = s + p, m + 1 end
    end
    if m > 0 then out[#out + 1] = { k = k, value = s / m, tasks = m } end
    k = k * 2
  end
  return out, #order
end

local function is_binary(records)
  for _, r in ipairs(records) do
    if r.reward ~= nil and r.reward ~= 0 and r.reward ~= 1 then return false end
  end
  return true
end

local function phase_stats(records)
  local out = json.array()
  for _, phase in ipairs({ "provision", "setup", "agent", "score", "cleanup" }) do
    local xs = {}
    for _, r in ipairs(records) do
      local d = type(r.phases) == "table" and r.phases[phase]
      if type(d) == "number" then xs[#xs + 1] = d end
    end
    table.sort(xs)
    if #xs > 0 then out[#out + 1] = { phase = phase, p50 = quantile(xs, 0.5), p95 = quantile(xs, 0.95), n = #xs } end
  end
  return out
end

-- summarize(records, opts) -> summary. opts: rollouts (the largest k for
-- pass@k), sandboxes ({created, reused, seconds, ...}), wall (seconds), status.
function M.summarize(records, opts)
  opts = opts or {}
  local rewards, errors, scored = {}, {}, 0
  local max_rollout = 0
  for _, r in ipairs(records) do
    local x = type(r.reward) == "number" and r.reward or 0
    if type(r.reward) == "number" then scored = scored + 1 end
    rewards[#rewards + 1] = x
    if type(r.error) == "table" and r.error.kind then
      errors[r.error.kind] = (errors[r.error.kind] or 0) + 1
    end
    if type(r.rollout) == "number" and r.rollout + 1 > max_rollout then max_rollout = r.rollout + 1 end
  end
  local mean, se = mean_stderr(rewards)
  local s = { episodes = #records, scored = scored, mean_reward = mean, stderr = se,
    errors = errors, phases = phase_stats(records), sandboxes = opts.sandboxes,
    wall = opts.wall, status = opts.status, binary = is_binary(records) }
  local n_err = 0
  for _, v in pairs(errors) do n_err = n_err + v end
  s.error_count = n_err
  if s.binary and #records > 0 then
    s.pass_at_k, s.tasks = pass_table(records, opts.rollouts or max_rollout)
  else
    local _, ntasks = pass_table(records, 0)
    s.tasks = ntasks
  end
  return s
end

local function fmt_num(x, digits)
  if x == nil then return "-" end
  return string.format("%." .. (digits or 3) .. "f", x)
end

local function fmt_dur(x)
  if x == nil then return "-" end
  if x < 1 then return string.format("%.0fms", x * 1000) end
  if x < 120 then return string.format("%.2fs", x) end
  return string.format("%.1fm", x / 60)
end
M.fmt_dur = fmt_dur

-- 1536 -> "1.5K" (B, K, M, G, T; whole bytes under 1K); nil -> "-".
function M.human_bytes(bytes)
  if not bytes then return "-" end
  local units, i = { "B", "K", "M", "G", "T" }, 1
  while bytes >= 1024 and i < #units do bytes, i = bytes / 1024, i + 1 end
  return i == 1 and string.format("%d%s", bytes, units[i]) or string.format("%.1f%s", bytes, units[i])
end

-- format(summary, header) -> the text summary.
function M.format(s, header)
  local out = {}
  local function add(...) out[#out + 1] = table.concat({ ... }) end
  if header then add(header) end
  add("episodes     ", s.episodes, " (", s.tasks or 0, " tasks, ", s.scored, " scored)",
    s.status and s.status ~= "done" and ("  [" .. s.status .. "]") or "")
  add("mean reward  ", fmt_num(s.mean_reward), " ± ", fmt_num(s.stderr), " (stderr; errors count as 0)")
  if s.pass_at_k and #s.pass_at_k > 0 then
    local parts = {}
    for _, p in ipairs(s.pass_at_k) do parts[#parts + 1] = "pass@" .. p.k .. " " .. fmt_num(p.value) end
    add("pass@k       ", table.concat(parts, "  "))
  end
  if s.error_count > 0 then
    local parts = {}
    for _, k in ipairs(M.ERROR_KINDS) do
      if s.errors[k] then parts[#parts + 1] = k .. " " .. s.errors[k] end
    end
    for k, v in pairs(s.errors) do
      local known = false
      for _, e in ipairs(M.ERROR_KINDS) do known = known or e == k end
      if not known then parts[#parts + 1] = k .. " " .. v end
    end
    add("errors       ", s.error_count, ": ", table.concat(parts, ", "))
  else
    add("errors       0")
  end
  if #s.phases > 0 then
    local parts = {}
    for _, p in ipairs(s.phases) do parts[#parts + 1] = p.phase .. " " .. fmt_dur(p.p50) .. "/" .. fmt_dur(p.p95) end
    add("phases p50/p95  ", table.concat(parts, "  "))
  end
  local sb = s.sandboxes
  if sb then
    add("sandboxes    created ", string.format("%d", sb.created or 0), ", reused ", string.format("%d", sb.reused or 0),
      ", sandbox-seconds ", fmt_num(sb.seconds or 0, 1))
  end
  local mu = s.model_usage
  if type(mu) == "table" and (mu.calls or 0) > 0 then
    add(string.format("model        %d calls, %d tokens in, %d out%s", mu.calls or 0, mu.input_tokens or 0,
      mu.output_tokens or 0, (mu.cost or 0) > 0 and string.format(", $%.4f", mu.cost) or ""))
  end
  if s.wall then
    add("wall         ", fmt_dur(s.wall), s.wall > 0 and string.format(" (%.1f episodes/s)", (s.run_episodes or s.episodes) / s.wall) or "")
  end
  return table.concat(out, "\n") .. "\n"
end

-- ---- progress ------------------------------------------------------------------

local Progress = {}
Progress.__index = Progress

local function isatty(f)
  if io.type(f) ~= "file" then return false end
  local ok, term = pcall(require, "term")
  return ok and term.isatty and term.isatty(f) or false
end

-- progress{total, quiet, tty, out, done, now}: `done` counts episodes finished
-- before (resume); `now` is the clock.
function M.progress(opts)
  local out = opts.out or io.stderr
  local tty = opts.tty
  if tty == nil then tty = isatty(out) end
  return setmetatable({ total = opts.total, quiet = opts.quiet, tty = tty, out = out,
    done = opts.done or 0, new = 0, errors = 0, reward_sum = 0, in_flight = 0,
    now = opts.now or os.time, t0 = (opts.now or os.time)() }, Progress)
end

function Progress:line()
  local elapsed = self.now() - self.t0
  local rate = elapsed > 0 and self.new / elapsed or 0
  local total = self.total and tostring(self.total) or "?"
  local mean = self.new > 0 and self.reward_sum / self.new or nil
  local eta = "-"
  if self.total and rate > 0 then
    local left = math.max(self.total - self.done, 0) / rate
    eta = string.format("%d:%02d", left // 60, math.floor(left % 60))
  end
  return string.format("%d/%s done, %d running, %d errors, mean %s, %.1f/s, ETA %s",
    self.done, total, self.in_flight, self.errors, mean and string.format("%.3f", mean) or "-", rate, eta)
end

function Progress:draw()
  if self.quiet or not self.tty then return end
  self.last_draw = self.now()
  self.out:write("\r\27[K", self:line())
  self.out:flush()
end

function Progress:running(n)
  self.in_flight = n
end

-- One finished episode: a line off a TTY, a redraw on one.
function Progress:episode(rec)
  self.done = self.done + 1
  self.new = self.new + 1
  if type(rec.reward) == "number" then self.reward_sum = self.reward_sum + rec.reward end
  if rec.error then self.errors = self.errors + 1 end
  if self.quiet then return end
  if self.tty then
    if self.done == self.total or self.now() - (self.last_draw or -1) >= 0.1 then self:draw() end
    return
  end
  local err = rec.error and (" " .. tostring(rec.error.kind) .. ": " .. tostring(rec.error.message)) or ""
  self.out:write(string.format("[%d/%s] %s reward=%s %s %s%s\n", self.done, self.total or "?",
    rec.id, rec.reward == nil and "-" or string.format("%.4g", rec.reward), rec.status or "?",
    fmt_dur(rec.duration), err))
  self.out:flush()
end

-- A message that must not be overdrawn by the live line.
function Progress:say(msg)
  if self.quiet then return end
  if self.tty then self.out:write("\r\27[K") end
  self.out:write(msg, "\n")
  self:draw()
end

function Progress:finish()
  if self.quiet or not self.tty then return end
  self.out:write("\r\27[K")
  self.out:flush()
end

return M
