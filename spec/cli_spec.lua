local engine = require "engine"
local ENGINE = engine.root .. "/" .. (os.getenv("BUILD") or "build") .. "/engine"

-- Runs the engine binary; returns exit status, stdout and stderr.
local function run(args, input)
  local out, err = os.tmpname(), os.tmpname()
  local cmd = string.format("%s %s >%s 2>%s", ENGINE, args, out, err)
  if input then cmd = "printf '%s' " .. string.format("%q", input) .. " | " .. cmd end
  local _, _, status = os.execute(cmd)
  local function slurp(p) local f = io.open(p); local s = f:read("a"); f:close(); os.remove(p); return s end
  return status, slurp(out), slurp(err)
end

local function script(text)
  local path = os.tmpname() .. ".lua"
  local f = io.open(path, "w")
  f:write(text)
  f:close()
  return path
end

describe("engine CLI", function()
  it("prints its version and help", function()
    local st, out = run("--version")
    assert.equal(0, st)
    assert.matches("^engine %d+%.%d+%.%d+\n$", out)
    st, out = run("--help")
    assert.equal(0, st)
    assert.matches("usage: engine", out)
  end)

  it("rejects an unknown command with one line and status 2", function()
    local st, out, err = run("frobnicate")
    assert.equal(2, st)
    assert.equal("", out)
    assert.matches("^engine: unknown command 'frobnicate'[^\n]*\n$", err)
  end)

  it("rejects a bad flag with one line and status 2", function()
    local st, _, err = run("--bogus")
    assert.equal(2, st)
    assert.matches("^engine: [^\n]+\n$", err)
  end)

  it("runs a script as a task with arg set", function()
    local path = script([[
      local engine = require "engine"
      assert(engine.current(), "top level runs as a task")
      engine.sleep(0.01)
      print(arg[0] ~= nil, arg[1], arg[2], ...)
    ]])
    local st, out = run("run " .. path .. " a b")
    os.remove(path)
    assert.equal(0, st)
    assert.equal("true\ta\tb\ta\tb\n", out)
  end)

  it("reports a missing file and a syntax error in one line naming the file", function()
    local st, _, err = run("run /nonexistent/x.lua")
    assert.equal(1, st)
    assert.matches("^engine: cannot open /nonexistent/x.lua[^\n]*\n$", err)
    local path = script("local = 1\n")
    st, _, err = run("run " .. path)
    os.remove(path)
    assert.equal(1, st)
    assert.matches(path:gsub("%p", "%%%0") .. ":1:", err)
  end)

  it("exits 1 with the traceback when the script raises", function()
    local path = script("error('kaput')")
    local st, _, err = run("run " .. path)
    os.remove(path)
    assert.equal(1, st)
    assert.matches("kaput", err)
  end)

  it("reports a failed task nobody joined on stderr", function()
    local path = script([[
      local engine = require "engine"
      engine.spawn(function() error("nobody saw this") end)
      engine.sleep(0.01)
    ]])
    local st, _, err = run("run " .. path)
    os.remove(path)
    assert.equal(0, st)
    assert.matches("a task failed and was never joined: [^\n]*nobody saw this", err)
  end)

  it("cancels what the script left running, running its cleanups", function()
    local path = script([[
      local engine = require "engine"
      engine.spawn(function()
        local _ <close> = setmetatable({}, { __close = function() print("bg cleaned") end })
        engine.sleep(60)
      end)
      engine.sleep(0.01)
    ]])
    local t0 = engine.monotonic()
    local st, out = run("run " .. path)
    os.remove(path)
    assert.equal(0, st)
    assert.equal("bg cleaned\n", out)
    assert.is_true(engine.monotonic() - t0 < 5)
  end)

  for _, case in ipairs({ { "INT", 130 }, { "TERM", 143 } }) do
    it("SIG" .. case[1] .. " cancels every task, runs cleanups, exits " .. case[2], function()
      local path = script([[
        local engine = require "engine"
        local other = engine.spawn(function()
          local _ <close> = setmetatable({}, { __close = function() print("other cleaned") end })
          engine.sleep(60)
        end)
        local _ <close> = setmetatable({}, { __close = function()
          engine.sleep(0.05)   -- cleanup may still block
          print("main cleaned")
        end })
        print("ready"); io.stdout:flush()
        engine.sleep(60)
      ]])
      local out = os.tmpname()
      local cmd = string.format("%s run %s >%s 2>&1 & pid=$!; " ..
        "for i in $(seq 100); do grep -q ready %s && break; sleep 0.05; done; " ..
        "kill -%s $pid; wait $pid", ENGINE, path, out, out, case[1])
      local _, _, st = os.execute(cmd)
      local f = io.open(out); local text = f:read("a"); f:close()
      os.remove(out); os.remove(path)
      assert.equal(case[2], st)
      assert.matches("other cleaned", text)
      assert.matches("main cleaned", text)
    end)
  end

  it("a second Ctrl-C during cleanup does not skip it", function()
    local path = script([[
      local engine = require "engine"
      local _ <close> = setmetatable({}, { __close = function()
        print("cleanup started"); io.stdout:flush()
        engine.sleep(0.5)
        print("cleanup finished")
      end })
      print("ready"); io.stdout:flush()
      engine.sleep(60)
    ]])
    local out = os.tmpname()
    local cmd = string.format("%s run %s >%s 2>&1 & pid=$!; " ..
      "for i in $(seq 100); do grep -q ready %s && break; sleep 0.05; done; " ..
      "kill -INT $pid; for i in $(seq 100); do grep -q started %s && break; sleep 0.02; done; " ..
      "kill -INT $pid; wait $pid", ENGINE, path, out, out, out)
    local _, _, st = os.execute(cmd)
    local f = io.open(out); local text = f:read("a"); f:close()
    os.remove(out); os.remove(path)
    assert.equal(130, st)
    assert.matches("cleanup finished", text)
    assert.matches("interrupt again", text)
  end)
end)
