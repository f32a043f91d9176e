-- envs/tbench2.lua: task reading, withholding, the verify window, rewards,
-- the oracle, reward hacking, cancellation. Pure parts run without a sandbox;
-- the episode parts need engine.sandbox and the runner.
local engine = require "engine"
local lfs = require "lfs"

local ROOT = engine.root or "."
local EXAMPLES = ROOT .. "/examples/tbench2"
local FIXTURES = ROOT .. "/spec/fixtures/tbench2"
local EXAMPLE_TASKS = { "env-config", "fix-wordcount", "hello-file", "kv-server", "log-stats" }

-- Loads envs/tbench2.lua with engine.env stubbed, returning its internals.
local function internals()
  local saved = package.loaded["engine.env"]
  package.loaded["engine.env"] = { define = function(t) return t end }
  local ok, res = pcall(dofile, ROOT .. "/envs/tbench2.lua")
  package.loaded["engine.env"] = saved
  assert(ok, res)
  return res.tb2
end

local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(lfs.mkdir(p))
  return p
end

local function rm_rf(p)
  os.execute("rm -rf '" .. p .. "'")
end

local function write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local d = f:read("a")
  f:close()
  return d
end

-- A stable fingerprint of a host directory tree (names, modes, contents).
local function fingerprint(dir)
  local p = io.popen("cd '" .. dir .. "' && find . -printf '%p %m %y %l\\n' | sort"
    .. " && find . -type f -print0 | sort -z | xargs -0 cat | md5sum")
  local out = p:read("a")
  p:close()
  return out
end

describe("tbench2 task reading", function()
  local T = internals()

  it("discovers every example task, sorted by name", function()
    local tasks = T.discover(EXAMPLES)
    local names = {}
    for i, t in ipairs(tasks) do names[i] = t.id end
    assert.same(EXAMPLE_TASKS, names)
    for _, t in ipairs(tasks) do
      assert.truthy(t.prompt:find("%S"))
      assert.equal("/app", t.workdir)
      assert.truthy(t.config.agent_timeout)
    end
  end)

  it("takes one task directory as a dataset of one", function()
    local tasks = T.discover(EXAMPLES .. "/hello-file/")
    assert.equal(1, #tasks)
    assert.equal("hello-file", tasks[1].id)
  end)

  it("reads memory = \"2G\" and memory_mb alike", function()
    local hello = assert(T.load_task(EXAMPLES .. "/hello-file"))
    assert.equal(2048, hello.config.memory_mb)
    assert.equal(10240, hello.config.storage_mb)
    assert.equal(120, hello.config.verifier_timeout)
    assert.equal(300, hello.config.agent_timeout)
    local wc = assert(T.load_task(EXAMPLES .. "/fix-wordcount"))
    assert.equal(1024, wc.config.memory_mb)
    assert.equal(4096, wc.config.storage_mb)
    assert.is_false(wc.config.allow_internet)
    assert.equal(512, T.parse_size_mb("512M"))
    assert.equal(1536, T.parse_size_mb("1.5G"))
    assert.equal(2048, T.parse_size_mb("2Gi"))
    assert.is_nil(T.parse_size_mb("lots"))
    assert.is_nil(T.parse_size_mb("-1G"))
  end)

  it("reads the env tables and schema_version", function()
    local t = assert(T.load_task(EXAMPLES .. "/env-config"))
    assert.same({ EXPECTED_RELEASE = "aurora-7", EXPECTED_PORT = "8443" }, t.config.verifier_env)
    assert.same({ DEPLOY_ENV = "staging" }, t.config.environment_env)
    assert.same({ RELEASE_NAME = "aurora-7", SERVICE_PORT = "8443" }, t.config.solution_env)
    assert.equal("1.1", t.config.version)
  end)

  it("falls back to the official defaults", function()
    local t = assert(T.load_task(FIXTURES .. "/minimal"))
    assert.equal(600, t.config.verifier_timeout)
    assert.is_nil(t.config.agent_timeout)
    assert.equal(600, t.config.build_timeout)
    assert.is_nil(t.config.memory_mb)
    assert.equal("/srv/data", t.workdir)
    assert.same({}, t.config.verifier_env)
  end)

  local broken = {
    ["bad-syntax"] = "task.toml:3:15: ",
    ["bad-verifier-timeout"] = "task.toml: [verifier] timeout_sec: expected a number",
    ["bad-agent-timeout"] = "task.toml: [agent] timeout_sec: must be greater than 0",
    ["bad-memory"] = "task.toml: [environment] memory: expected a size",
    ["bad-storage-mb"] = "task.toml: [environment] storage_mb: expected a number",
    ["bad-verifier-env"] = "task.toml: [verifier.env].LIST: expected a string",
    ["bad-environment-table"] = "task.toml: [environment]: expected a table",
    ["no-instruction"] = "no-instruction: instruction.md: ",
    ["no-dockerfile"] = "no-dockerfile: environment/Dockerfile: missing",
    ["no-tests"] = "no-tests: tests/: missing",
  }
  for name, want in pairs(broken) do
    it("rejects " .. name .. " with one line naming the file and field", function()
      local t, err = T.load_task(FIXTURES .. "/broken/" .. name)
      assert.is_nil(t)
      assert.truthy(err:find(want, 1, true), err)
      assert.truthy(err:find(name, 1, true), err)
      assert.is_nil(err:find("\n"), err)
    end)
  end

  it("fails discovery of a dataset with a broken task, naming it", function()
    local ok, err = pcall(T.discover, FIXTURES .. "/broken")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("broken/bad-", 1, true), err)
    ok, err = pcall(T.discover, FIXTURES .. "/nowhere")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("not a directory"), err)
  end)
