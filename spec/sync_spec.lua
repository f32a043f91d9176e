local engine = require "engine"
local sync = require "engine.sync"

describe("engine.sync", function()
  it("mutex grants in FIFO order", function()
    local m, order = sync.mutex(), {}
    m:lock()
    local tasks = {}
    for i = 1, 5 do
      tasks[i] = engine.spawn(function()
        m:lock(); order[#order + 1] = i; engine.sleep(0.001); m:unlock()
      end)
      engine.sleep(0)
    end
    m:unlock()
    for _, t in ipairs(tasks) do assert(t:join()) end
    assert.same({ 1, 2, 3, 4, 5 }, order)
  end)

  it("mutex re-lock by its holder raises instead of deadlocking", function()
    local m = sync.mutex()
    local ok, err = engine.spawn(function() m:lock(); m:lock() end):join()
    assert.is_false(ok)
    assert.matches("already held", err)
  end)

  it("guard releases on error and on cancellation", function()
    local m = sync.mutex()
    assert.is_false((engine.spawn(function()
      local _ <close> = m:guard(); error("x")
    end):join()))
    assert.is_false(m:locked())
    local t = engine.spawn(function() local _ <close> = m:guard(); engine.sleep(60) end)
    engine.sleep(0.001)
    assert.is_true(m:locked())
    t:cancel(); t:join()
    assert.is_false(m:locked())
  end)

  it("a cancelled waiter leaves the queue and the lock still passes on", function()
    local m, got = sync.mutex(), {}
    m:lock()
    local a = engine.spawn(function() m:lock(); got[#got + 1] = "a"; m:unlock() end)
    local b = engine.spawn(function() m:lock(); got[#got + 1] = "b"; m:unlock() end)
    engine.sleep(0.001)
    a:cancel(); a:join()
    m:unlock()
    assert(b:join())
    assert.same({ "b" }, got)
  end)

  it("a waiter cancelled after being granted passes the permit on", function()
    local s = sync.semaphore(1)
    s:acquire()
    local a = engine.spawn(function() s:acquire() end)
    local b = engine.spawn(function() s:acquire(); s:release(); return "b" end)
    engine.sleep(0.001)
    s:release()        -- grants a, which is cancelled before it runs
    a:cancel()
    assert.is_false((a:join()))
    assert.same({ true, "b" }, { b:join() })
  end)

  it("semaphore bounds concurrency", function()
    local s, inside, peak = sync.semaphore(3), 0, 0
    local tasks = {}
    for i = 1, 10 do
      tasks[i] = engine.spawn(function()
        local _ <close> = s:guard()
        inside = inside + 1; peak = math.max(peak, inside)
        engine.sleep(0.002)
        inside = inside - 1
      end)
    end
    for _, t in ipairs(tasks) do assert(t:join()) end
    assert.equal(3, peak)
  end)

  it("event wakes every waiter", function()
    local e, n = sync.event(), 0
    local tasks = {}
    for i = 1, 4 do tasks[i] = engine.spawn(function() e:wait(); n = n + 1 end) end
    engine.sleep(0.001)
    assert.equal(0, n)
    e:set()
    for _, t in ipairs(tasks) do assert(t:join()) end
    assert.equal(4, n)
    e:wait()  -- already set: returns at once
  end)

  it("with_timeout returns the results in time", function()
    assert.same({ 1, 2 }, { sync.with_timeout(1, function() engine.sleep(0.001); return 1, 2 end) })
  end)

  it("with_timeout abandons the pending operation and says timeout", function()
    local t0 = engine.monotonic()
    local r, err = sync.with_timeout(0.02, engine.sleep, 10)
    assert.is_nil(r)
    assert.equal("timeout", err)
    assert.is_true(engine.monotonic() - t0 < 1)
  end)

  it("nested timeouts each catch their own expiry", function()
    local r, err = sync.with_timeout(0.02, function()
      local a, b = sync.with_timeout(5, engine.sleep, 10)
      return "inner returned", a, b
    end)
    assert.is_nil(r)
    assert.equal("timeout", err)
  end)

  it("with_timeout passes other errors through", function()
    assert.has_error(function() sync.with_timeout(1, error, "boom", 0) end, "boom")
  end)
end)
