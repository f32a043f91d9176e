-- envs/tbench2.lua: Terminal-Bench 2 tasks as an environment.
--
--   engine run envs/tbench2.lua --tasks DIR [--agent oracle] [-t PATTERN]
--
-- Reads task directories exactly as published (task.toml, instruction.md,
-- environment/Dockerfile, tests/, solution/) and scores an episode the way
-- the official harness does: `bash /tests/test.sh` from the workdir writes
-- /logs/verifier/reward.json or reward.txt.
--
-- What it guarantees beyond the official harness:
-- * tests/ and solution/ never enter the sandbox before the verify window:
--   the image is built from environment/ only, tests/ is read into memory when
--   the episode starts (a symlinked tests/ is read through to real files), and
--   solution/ is uploaded for the oracle's solve step only, then removed;
-- * the verify window starts from scratch: /tests and /logs/verifier are
--   removed (a symlink as a link, never followed), the pristine in-memory
--   tests are staged, and both are removed again after scoring on every path
--   (success, error, timeout, cancellation);
-- * scoring on one box is serialised by a lock, and `--verify fresh` scores in
--   a second sandbox holding the agent's final files but none of its processes;
-- * the agent sees the box through a view whose commands are bounded by
--   --command-timeout (TB2_COMMAND_TIMEOUT_S, default 180 s) and run in the
--   workdir, with no file transfers to or from host paths.
--
-- Flags (beyond the runner's): --tasks DIR, --verifier test.sh|pytest,
-- --verify same|fresh, --workdir PATH, --network none|host. Task timeouts
-- ([agent], [verifier], build) become the runner's phase bounds and scale
-- with --timeout-multiplier. The score detail names the verifier, the verify
-- mode, the reward.json keys and the error kind (reward_file_missing,
-- reward_file_empty, reward_parse_error, verifier_timeout) when there is one.
local engine = require "engine"
local env = require "engine.env"
local json = require "engine.json"
local sync = require "engine.sync"
local toml = require "engine.toml"
local lfs = require "lfs"

local M = {}

M.DEFAULT_VERIFIER_TIMEOUT = 600
M.DEFAULT_BUILD_TIMEOUT = 600
M.DEFAULT_COMMAND_TIMEOUT = 180
M.NO_AGENT_TIMEOUT = 7 * 24 * 3600       -- "[agent] timeout_sec" absent: no limit
M.PROVISION_MARGIN = 60
M.SCORE_MARGIN = 60
M.MAX_TESTS_BYTES = 256 * 1024 * 1024   -- a tests/ tree larger than this is refused
M.MAX_REWARD_BYTES = 1024 * 1024
M.TRACE_FILES = { "test-stdout.txt", "reward.json", "reward.txt", "ctrf.json" }

local TESTS, LOGS, VERIFIER_LOGS, SOLUTION = "/tests", "/logs", "/logs/verifier", "/solution"

-- ---------------------------------------------------------------------------
-- Small helpers
-- ---------------------------------------------------------------------------

-- A to-be-closed value that calls fn(err) when its scope ends, on any path.
local function defer(fn)
  return setmetatable({}, { __close = function(_, err) fn(err) end })
end

local function is_dir(path)
  return lfs.attributes(path, "mode") == "directory"
end

local function is_file(path)
  return lfs.attributes(path, "mode") == "file"
end

-- Absolute, normalised host path (no "." or ".." components, no trailing /).
local function abspath(path)
  if path:sub(1, 1) ~= "/" then path = lfs.currentdir() .. "/" .. path end
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." then parts[#parts] = nil
    elseif part ~= "." then parts[#parts + 1] = part end
  end
  return "/" .. table.concat(parts, "/")
end

local function basename(path)
  return path:match("([^/]+)/*$") or path
end

local function read_host_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local data = f:read("a")
  f:close()
  return data
end

local function copy(t)
  local out = {}
  for k, v in pairs(t or {}) do out[k] = v end
  return out
end

local function merge(a, b)
  local out = copy(a)
  for k, v in pairs(b or {}) do out[k] = v end
  return out
end

-- ---------------------------------------------------------------------------
-- task.toml
-- ---------------------------------------------------------------------------

-- Sizes as written in task.toml: "2G", "512M", "1.5G", "2048" (MB), 2048.
-- Returns megabytes, or nil when the text is not a size.
function M.parse_size_mb(v)
  if math.type(v) == "integer" or math.type(v) == "float" then
    return v > 0 and v or nil
  end
  if type(v) ~= "string" then return nil end
  local num, unit = v:upper():match("^%s*(%d+%.?%d*)%s*([KMGT]?)I?B?%s*$")
  num = tonumber(num)
  if not num or num <= 0 then return nil end
  local scale = { [""] = 1, K = 1 / 1024, M = 1, G = 1024, T = 1024 * 1024 }
  return num * scale[unit]
end

-- Field checks: each returns the value or raises one line naming file and field.
local function field_error(file, field, msg)
  error({ tb2 = true, message = string.format("%s: %s: %s", file, field, msg) }, 0)
end

local function opt_table(file, t, key, name)
  local v = t[key]
  if v == nil then return {} end
  if type(v) ~= "table" or toml.is_array(v) then field_error(file, name, "expected a table") end
  return v
end

local function opt_number(file, t, key, name, positive)
  local v = t[key]
  if v == nil then return nil end
  if type(v) ~= "number" then field_error(file, name, "expected a number, got " .. type(v)) end
  if positive and not (v > 0) then field_error(file, name, "must be greater than 0") end
  return v
end

local function opt_bool(file, t, key, name)
  local v = t[key]
  if v == nil then return nil end
  if type(v) ~= "boolean" then field_error(file, name, "expected true or false") end
  return v
end

local function opt_string(file, t, key, name)
  local v = t[key]
  if v == nil then return nil end
  if type(v) ~= "string" then field_error(file, name, "expected a string") end
  return v
end

-- An env table: string keys, string (or number/bool, stringified) values.
local function env_table(file, t, key, name)
  local out = {}
  for k, v in pairs(opt_table(file, t, key, name)) do
    local tv = type(v)
    if tv ~= "string" and tv ~= "number" and tv ~= "boolean" then
      field_error(file, name .. "." .. k, "expected a string")
    end
    if not tostring(k):match("^[%a_][%w_]*$") then
      field_error(file, name .. "." .. k, "not a valid variable name")
    end
    out[k] = tostring(v)
  end
  return out
end

-- memory = "2G" (2.0 release) or memory_mb = 2048 (later revisions).
local function size_field(file, envt, key)
  local mb_key = key .. "_mb"
  if envt[mb_key] ~= nil then
    local v = opt_number(file, envt, mb_key, "[environment] " .. mb_key, true)
    return v
  end
  if envt[key] == nil then return nil end
  local mb = M.parse_size_mb(envt[key])
  if not mb then
    field_error(file, "[environment] " .. key, "expected a size like \"2G\" or \"512M\"")
  end
  return mb
end

-- Reads and checks a task.toml; returns the normalised config or raises.
local function read_config(file)
  local doc, err = toml.read(file)
  if not doc then error({ tb2 = true, message = err }, 0) end
  local verifier = opt_table(file, doc, "verifier", "[verifier]")
  local agent = opt_table(file, doc, "agent", "[agent]")
  local envt = opt_table(file, doc, "environment", "[environment]")
  local solution = opt_table(file, doc, "solution", "[solution]")
  local version = doc.version or doc.schema_version
  if version ~= nil and type(version) ~= "string" and type(version) ~= "number" then
    field_error(file, doc.version and "version" or "schema_version", "expected a string")
  end
  return {
    version = version and tostring(version),
    metadata = opt_table(file, doc, "metadata", "[metadata]"),
    verifier_timeout = opt_number(file, verifier, "timeout_sec", "[verifier] timeout_sec", true)
      or M.DEFAULT_VERIFIER_TIMEOUT,
    agent_timeout = opt_number(file, agent, "timeout_sec", "[agent] timeout_sec", true),
    build_timeout = opt_number(file, envt, "build_timeout_sec",
      "[environment] build_timeout_sec", true) or M.DEFAULT_BUILD_TIMEOUT,
    docker_image = opt_string(file, envt, "docker_image", "[environment] docker_image"),
    cpus = opt_number(file, envt, "cpus", "[environment] cpus", true),
    memory_mb = size_field(file, envt, "memory"),
    storage_mb = size_field(file, envt, "storage"),
    allow_internet = opt_bool(file, envt, "allow_internet", "[environment] allow_internet"),
    verifier_env = env_table(file, verifier, "env", "[verifier.env]"),
    environment_env = env_table(file, envt, "env", "[environment.env]"),
    solution_env = env_table(file, solution, "env", "[solution.env]"),
  }
end

-- The final WORKDIR of a Dockerfile (relative ones joined), or nil.
function M.dockerfile_workdir(path)
  local text = read_host_file(path)
  if not text then return nil end
  text = text:gsub("\\\r?\n", " ")
  local wd
  for line in text:gmatch("[^\n]+") do
    local dir = line:match("^%s*[Ww][Oo][Rr][Kk][Dd][Ii][Rr]%s+(.-)%s*$")
    if dir then
      dir = dir:gsub('^"(.*)"$', "%1")
      if dir:sub(1, 1) ~= "/" then dir = (wd or "/") .. "/" .. dir end
      wd = dir:gsub("//+", "/")
    end
  end
  return wd
end

-- Loads one task directory: returns the task table, or nil and one line.
function M.load_task(dir)
  dir = abspath(dir)
  local ok, res = pcall(function()
    local file = dir .. "/task.toml"
    local cfg = read_config(file)
    local instruction, err = read_host_file(dir .. "/instruction.md")
    if not instruction then field_error(dir, "instruction.md", err or "missing") end
    local dockerfile = dir .. "/environment/Dockerfile"
    if not is_file(dockerfile) then field_error(dir, "environment/Dockerfile", "missing") end
    if not is_dir(dir .. "/tests") then field_error(dir, "tests/", "missing") end
    return {
      id = basename(dir),
      dir = dir,
      prompt = instruction,
      instruction = instruction,
      config = cfg,
      dockerfile = dockerfile,
      workdir = M.dockerfile_workdir(dockerfile),
      has_solution = is_file(dir .. "/solution/solve.sh"),
      -- The runner's phase bounds: the build happens while provisioning; the
      -- score phase is the verifier's own timeout plus staging and reading.
      timeouts = { provision = cfg.build_timeout + M.PROVISION_MARGIN,
                   agent = cfg.agent_timeout or M.NO_AGENT_TIMEOUT,
                   score = cfg.verifier_timeout + M.SCORE_MARGIN },
    }
  end)
  if ok then return res end
  if type(res) == "table" and res.tb2 then return nil, res.message end
  error(res, 0)
end

-- Every task under `path`: the directory itself when it holds task.toml,
-- else each subdirectory that does, sorted by name. Raises one clear line.
function M.discover(path)
  if not is_dir(path) then error(path .. ": not a directory (--tasks)", 0) end
  if is_file(path .. "/task.toml") then
    local t, err = M.load_task(path)
    if not t then error(err, 0) end
    return { t }
  end
  local names = {}
  for name in lfs.dir(path) do
    if name:sub(1, 1) ~= "." and is_file(path .. "/" .. name .. "/task.toml") then
      names[#names + 1] = name
    end
  end
  table.sort(names)
  if #names == 0 then error(path .. ": no task directories (no */task.toml)", 0) end
  local tasks = {}
  for i, name in ipairs(names) do
    local t, err = M.load_task(path .. "/" .. name)
    if not t then error(err, 0) end
    tasks[i] = t
  end
  return tasks
end

-- ---------------------------------------------------------------------------
-- Withholding: tests/ in memory
-- ---------------------------------------------------------------------------

-- Reads the tree at `dir` into memory, following symlinks to the real files
-- (a symlink loop or a tree over MAX_TESTS_BYTES raises). Returns
-- {dirs = {rel...}, files = {{path = rel, data = bytes, mode = n}...}}.
function M.read_tree(dir)
  local tree, total, seen = { dirs = {}, files = {} }, 0, {}
  local function walk(host, rel, depth)
    local attr = lfs.attributes(host)
    if not attr then error(host .. ": dangling symlink in tests/", 0) end
    if attr.mode == "directory" then
      local key = attr.dev .. ":" .. attr.ino
      if seen[key] or depth > 64 then error(host .. ": symlink loop in tests/", 0) end
      seen[key] = true
      if rel ~= "" then tree.dirs[#tree.dirs + 1] = rel end
      local names = {}
      for name in lfs.dir(host) do
        if name ~= "." and name ~= ".." then names[#names + 1] = name end
      end
      table.sort(names)
      for _, name in ipairs(names) do
        walk(host .. "/" .. name, rel == "" and name or rel .. "/" .. name, depth + 1)
      end
      seen[key] = nil
    elseif attr.mode == "file" then
      local data = assert(read_host_file(host))
      total = total + #data
      if total > M.MAX_TESTS_BYTES then error(dir .. ": tests/ is too large", 0) end
      local exec = attr.permissions:match("x") and 493 or 420   -- 0755 / 0644
      tree.files[#tree.files + 1] = { path = rel, data = data, mode = exec }
    end
  end
  walk(dir, "", 0)
  return tree
end

-- ---------------------------------------------------------------------------
-- The sandbox side
-- ---------------------------------------------------------------------------

local box_locks = setmetatable({}, { __mode = "k" })

-- The lock that serialises evaluation on one box (keyed by the box itself,
-- not by the runner's per-episode traced view of it).
function M.box_lock(sb)
  local key = type(sb) == "table" and rawget(sb, "raw") or sb
  local m = box_locks[key]
  if not m then
    m = sync.mutex()
    box_locks[key] = m
  end
  return m
end

-- Raises when a sandbox file operation returned nil, message.
local function must(what, a, b)
  if a == nil and b ~= nil then error(what .. ": " .. tostring(b), 0) end
  return a
end

-- What is at `path` itself, a symlink not followed: "d", "f", "l", "o" or nil.
local function kind_at(sb, path)
  local st = sb:stat(path)
  return st and st.type
end

-- Removes `path` inside the sandbox without following a symlink at it
-- (the sandbox removes a link as a link, and recurses without following).
-- Returns true, or nil and a message when something is still there.
local function remove_path(sb, path)
  local _, err = sb:remove(path, { recursive = true })
  if kind_at(sb, path) then return nil, path .. ": cannot remove (" .. tostring(err) .. ")" end
  return true
end

-- Makes /logs a real directory: a symlink (or file) the agent put there is
-- removed as such, so nothing below is ever created through it.
local function real_logs_dir(sb)
  local k = kind_at(sb, LOGS)
  if k == "d" then return end
  if k then assert(remove_path(sb, LOGS)) end
  must("mkdir " .. LOGS, sb:mkdir(LOGS))
end

-- Clears the verify window's fixed paths: /logs is made a real directory,
-- /tests and /logs/verifier are removed (links as links, never followed).
-- Raises when the sandbox cannot do it.
function M.clear_window(sb)
  assert(remove_path(sb, TESTS))
  real_logs_dir(sb)
  assert(remove_path(sb, VERIFIER_LOGS))
end

-- Best-effort clear for cleanup paths: never raises.
local function clear_quietly(sb)
  if sb and sb:alive() then pcall(M.clear_window, sb) end
end

-- Stages the in-memory tests at /tests and creates an empty /logs/verifier.
-- Expects a cleared window (clear_window just before, under the box lock).
function M.stage(sb, tree)
  local function mkdir(p) must("mkdir " .. p, sb:mkdir(p, { parents = false })) end
  mkdir(VERIFIER_LOGS)
  mkdir(TESTS)
  for _, d in ipairs(tree.dirs) do mkdir(TESTS .. "/" .. d) end
  for _, f in ipairs(tree.files) do
    must("write /tests/" .. f.path, sb:write(TESTS .. "/" .. f.path, f.data, f.mode))
  end
end

-- ---------------------------------------------------------------------------
-- Rewards
-- ---------------------------------------------------------------------------

-- reward.json: a flat map of names to numbers. Returns reward, map or nil, kind.
function M.parse_reward_json(data)
  if data:match("^%s*$") then return nil, "reward_file_empty" end
  local v = json.safe_decode(data)
  if type(v) ~= "table" or next(v) == nil or #v > 0 then return nil, "reward_parse_error" end
  local sum, n = 0, 0
  for k, x in pairs(v) do
    if type(k) ~= "string" or type(x) ~= "number" or x ~= x then
      return nil, "reward_parse_error"
    end
    sum, n = sum + x, n + 1
  end
  return v.reward or sum / n, v
end

-- reward.txt: one number. Returns reward or nil, kind.
function M.parse_reward_txt(data)
  if data:match("^%s*$") then return nil, "reward_file_empty" end
  local v = tonumber(data:match("^%s*(.-)%s*$"))
  if not v or v ~= v then return nil, "reward_parse_error" end
  return v
end

-- Reads a file from the sandbox, or nil when it is missing.
local function read_box(sb, path)
  local data = sb:read(path)
  if data and #data > M.MAX_REWARD_BYTES then data = data:sub(1, M.MAX_REWARD_BYTES) end
  return data
end

-- Reads /logs/verifier and turns it into (reward, detail).
local function collect(sb, files)
  for _, name in ipairs(M.TRACE_FILES) do
    local ok, data = pcall(read_box, sb, VERIFIER_LOGS .. "/" .. name)
    if ok then files[name] = data end
  end
  local reward, rewards, kind
  if files["reward.json"] then
    reward, rewards = M.parse_reward_json(files["reward.json"])
    if not reward then kind = rewards; rewards = nil end
  elseif files["reward.txt"] then
    reward, kind = M.parse_reward_txt(files["reward.txt"])
  else
    kind = "reward_file_missing"
  end
  return reward, rewards, kind
end

-- ---------------------------------------------------------------------------
-- Episode state, tracing
-- ---------------------------------------------------------------------------

local function config_of(ctx)
  return ctx.config or {}
end

local function multiplier(config)
  return tonumber(config.timeout_multiplier) or 1
end

local function trace_event(ctx, kind, data)
  local tr = ctx.trace
  if tr and tr.event then pcall(tr.event, tr, kind, data) end
end

-- Keeps the verifier's files in the episode's trace directory.
local function save_files(ctx, files)
  local tr = ctx.trace
  if not (tr and tr.save) then return end
  for _, name in ipairs(M.TRACE_FILES) do
    if files[name] then pcall(tr.save, tr, name, files[name]) end
  end
end

-- The episode's state: task, pristine tests, workdir. Created at reset.
local function state(ctx)
  local st = ctx.tb2
  if not st then
    st = { task = ctx.task }
    ctx.tb2 = st
  end
  return st
end

local function workdir_of(ctx)
  local cfg = config_of(ctx)
  if cfg.workdir then return cfg.workdir end
  local sb = ctx.sandbox
  local info = sb and sb.info
  local wd = info and (info.workdir or (info.spec and info.spec.workdir))
  return wd or ctx.task.workdir or "/"
end

-- ---------------------------------------------------------------------------
-- The env hooks
-- ---------------------------------------------------------------------------

local function tasks_dir(opts)
  return opts.tasks or (engine.root and engine.root .. "/examples/tbench2") or "examples/tbench2"
end

local CHOICES = { verifier = { ["test.sh"] = true, pytest = true },
                  verify = { same = true, fresh = true }, network = { none = true, host = true } }

-- Checks the env's flags once, before any episode: one line per mistake.
local function check_options(opts)
  if opts.pool then
    error("--pool: tbench2 episodes each need a box of their own (a reused box keeps the last agent's files)", 0)
  end
  for key, allowed in pairs(CHOICES) do
    local v = opts[key]
    if v ~= nil and not allowed[v] then
      local names = {}
      for name in pairs(allowed) do names[#names + 1] = name end
      table.sort(names)
      error(string.format("--%s: expected %s, got '%s'", key, table.concat(names, " or "), tostring(v)), 0)
    end
  end
end

function M.tasks(opts)
  opts = opts or {}
  check_options(opts)
  return M.discover(tasks_dir(opts))
end

local function random_hex(n)
  local f = assert(io.open("/dev/urandom", "rb"))
  local b = f:read(n)
  f:close()
  return (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- Where agent upper layers live: hidden from every sandbox (not in the
-- host allow-list), on a real filesystem.
function M.upper_root()
  return (os.getenv("ENGINE_STATE_DIR") or "/var/lib/engine") .. "/tbench2-upper"
end

-- Removes the agents' upper layers (<engine pid>-<hex>, and .work) that an
-- engine killed before its cleanup left behind; once per engine.
local swept = false
function M.sweep_uppers()
  if swept then return end
  swept = true
  local core = require "engine.sandbox.core"
  local alive = require("engine.sandbox").engine_alive
  for _, name in ipairs(core.host_list(M.upper_root()) or {}) do
    local pid = tonumber(name:match("^(%d+)%-%x+$") or name:match("^(%d+)%-%x+%.work$"))
    if pid and not alive(pid) then core.host_rmtree(M.upper_root() .. "/" .. name) end
  end
end

-- The task's image: its [environment] docker_image when the user mapped that
-- name to a local base (image.map, ENGINE_IMAGE_MAP: e.g. an imported
-- `docker save` archive), else a build of environment/Dockerfile with
-- environment/ as the only context.
function M.image_of(task, config)
  local cfg = task.config
  local name = cfg.docker_image
  if name and require("engine.image").mapped(name) then return name end
  return { dockerfile = task.dockerfile, context = task.dir .. "/environment",
           timeout = cfg.build_timeout * multiplier(config), quiet = config.quiet or nil }
end

-- The sandbox spec for a task: image from environment/ only (withholding),
-- resources from [environment], its own network namespace.
function M.sandbox(task, config)
  config = config or {}
  local cfg = task.config
  local upper
  if config.verify == "fresh" then
    local core = require "engine.sandbox.core"
    assert(core.host_mkdir(M.upper_root(), 448))  -- 0700
    M.sweep_uppers()
    upper = M.upper_root() .. "/" .. core.getpid() .. "-" .. random_hex(8)
  end
  return {
    upper_dir = upper,
    image = M.image_of(task, config),
    workdir = config.workdir,   -- else the image's final WORKDIR
    env = copy(cfg.environment_env),
    cpus = cfg.cpus,
    memory = cfg.memory_mb and math.floor(cfg.memory_mb * 1024 * 1024) or nil,
    disk = cfg.storage_mb and math.floor(cfg.storage_mb * 1024 * 1024) or nil,
    network = config.network or "none",
    labels = {
      env = "tbench2", task = task.id,   -- the runner adds run and episode ids
      launcher = os.getenv("ENGINE_LAUNCHER") or os.getenv("USER") or "unknown",
    },
  }
end

-- Reset: read the pristine tests/ into memory; clear anything at the fixed
-- verifier paths the image may have left.
function M.setup(ctx)
  local st = state(ctx)
  st.tests = M.read_tree(ctx.task.dir .. "/tests")
  st.workdir = workdir_of(ctx)
  st.box = ctx.sandbox
  if not st.tests.files[1] then error(ctx.task.dir .. "/tests: empty", 0) end
  M.clear_window(ctx.sandbox)
  trace_event(ctx, "tbench2.reset", { task = ctx.task.id, workdir = st.workdir,
    test_files = #st.tests.files })
end

local function command_timeout(config)
  local v = tonumber(config.command_timeout) or tonumber(os.getenv("TB2_COMMAND_TIMEOUT_S"))
  return v or M.DEFAULT_COMMAND_TIMEOUT
end

-- The sandbox as the agent sees it: every exec bounded by --command-timeout
-- and run in the workdir unless the agent says otherwise; no transfers to or
-- from host paths (an agent works inside its box).
function M.agent_sandbox(sb, workdir, limit)
  local proxy = {}
  function proxy.exec(_, cmd, opts)
    opts = copy(opts)
    opts.timeout = math.min(opts.timeout or limit, limit)
    opts.cwd = opts.cwd or workdir
    return sb:exec(cmd, opts)
  end
  local function no_host(name)
    return function() error("sandbox:" .. name .. " is not available to agents", 2) end
  end
  proxy.upload, proxy.download = no_host("upload"), no_host("download")
  return setmetatable(proxy, { __index = function(_, k)
    local v = sb[k]
    if type(v) == "function" then return function(_, ...) return v(sb, ...) end end
    return v
  end })
end

-- The agent phase: the agent acts on a command-bounded view of the box.
function M.run(ctx)
  local st = state(ctx)
  local limit = command_timeout(config_of(ctx))
  local actx = setmetatable({ sandbox = M.agent_sandbox(ctx.sandbox, st.workdir, limit),
    workdir = st.workdir }, { __index = ctx })
  return ctx.agent:act(actx)
end

-- The oracle: /solution exists for the solve step only.
function M.solve(ctx)
  local task, st = ctx.task, state(ctx)
  local sb = st.box or ctx.sandbox   -- the real box, not the agent's bounded view
  if not task.has_solution then error(task.dir .. "/solution/solve.sh: missing", 0) end
  local _ <close> = defer(function()
    if sb:alive() then pcall(sb.remove, sb, SOLUTION, { recursive = true }) end
  end)
  assert(remove_path(sb, SOLUTION))
  must("upload /solution", sb:upload(task.dir .. "/solution", SOLUTION))
  local limit = ctx.timeouts and ctx.timeouts.agent
    or (task.config.agent_timeout or M.NO_AGENT_TIMEOUT) * multiplier(config_of(ctx))
  local env_vars = merge(task.config.environment_env, task.config.solution_env)
  local res = must("solve.sh", sb:exec({ "bash", SOLUTION .. "/solve.sh" },
    { cwd = st.workdir or workdir_of(ctx), env = env_vars, timeout = limit }))
  trace_event(ctx, "tbench2.solve", { code = res.code, timed_out = res.timed_out,
    stdout = res.stdout and res.stdout:sub(-4000), stderr = res.stderr and res.stderr:sub(-4000) })
  return res
end

local VERIFIERS = {
  ["test.sh"] = "bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1",
  pytest = "if command -v pytest >/dev/null 2>&1; then P=pytest; else P='python3 -m pytest'; fi; "
    .. "$P /tests -rA -p no:cacheprovider > /logs/verifier/test-stdout.txt 2>&1",
}

-- Runs the verifier in `sb` with the window already staged; returns
-- reward, detail (files go to `files`).
local function run_verifier(ctx, sb, which, files)
  local task, st = ctx.task, state(ctx)
  local limit = task.config.verifier_timeout * multiplier(config_of(ctx))
  local res, err = sb:exec({ "bash", "-c", VERIFIERS[which] }, {
    cwd = st.workdir, timeout = limit,
    env = merge(task.config.environment_env, task.config.verifier_env) })
  if not res then error({ kind = "infra_error", message = "verifier: " .. tostring(err) }, 0) end
  local detail = { verifier = which, exit_code = res.code, timed_out = res.timed_out or nil }
  local reward, rewards, kind = collect(sb, files)
  if which == "pytest" then
    reward, rewards, kind = (res.code == 0) and 1 or 0, nil, nil
    files["reward.txt"] = tostring(reward) .. "\n"
  end
  if res.timed_out then reward, kind = nil, "verifier_timeout" end
  detail.rewards, detail.error = rewards, kind
  return reward or 0, detail
end

-- The verify window on one box, under its lock; the window is cleared after
-- scoring whatever happens.
local function verify_on(ctx, sb, which)
  local files = {}
  local _lock <close> = M.box_lock(sb):guard()
  local _clean <close> = defer(function()
    save_files(ctx, files)
    clear_quietly(sb)
  end)
  M.clear_window(sb)
  M.stage(sb, state(ctx).tests)
  return run_verifier(ctx, sb, which, files)
end

function M.score(ctx)
  local st, cfg = state(ctx), config_of(ctx)
  if not st.tests then st.tests = M.read_tree(ctx.task.dir .. "/tests") end
  st.workdir = st.workdir or workdir_of(ctx)
  local which = cfg.verifier or "test.sh"
  if not VERIFIERS[which] then error("--verifier: expected test.sh or pytest", 0) end
  local mode = cfg.verify or "same"
  local reward, detail
  if mode == "fresh" then
    local box <close> = M.fresh_box(ctx)
    reward, detail = verify_on(ctx, box, which)
  elseif mode == "same" then
    reward, detail = verify_on(ctx, ctx.sandbox, which)
  else
    error("--verify: expected same or fresh", 0)
  end
  detail.verify = mode
  trace_event(ctx, "tbench2.verify", detail)
  return reward, detail
end

-- ---------------------------------------------------------------------------
-- --verify fresh
--
-- The agent's box gets its writable layer in a host directory of ours
-- (spec.upper_dir, below a directory no sandbox can see). To verify, that box
-- is stopped (the kernel kills every process in its pid namespace), and a
-- new box is made from the same image layers with the agent's upper layer
-- stacked on top as a read-only lower: the agent's final files, whiteouts
-- and opaque directories included, and none of its processes.
-- ---------------------------------------------------------------------------

local function raw_box(sb)
  return type(sb) == "table" and rawget(sb, "raw") or sb
end

-- Waits until the box's processes are gone (its pid 1 reaped).
local function wait_dead(sb, seconds)
  sb:stop()
  local box = raw_box(sb)._box
  local deadline = engine.monotonic() + seconds
  while box and engine.monotonic() < deadline do
    local st = box:info().state
    if st == "dead" or st == "clean" then return true end
    engine.sleep(0.01)
  end
  if not box then engine.sleep(0.2) end
  return not box
end

function M.fresh_box(ctx)
  local sandbox = require "engine.sandbox"
  local agent_sb = ctx.sandbox
  local spec = agent_sb.info and agent_sb.info.spec
  local upper = spec and spec.upper_dir
  if not upper then error("--verify fresh: the agent's box has no upper_dir", 0) end
  local resolved, err = require("engine.image").resolve(spec.image, spec)
  if not resolved then error("--verify fresh: " .. tostring(err), 0) end
  if not wait_dead(agent_sb, 10) then error("--verify fresh: the agent's box did not stop", 0) end
  local layers = { upper }
  for _, l in ipairs(resolved.layers) do layers[#layers + 1] = l end
  local labels = copy(spec.labels)
  labels.verify = "fresh"
  local box, berr = sandbox.new {
    image = { layers = layers, config = {} }, workdir = spec.workdir, env = spec.env,
    user = spec.user, cpus = spec.cpus, memory = spec.memory, pids = spec.pids,
    disk = spec.disk, network = spec.network, labels = labels,
  }
  if not box then error({ kind = "infra_error", message = "--verify fresh: " .. tostring(berr) }, 0) end
  trace_event(ctx, "tbench2.fresh_box", { id = box.id, layers = #layers })
  return box
end

-- The env's cleanup: in fresh mode, the agent's upper layer goes once its
-- box is down.
function M.cleanup(ctx)
  local sb = ctx.sandbox
  local spec = sb and sb.info and sb.info.spec
  local upper = spec and spec.upper_dir
  if not upper or upper:sub(1, #M.upper_root() + 1) ~= M.upper_root() .. "/" then return end
  wait_dead(sb, 10)
  local core = require "engine.sandbox.core"
  core.host_rmtree(upper)
  core.host_rmtree(upper .. ".work")
end

M.options = {
  { name = "tasks", arg = "DIR", help = "a dataset directory of task dirs, or one task dir" },
  { name = "verifier", arg = "NAME", default = "test.sh",
    help = "test.sh (canonical) or pytest (run pytest on the staged /tests)" },
  { name = "verify", arg = "MODE", default = "same",
    help = "same (score in the agent's box) or fresh (a new box, agent's files, no processes)" },
  { name = "workdir", arg = "PATH", help = "override the Dockerfile's final WORKDIR" },
  { name = "network", arg = "MODE", default = "none", help = "none (own namespace, lo only) or host" },
}

return env.define {
  name = "tbench2",
  description = "Terminal-Bench 2 tasks as published (task.toml, environment/, tests/, solution/).",
  options = M.options,
  tasks = M.tasks,
  sandbox = M.sandbox,
  setup = M.setup,
  run = M.run,
  score = M.score,
  solve = M.solve,
  cleanup = M.cleanup,
  tb2 = M,
}