end)

describe("tbench2 withholding", function()
  local T = internals()

  it("reads a symlinked tests/ through to the real files", function()
    local d = tmpdir()
    finally(function() rm_rf(d) end)
    assert(os.execute(string.format("cp -r '%s/hello-file' '%s/task' && mv '%s/task/tests' '%s/real'"
      .. " && ln -s ../real '%s/task/tests' && ln -s test_outputs.py '%s/real/alias.py'",
      EXAMPLES, d, d, d, d, d)))
    local tree = T.read_tree(d .. "/task/tests")
    local by = {}
    for _, f in ipairs(tree.files) do by[f.path] = f end
    assert.equal(read(EXAMPLES .. "/hello-file/tests/test.sh"), by["test.sh"].data)
    assert.equal(493, by["test.sh"].mode)
    assert.equal(by["test_outputs.py"].data, by["alias.py"].data)
    -- Later edits on disk do not change what was read.
    write(d .. "/real/test.sh", "echo 1 > /logs/verifier/reward.txt\n")
    assert.equal(read(EXAMPLES .. "/hello-file/tests/test.sh"), by["test.sh"].data)
  end)

  it("refuses a symlink loop in tests/", function()
    local d = tmpdir()
    finally(function() rm_rf(d) end)
    assert(os.execute(string.format("mkdir -p '%s/tests/sub' && ln -s .. '%s/tests/sub/up'", d, d)))
    local ok, err = pcall(T.read_tree, d .. "/tests")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("loop"), err)
  end)

  it("builds the image from environment/ only", function()
    local t = assert(T.load_task(EXAMPLES .. "/hello-file"))
    local spec = T.sandbox(t, {})
    assert.equal(t.dir .. "/environment", spec.image.context)
    assert.equal(t.dir .. "/environment/Dockerfile", spec.image.dockerfile)
    assert.equal("/app", spec.workdir)
    assert.equal(2048 * 1024 * 1024, spec.memory)
    assert.equal("none", spec.network)
    assert.equal("hello-file", spec.labels.task)
    assert.equal("tbench2", spec.labels.env)
  end)
end)

describe("tbench2 rewards", function()
  local T = internals()

  it("parses reward.txt", function()
    assert.equal(1, T.parse_reward_txt("1\n"))
    assert.equal(0.25, T.parse_reward_txt(" 0.25 "))
    assert.same({ nil, "reward_file_empty" }, { T.parse_reward_txt("\n") })
    assert.same({ nil, "reward_parse_error" }, { T.parse_reward_txt("pass") })
    assert.same({ nil, "reward_parse_error" }, { T.parse_reward_txt("1 1") })
  end)

  it("parses reward.json: the reward key, else the mean", function()
    local r, map = T.parse_reward_json('{"reward": 0.5, "a": 1}')
    assert.equal(0.5, r)
    assert.same({ reward = 0.5, a = 1 }, map)
    r, map = T.parse_reward_json('{"a": 1, "b": 0, "c": 1, "d": 0}')
    assert.equal(0.5, r)
    assert.equal(4, (function() local n = 0 for _ in pairs(map) do n = n + 1 end return n end)())
    assert.same({ nil, "reward_file_empty" }, { T.parse_reward_json("  ") })
    assert.same({ nil, "reward_parse_error" }, { T.parse_reward_json("{") })
    assert.same({ nil, "reward_parse_error" }, { T.parse_reward_json('{"a": "yes"}') })
    assert.same({ nil, "reward_parse_error" }, { T.parse_reward_json('{"a": {"b": 1}}') })
    assert.same({ nil, "reward_parse_error" }, { T.parse_reward_json("[1, 2]") })
    assert.same({ nil, "reward_parse_error" }, { T.parse_reward_json("{}") })
  end)
end)
