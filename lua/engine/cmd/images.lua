-- engine images: list built and imported images (size, last use);
-- engine images prune [--all] [--older-than SECONDS]: remove layers no
-- image uses (with --all, also the images unused for SECONDS, default 0).
local engine = require "engine"
local image = require "engine.image"

local USAGE = [[
usage: engine images                 list images with size and last use
       engine images prune [--all] [--older-than SECONDS]
                                     remove layers no image uses; --all also
                                     forgets images (unused for SECONDS)
the store is ENGINE_IMAGE_DIR, else ENGINE_STATE_DIR/images, else /var/lib/engine/images
]]

local human = require("engine.report").human_bytes

local function ago(t)
  local s = math.floor(math.max(0, engine.now() - (t or 0)))
  if s < 60 then return string.format("%ds ago", s) end
  if s < 3600 then return string.format("%dm ago", s // 60) end
  if s < 86400 then return string.format("%dh ago", s // 3600) end
  return string.format("%dd ago", s // 86400)
end

local function list(store, out)
  local recs = store:images()
  out:write(string.format("%-8s %6s %9s  %-10s %s\n", "KIND", "LAYERS", "SIZE", "LAST USED", "NAME"))
  for _, r in ipairs(recs) do
    out:write(string.format("%-8s %6d %9s  %-10s %s\n", r.kind or "?", #(r.layers or {}),
      human(r.size or 0), ago(r.last_used), r.name))
  end
  if #recs == 0 then out:write("(no images in ", store.root, ")\n") end
  return 0
end

local function prune(store, argv, out)
  local opts, i = {}, 1
  while argv[i] do
    local a = argv[i]
    if a == "--all" then opts.all = true
    elseif a == "--older-than" then
      opts.older_than = tonumber(argv[i + 1])
      if not opts.older_than then io.stderr:write("engine images: --older-than needs seconds\n") return 2 end
      i = i + 1
    else
      io.stderr:write("engine images: unknown argument ", a, "\n", USAGE)
      return 2
    end
    i = i + 1
  end
  local s = store:prune(opts)
  out:write(string.format("removed %d layer(s), %s; forgot %d image(s)\n", s.layers, human(s.bytes), s.images))
  return 0
end

-- main(argv, out?) -> exit status
return function(argv, out)
  out = out or io.stdout
  if argv[1] == "--help" or argv[1] == "-h" then out:write(USAGE) return 0 end
  local store, err = image.store()
  if not store then io.stderr:write("engine images: ", tostring(err), "\n") return 1 end
  if argv[1] == nil or argv[1] == "ls" or argv[1] == "list" then return list(store, out) end
  if argv[1] == "prune" then return prune(store, { table.unpack(argv, 2) }, out) end
  io.stderr:write("engine images: unknown subcommand ", argv[1], "\n", USAGE)
  return 2
end
