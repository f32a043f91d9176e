-- bench/images.lua: what the layer cache and stacked layers cost, as ratios
-- measured in the same run. Run by hand (as root):
--   ./build/engine run bench/images.lua [files] [rounds]
--
-- 1. First build of a 5-layer Dockerfile against a cached rebuild (nothing
--    changed; the in-process digest memo is cleared first, so every context
--    file is hashed again, as in a fresh engine). Target: the cached rebuild
--    takes milliseconds.
-- 2. Creating (and stopping) a sandbox whose image is the 5 built layers
--    over host, against one on image "host". Interleaved rounds; the ratio
--    of medians. Target: within 1.2x.
local engine = require "engine"
local archive = require "engine.archive"
local image = require "engine.image"
local image_build = require "engine.image_build"

local FILES = tonumber(arg and arg[1]) or 300
local ROUNDS = tonumber(arg and arg[2]) or 20

local function clock() return engine.monotonic() end

local function write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

-- A context of FILES small files in 3 directories plus a tarball.
local function make_context(dir)
  for _, sub in ipairs { "a", "b", "c" } do
    assert(archive.mkdir(dir .. "/" .. sub, 493))
    for i = 1, FILES // 3 do
      write(string.format("%s/%s/f%04d.txt", dir, sub, i), string.rep(sub .. i .. "\n", 200))
    end
  end
  assert(os.execute("tar czf " .. dir .. "/t.tar.gz -C " .. dir .. " a"))
end

local function median(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

local has_sandbox, sandbox = pcall(require, "engine.sandbox")

local root = assert(archive.mkdtemp("/tmp/engine-bench-images-"))
local ok, err = pcall(function()
  image.use_store(root .. "/store")
  local ctx = root .. "/ctx"
  assert(archive.mkdir(ctx, 493))
  make_context(ctx)
  write(ctx .. "/Dockerfile", table.concat({
    "FROM host", "ENV X=1", "WORKDIR /srv",
    "COPY a/ /srv/a/", "COPY b/ /srv/b/", "COPY c/ /srv/c/", "ADD t.tar.gz /srv/t/",
    has_sandbox and "RUN echo built > /srv/built && ls /srv/a | wc -l > /srv/count"
      or "COPY Dockerfile /srv/Dockerfile", "" }, "\n"))
  local img = { dockerfile = ctx .. "/Dockerfile", context = ctx, quiet = true }

  local t0 = clock()
  local first = assert(image.resolve(img))
  local t_first = clock() - t0
  assert(first.made == 5, "expected 5 new layers, made " .. tostring(first.made))
  image_build.forget_digests()
  t0 = clock()
  local again = assert(image.resolve(img))
  local t_cached = clock() - t0
  assert(again.made == 0)
  t0 = clock()
  assert(image.resolve(img))
  local t_warm = clock() - t0
  print(string.format("build, %d context files, 5 layers%s:", FILES, has_sandbox and " (one RUN)" or ""))
  print(string.format("  first build      %8.1f ms", t_first * 1000))
  print(string.format("  cached rebuild   %8.1f ms   (first/cached = %.0fx)", t_cached * 1000, t_first / t_cached))
  print(string.format("  same process     %8.1f ms   (digests memoized; first/this = %.0fx)",
    t_warm * 1000, t_first / t_warm))

  if not has_sandbox then
    print("sandbox creation: skipped (engine.sandbox unavailable)")
    return
  end
  local no_host = { table.unpack(first.layers, 1, 5) }
  local specs = {
    host = { image = "host" },
    layers = { image = { layers = first.layers, config = first.config } },
    bare = { image = { layers = no_host, config = first.config } },
  }
  local times = { host = {}, layers = {}, bare = {} }
  for _ = 1, 2 do   -- warm-up
    for _, spec in pairs(specs) do sandbox.new(spec):stop() end
  end
  local orders = { { "host", "layers", "bare" }, { "layers", "bare", "host" }, { "bare", "host", "layers" } }
  for i = 1, ROUNDS do
    for _, which in ipairs(orders[i % 3 + 1]) do
      local s0 = clock()
      local sb = assert(sandbox.new(specs[which]))
      local dt = clock() - s0
      sb:stop()
      table.insert(times[which], dt)
    end
  end
  local mh, ml, mb = median(times.host), median(times.layers), median(times.bare)
  print(string.format("sandbox creation, median of %d (interleaved):", ROUNDS))
  print(string.format("  image host        %8.2f ms", mh * 1000))
  print(string.format("  5 layers + host   %8.2f ms   (ratio %.2fx, target <= 1.2x)", ml * 1000, ml / mh))
  print(string.format("  5 layers, no host %8.2f ms   (ratio %.2fx: the layers alone)", mb * 1000, mb / mh))
end)
image.use_store(nil)
archive.remove(root)
if not ok then error(err, 0) end
