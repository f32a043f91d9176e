-- engine.image: turns a sandbox spec's `image` into stacked layer dirs.
--
--   image.resolve(image, spec) -> {layers = {top_dir, ..., bottom}, config =
--     {workdir, env, user, cmd, entrypoint, shell, labels, expose}} | nil, err
--
-- image is {dockerfile = PATH, context = DIR, args = {...}, network =
-- "host", timeout = s, quiet = bool, progress = function(line)}, "archive:FILE.tar", a name mapped with
-- image.map(name, base) or in the ENGINE_IMAGE_MAP JSON file ({"name":
-- base}), or an already resolved {layers = ...}. The bottom of `layers` may
-- be the string "host" (the host allow-list lower). Built and imported
-- layers live in the shared store (engine.layers).
local archive = require "engine.archive"
local json = require "engine.json"
local layers = require "engine.layers"

local M = {}

local DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

local mapping = {}
local map_file_cache

-- image.map(name, base): FROM name (or image = name) means base, which is
-- "host", a rootfs directory, "archive:FILE", or another mapped name.
-- image.map(name, nil) removes the mapping.
function M.map(name, base)
  if type(name) ~= "string" then error("image.map: name must be a string", 2) end
  mapping[name] = base
end

local map_file_override

-- image.map_file(path): read name -> base mappings from this JSON file
-- (an object) instead of the one ENGINE_IMAGE_MAP names; nil: back to it.
-- Bases "./DIR" and "archive:REL" are relative to the file's directory.
function M.map_file(path)
  map_file_override = path
  map_file_cache = nil
end

-- Makes a relative base from a map file absolute.
local function anchor(base, dir)
  if type(base) ~= "string" then return nil end
  if base:sub(1, 8) == "archive:" and base:sub(9, 9) ~= "/" then return "archive:" .. dir .. "/" .. base:sub(9) end
  if base:match("^%.%.?/") then return dir .. "/" .. base end
  return base
end

local function file_mapping()
  local path = map_file_override or os.getenv("ENGINE_IMAGE_MAP")
  if not path or path == "" then return {} end
  if map_file_cache and map_file_cache.path == path then return map_file_cache.map end
  local v = json.safe_decode(layers.read_file(path) or "")
  if type(v) ~= "table" then
    io.stderr:write("engine: image map ", path, ": not a JSON object, ignored\n")
    v = {}
  end
  local dir, map = path:match("^(.*)/[^/]*$") or ".", {}
  for name, base in pairs(v) do map[name] = anchor(base, dir) end
  map_file_cache = { path = path, map = map }
  return map
end

-- The base a name is mapped to, trying "name:tag" then "name". Or nil.
function M.mapped(name)
  local plain = name:match("^(.-):[%w][%w_.%-]*$")
  local fm = file_mapping()
  return mapping[name] or fm[name] or (plain and (mapping[plain] or fm[plain])) or nil
end

-- The default config of a base that brings none.
function M.default_config()
  return { env = { PATH = DEFAULT_PATH }, workdir = "/", shell = { "/bin/sh", "-c" },
           labels = {}, expose = {} }
end

-- Fills the missing fields of a config with defaults.
function M.normalize_config(cfg)
  local d = M.default_config()
  cfg = cfg or {}
  for k, v in pairs(d) do if cfg[k] == nil then cfg[k] = v end end
  return cfg
end

local store_cache, store_override

