-- bench/http.lua: 1,000 requests to a loopback server with 200 in flight,
-- through engine.http (tasks on the libcurl multi handle), against
-- `curl --parallel --parallel-max 200` doing the same requests, in the same
-- run against the same server (bench/http_server.c). Prints requests per
-- second for both and their ratio (best of ROUNDS, alternating; round 1 cold).
--
--   ./build/engine run bench/http.lua [N] [IN_FLIGHT] [ROUNDS]
local engine = require "engine"
local http = require "engine.http"
local proc = require "engine.proc"

local N = tonumber(arg and arg[1]) or 1000
local IN_FLIGHT = tonumber(arg and arg[2]) or 200
local ROUNDS = tonumber(arg and arg[3]) or 3

-- The bench server binary sits next to the engine: BUILD/bench/http_server.
local function server_path()
  local exe = io.popen("readlink /proc/" .. io.open("/proc/self/stat"):read("n") .. "/exe"):read("l")
  local path = exe:match("^(.*)/[^/]*$") .. "/bench/http_server"
  assert(io.open(path), "no " .. path .. " (build the project first)")
  return path
end

local function engine_round(url)
  local next_i, failures = 0, 0
  local t0 = engine.monotonic()
  local workers = {}
  for w = 1, IN_FLIGHT do
    workers[w] = engine.spawn(function()
      while next_i < N do
        next_i = next_i + 1
        local r = http.request{ url = url .. "/" .. next_i, timeout = 30 }
        if not r or r.status ~= 200 or r.body ~= "ok" then failures = failures + 1 end
      end
    end)
  end
  for _, w in ipairs(workers) do assert(w:join()) end
  assert(failures == 0, failures .. " engine requests failed")
  return N / (engine.monotonic() - t0)
end

local function curl_round(url, config_path)
  local t0 = engine.monotonic()
  local r = proc.run({ "curl", "--parallel", "--parallel-max", tostring(IN_FLIGHT),
    "--parallel-immediate", "-s", "-K", config_path }, { timeout = 120 })
  local dt = engine.monotonic() - t0
  assert(r.code == 0, "curl failed: " .. tostring(r.stderr))
  return N / dt
end

local function write_curl_config(url)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  for i = 1, N do f:write(string.format('url = "%s/%d"\noutput = "/dev/null"\n', url, i)) end
  f:close()
  return path
end

local function main()
  local srv = proc.spawn({ server_path() }, {})
  local iter, state = srv:lines()
  local port = assert(iter(state)):match("PORT (%d+)")
  local url = "http://127.0.0.1:" .. port
  local config_path = write_curl_config(url)
  local best_e, best_c, cold = 0, 0, nil
  for round = 1, ROUNDS do
    -- round 1 is cold for both: the engine opens its connections as a new
    -- curl process does; later engine rounds reuse the multi's connections.
    local e = engine_round(url)
    local c = curl_round(url, config_path)
    cold = cold or e / c
    best_e, best_c = math.max(best_e, e), math.max(best_c, c)
    print(string.format("round %d%s: engine.http %.0f req/s, curl --parallel %.0f req/s",
      round, round == 1 and " (cold)" or "", e, c))
  end
  print(string.format("cold ratio (round 1): %.2fx", cold))
  srv:kill()
  srv:wait()
  os.remove(config_path)
  print(string.format("%d requests, %d in flight: engine.http %.0f req/s, curl %.0f req/s, ratio %.2fx",
    N, IN_FLIGHT, best_e, best_c, best_e / best_c))
end

main()