-- image.use_store(root): use the store at root from now on (nil: back to
-- the environment's choice). For tests and tools.
function M.use_store(root)
  store_override = root
  store_cache = nil
end

-- The shared layer store (opened once per root).
function M.store()
  if store_override then
    if not (store_cache and store_cache.want == store_override) then
      local s, err = layers.open(store_override)
      if not s then return nil, err end
      store_cache = { want = store_override, store = s }
    end
    return store_cache.store
  end
  local root = os.getenv("ENGINE_IMAGE_DIR")
  local state = os.getenv("ENGINE_STATE_DIR")
  local want = (root or "") .. "|" .. (state or "")
  if store_cache and store_cache.want == want then return store_cache.store end
  local s, err = layers.open()
  if not s then return nil, err end
  store_cache = { want = want, store = s }
  return s
end

-- ---- looking through stacked layers ----------------------------------------

local function is_whiteout(st)
  return st and st.type == "char" and st.rdev == 0
end

-- stat of what `path` (absolute) shows through the stack, or nil. Honours
-- whiteouts and opaque directories; "host" means the host path itself.
function M.lookup(stack, path)
  local parts = {}
  for p in path:gmatch("[^/]+") do parts[#parts + 1] = p end
  for _, dir in ipairs(stack) do
    if dir == "host" then
      local st = archive.stat(path)
      return st, st and path or nil
    end
    local base = dir
    local acc, blocked, opaque = base, false, false
    for i, p in ipairs(parts) do
      acc = acc .. "/" .. p
      local st = archive.stat(acc)
      if is_whiteout(st) then return nil end
      if not st then blocked = true break end
      if i == #parts then return st, acc end
      if st.type ~= "dir" then return nil end
      if archive.xattr(acc, "trusted.overlay.opaque") == "y" then opaque = true end
    end
    if #parts == 0 then return archive.stat(base), base end
    if opaque and blocked then return nil end
  end
  return nil
end

-- Names in the directory `path` as the stack shows it (sorted), or nil
-- when it is not a directory there: the union over layers down to an
-- opaque directory, less whiteouts.
function M.list_visible(stack, path)
  local st = M.lookup(stack, path)
  if not st or st.type ~= "dir" then return nil end
  local parts, seen, names = {}, {}, {}
  for p in path:gmatch("[^/]+") do parts[#parts + 1] = p end
  local function add(dir)
    for _, n in ipairs(archive.list(dir) or {}) do
      if not seen[n] then
        seen[n] = true
        if not is_whiteout(archive.stat(dir .. "/" .. n)) then names[#names + 1] = n end
      end
    end
  end
  for _, dir in ipairs(stack) do
    if dir == "host" then add(path) break end
    local acc, state, opaque = dir, "dir", false
    for i, p in ipairs(parts) do
      acc = acc .. "/" .. p
      local s = archive.stat(acc)
      if not s then state = "missing" break end
      if is_whiteout(s) or s.type ~= "dir" then state = "gone" break end
      if i < #parts and archive.xattr(acc, "trusted.overlay.opaque") == "y" then opaque = true end
    end
    if state == "gone" then break end
    if state == "dir" then
      add(acc)
      if archive.xattr(acc, "trusted.overlay.opaque") == "y" then break end
    end
    if opaque then break end
  end
  table.sort(names)
  return names
end

-- Contents of the file `path` shows through the stack, or nil.
function M.read_visible(stack, path)
  local st, real = M.lookup(stack, path)
  if not st or st.type ~= "file" then return nil end
  return layers.read_file(real)
end

-- uid of user (name or number) and its gid, through the stack's
-- /etc/passwd and /etc/group. Returns uid, gid or nil, err.
function M.user_ids(stack, user)
  if user == nil or user == "" then return 0, 0 end
  local uid, gid = require("engine.sandbox").lookup_user(user,
    function(path) return M.read_visible(stack, path) end)
  return uid, gid
end

-- ---- resolving -------------------------------------------------------------

local function resolve_string(image, spec, depth)
  if image == "host" then
    return { layers = { "host" }, config = M.default_config(), key = archive.sha256("base:host") }
  end
  if image:sub(1, 8) == "archive:" then
    local store, err = M.store()
    if not store then return nil, err end
    return require("engine.image_import").import(store, image:sub(9))
  end
  local st = archive.stat(image)
  if image:sub(1, 1) == "/" and st and st.type == "dir" then
    local real = archive.realpath(image)
    return { layers = { real }, config = M.default_config(), key = archive.sha256("base:dir:" .. real) }
  end
  local base = M.mapped(image)
  if base and depth < 8 then return M.resolve(base, spec, depth + 1) end
  return nil, "unknown image '" .. image .. "'"
end

-- The local sandbox stacks at most this many lower layers (SB_MAX_LAYERS).
M.MAX_LAYERS = 32

local resolve_any

-- image.resolve(image, spec) -> {layers, config, key} | nil, err
function M.resolve(image, spec, depth)
  local r, err = resolve_any(image, spec, depth)
  if r and #r.layers > M.MAX_LAYERS then
    return nil, string.format("image has %d layers; the local sandbox stacks at most %d " ..
      "(merge RUN/COPY lines)", #r.layers, M.MAX_LAYERS)
  end
  return r, err
end

resolve_any = function(image, spec, depth)
  depth = depth or 0
  if type(image) == "string" then return resolve_string(image, spec, depth) end
  if type(image) ~= "table" then return nil, "image must be a string or a table" end
  if image.layers then
    return { layers = image.layers, config = M.normalize_config(image.config), key = image.key }
  end
  if image.archive then return resolve_string("archive:" .. image.archive, spec, depth) end
  if image.dockerfile then
    local store, err = M.store()
    if not store then return nil, err end
    return require("engine.image_build").build(store, image, spec)
  end
  return nil, "image table needs dockerfile, archive or layers"
end

-- Resolves the base named by FROM. Unknown names fall back to host and say
-- so (through warn), unless strict.
function M.resolve_base(name, warn, strict)
  if name == "scratch" then return { layers = {}, config = M.default_config(),
                                     key = archive.sha256("base:scratch") } end
  local r, err = resolve_string(name, nil, 0)
  if r then return r end
  if err and err:match("^unknown image") and not strict then
    warn(string.format("unknown base image '%s', using host instead " ..
      "(map it with image.map or ENGINE_IMAGE_MAP)", name))
    return resolve_string("host", nil, 0)
  end
  return nil, err
end

return M
