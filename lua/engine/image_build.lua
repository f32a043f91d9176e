-- engine.image_build: runs a Dockerfile against the layer store.
--
-- Every instruction advances a chain key: key = sha256(previous key,
-- instruction after expansion, digests of the files it reads). COPY, ADD
-- and RUN make a layer stored under that key (a cache hit makes nothing);
-- the others change only the image config. RUN runs in a build sandbox whose
-- writable layer, kept on disk, becomes the new layer. A lock per key makes
-- two builders of the same key share one layer.
local engine = require "engine"
local archive = require "engine.archive"
local json = require "engine.json"
local dockerfile = require "engine.dockerfile"
local image = require "engine.image"
local ignore = require "engine.image_ignore"
local layers_mkdirs = require("engine.layers").mkdirs
local layers_read = require("engine.layers").read_file

local M = {}

local Build = {}
Build.__index = Build

local BUILD_ERROR = {}

local function sha(...) return archive.sha256(table.concat({ ... }, "\n")) end

local function copy_table(t)
  local out = {}
  for k, v in pairs(t or {}) do out[k] = type(v) == "table" and copy_table(v) or v end
  return out
end

local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end
local function basename(p) return p:match("([^/]*)/*$") end

-- Normalizes an absolute path: no ".", "..", or repeated "/".
local function clean_abs(p)
  local out = {}
  for part in p:gmatch("[^/]+") do
    if part == ".." then out[#out] = nil elseif part ~= "." then out[#out + 1] = part end
  end
  return "/" .. table.concat(out, "/")
end

function Build:fail(ins, fmt, ...)
  local msg = string.format("%s:%d: " .. fmt, self.file, ins and ins.line or 0, ...)
  error(setmetatable({ message = msg }, BUILD_ERROR), 0)
end

-- Progress lines wait in a buffer until some step has real work to do:
-- a fully cached build (every sandbox of a built image) prints nothing.
function Build:say(line)
  if self.quiet then return end
  if not self.live then self.buffered[#self.buffered + 1] = line
  elseif self.progress_fn then self.progress_fn(line)
  else io.stderr:write("[image] ", line, "\n") end
end

-- From now on progress is printed as it happens (buffered lines first).
function Build:go_live()
  if self.live then return end
  self.live = true
  for _, line in ipairs(self.buffered) do self:say(line) end
  self.buffered = {}
end

local warned = {}

-- A warning, printed once per process for each file, line and text.
function Build:warn(ins, msg)
  local text = string.format("engine: %s:%d: warning: %s\n", self.file, ins.line, msg)
  if warned[text] then return end
  warned[text] = true
  io.stderr:write(text)
end

-- One progress line: FILE:LINE [i/n] INSTRUCTION status.
function Build:progress(ins, status)
  local text = ins.text:gsub("%s+", " ")
  if #text > 70 then text = text:sub(1, 67) .. "..." end
  self:say(string.format("%s:%d [%d/%d] %s  %s", self.short, ins.line, self.index, self.count,
    text, status))
end

-- Variables visible to expansion: build args, then the image env on top.
function Build:vars()
  local v = {}
  for k, val in pairs(self.args) do v[k] = val end
  for k, val in pairs(self.config.env) do v[k] = val end
  return v
end

function Build:expand(s) return dockerfile.expand(s, self:vars()) end

-- Advances the chain with a config-only instruction.
function Build:chain(ins, canonical)
  self.key = sha(self.key, ins.cmd, canonical)
end

-- ---- files through the stack -----------------------------------------------

-- Resolves symlinks in the directory part of an image path (as the image
-- sees them), so a write to /lib/x on a merged-/usr base lands in usr/lib.
function Build:resolve_parent(path)
  local parts, out, hops = {}, {}, 0
  for p in path:gmatch("[^/]+") do parts[#parts + 1] = p end
  local i = 1
  while i < #parts do
    local cur = "/" .. table.concat(out, "/") .. (#out > 0 and "/" or "") .. parts[i]
    local st, real = image.lookup(self.layers, cur)
    if st and st.type == "link" and hops < 40 then
      hops = hops + 1
      local target = archive.readlink(real)
      local abs = target:sub(1, 1) == "/" and target or ("/" .. table.concat(out, "/") .. "/" .. target)
      local rest = { table.unpack(parts, i + 1) }
      parts, out, i = {}, {}, 1
      for p in clean_abs(abs):gmatch("[^/]+") do parts[#parts + 1] = p end
      for _, p in ipairs(rest) do parts[#parts + 1] = p end
    else
      out[#out + 1] = parts[i]
      i = i + 1
    end
  end
  out[#out + 1] = parts[#parts]
  return clean_abs("/" .. table.concat(out, "/"))
end

-- mkdir -p of path inside the new layer fs. Directories the stack already
-- has keep their mode and owner; new ones get 0755 and uid/gid.
function Build:ensure_dir(fs, path, uid, gid)
  local acc = ""
  for p in path:gmatch("[^/]+") do
    acc = acc .. "/" .. p
    if not archive.stat(fs .. acc) then
      local st = image.lookup(self.layers, acc)
      local ok, err
      if st and st.type == "dir" then
        ok, err = archive.mkdir(fs .. acc, st.mode, st.uid, st.gid)
      else
        ok, err = archive.mkdir(fs .. acc, 493, uid or 0, gid or 0)  -- 0755
      end
      if not ok then return nil, err end
    end
  end
  return true
end

-- ---- context files ---------------------------------------------------------

local file_digests = {}

-- sha256 of a file, remembered per (path, size, mtime, inode).
local function file_digest(path, st)
  local k = table.concat({ path, st.size, st.mtime, st.mtime_ns, st.ino }, "|")
  local d = file_digests[k]
  if not d then
    d = assert(archive.digest_file(path))
    file_digests[k] = d
  end
  return d
end

-- Appends one line per entry of the tree at path (context-relative rel)
-- to out, leaving out what .dockerignore excludes. Returns true when
-- something below path was left out.
function Build:tree_lines(path, rel, out)
  local st = assert(archive.stat(path))
  local skipped = self.ignore and rel ~= "" and self.ignore(rel)
  if not skipped then
    local line = string.format("%s %s %o", rel, st.type, st.mode)
    if st.type == "file" then line = line .. " " .. file_digest(path, st)
    elseif st.type == "link" then line = line .. " -> " .. (archive.readlink(path) or "") end
    out[#out + 1] = line
  end
  if st.type ~= "dir" or (skipped and not self.ignore_keep) then return skipped end
  for _, n in ipairs(archive.list(path) or {}) do
    local sub = rel == "" and n or rel .. "/" .. n
    skipped = self:tree_lines(path .. "/" .. n, sub, out) or skipped
  end
  return skipped
end

-- Forgets the remembered file digests (benchmarks, tests).
function M.forget_digests() file_digests = {} end

-- Digest of a context path (file or tree): names, types, modes, contents,
-- link targets. The second result is true when .dockerignore left
-- something inside out.
function Build:tree_digest(path)
  local out = {}
  local rel = path == self.context and "" or path:sub(#self.context + 2)
  local skipped = self:tree_lines(path, rel, out)
  return archive.sha256(table.concat(out, "\n")), skipped
end

-- Copies the tree src (context-relative rel) into dst entry by entry,
-- leaving out what .dockerignore excludes.
function Build:copy_filtered(ins, src, rel, dst, o)
  for _, n in ipairs(archive.list(src) or {}) do
    local s, r, d = src .. "/" .. n, rel == "" and n or rel .. "/" .. n, dst .. "/" .. n
    local st = assert(archive.stat(s))
    local skipped = self.ignore(r)
    if st.type == "dir" and (not skipped or self.ignore_keep) then
      if not skipped then assert(archive.mkdir(d, st.mode, o.uid, o.gid)) end
      self:copy_filtered(ins, s, r, d, o)
    elseif not skipped then
      if not archive.stat(dst) then assert(layers_mkdirs(dst)) end
      local ok, err = archive.copy(s, d, o)
      if not ok then self:fail(ins, "%s: %s", ins.cmd, err) end
    end
  end
end

-- Context paths matching a COPY source pattern, sorted. Raises on "..".
function Build:glob(ins, pattern)
  local matches = { self.context }
  for part in pattern:gmatch("[^/]+") do
    if part == ".." then self:fail(ins, "source %s is outside the build context", pattern) end
    if part ~= "." then
      local next_matches = {}
      for _, dir in ipairs(matches) do
        if part:find("[%*%?%[\\]") then
          local pat = ignore.component_pattern(part)
          for _, n in ipairs(archive.list(dir) or {}) do
            if n:match(pat) then next_matches[#next_matches + 1] = dir .. "/" .. n end
          end
        elseif archive.stat(dir .. "/" .. part) then
          next_matches[#next_matches + 1] = dir .. "/" .. part
        end
      end
      matches = next_matches
    end
  end
  local kept = {}
  for _, m in ipairs(matches) do
    -- a symlinked directory on the way must not lead out of the context
    local parent = m ~= self.context and archive.realpath(dirname(m)) or self.context
    if parent ~= self.context and parent:sub(1, #self.context + 1) ~= self.context .. "/" then
      self:fail(ins, "source %s is outside the build context", pattern)
    end
    if not (self.ignore and m ~= self.context and self.ignore(m:sub(#self.context + 2))) then
      kept[#kept + 1] = m
    end
  end
  table.sort(kept)
  return kept
end

-- ---- instructions ----------------------------------------------------------

local H = {}

-- Declares ARG NAME[=default] ...: a build arg given by the caller wins,
-- then the default, then the value declared before FROM.
local function declare_args(b, ins, into, vars)
  local ws, err = dockerfile.words(ins.args)
  if not ws or #ws == 0 then b:fail(ins, "ARG: %s", err or "needs a name") end
  local canon = {}
  for _, w in ipairs(ws) do
    local name, default = w:match("^([^=]+)=(.*)$")
    if name then default = dockerfile.expand(default, vars) else name, default = w, b.global_args[w] end
    local given = b.build_args[name]
    into[name] = given ~= nil and tostring(given) or default
    canon[#canon + 1] = name .. "=" .. tostring(into[name])
  end
  return table.concat(canon, " ")
end

function H.ARG(b, ins)
  b:chain(ins, declare_args(b, ins, b.args, b:vars()))
end

function H.ENV(b, ins)
  local list, err = dockerfile.pairs(ins.args, b:vars(), true)
  if not list then b:fail(ins, "ENV: %s", err) end
  local canon = {}
  for _, kv in ipairs(list) do
    b.config.env[kv[1]] = kv[2]
    canon[#canon + 1] = kv[1] .. "=" .. kv[2]
  end
  b:chain(ins, table.concat(canon, "\0"))
end

function H.LABEL(b, ins)
  local list, err = dockerfile.pairs(ins.args, b:vars(), false)
  if not list then b:fail(ins, "LABEL: %s", err) end
  for _, kv in ipairs(list) do b.config.labels[kv[1]] = kv[2] end
  b:chain(ins, b:expand(ins.args))
end

function H.MAINTAINER(b, ins)
  b.config.labels.maintainer = ins.args
  b:chain(ins, ins.args)
end

function H.WORKDIR(b, ins)
  local dir = b:expand(ins.args)
  if dir:sub(1, 1) ~= "/" then dir = b.config.workdir .. "/" .. dir end
  b.config.workdir = clean_abs(dir)
  b:chain(ins, b.config.workdir)
end

function H.USER(b, ins)
  b.config.user = b:expand(ins.args)
  b:chain(ins, b.config.user)
end

function H.SHELL(b, ins)
  if not ins.json or #ins.json == 0 then b:fail(ins, "SHELL needs the JSON form, e.g. [\"/bin/bash\", \"-c\"]") end
  b.config.shell = ins.json
  b:chain(ins, json.encode(ins.json))
end

-- argv of CMD/ENTRYPOINT/RUN: exec form as is, shell form through SHELL.
function Build:argv(ins, text)
  if ins.json then return ins.json end
  local argv = copy_table(self.config.shell)
  argv[#argv + 1] = text or ins.args
  return argv
end

function H.CMD(b, ins)
  b.config.cmd = b:argv(ins)
  b:chain(ins, json.encode(b.config.cmd))
end

function H.ENTRYPOINT(b, ins)
  b.config.entrypoint = b:argv(ins)
  b.config.cmd = nil
  b:chain(ins, json.encode(b.config.entrypoint))
end

function H.EXPOSE(b, ins)
  for _, p in ipairs(dockerfile.words(b:expand(ins.args)) or {}) do
    b.config.expose[#b.config.expose + 1] = p
  end
  b:chain(ins, b:expand(ins.args))
end

function H.VOLUME(b, ins)
  b.config.volumes = ins.json or dockerfile.words(b:expand(ins.args))
  b:chain(ins, json.encode(b.config.volumes))
end

function H.STOPSIGNAL(b, ins)
  b.config.stopsignal = b:expand(ins.args)
  b:chain(ins, b.config.stopsignal)
end

function H.HEALTHCHECK(b, ins)
  b.config.healthcheck = ins.args
  b:chain(ins, ins.args)
end

-- Makes (or finds) the layer for key with make(fs); pushes it on the stack.
function Build:layer(ins, key, make)
  local t0 = engine.monotonic()
  local fs, hit, hold = self.store:ensure(key, function(fs)
    self:go_live()
    make(fs)
    return { created_by = ins.text, parent = self.keys[1] }
  end, self.timeout)
  if not fs then self:fail(ins, "%s", hit or "layer failed") end
  self.holds[#self.holds + 1] = hold   -- kept from prune until the image is recorded
  table.insert(self.layers, 1, fs)
  table.insert(self.keys, 1, key)
  self.key = key
  self.made = self.made + (hit and 0 or 1)
  self:progress(ins, hit and "cached" or string.format("%.2fs", engine.monotonic() - t0))
end

-- chmod -R for COPY --chmod.
local function chmod_tree(path, mode)
  local st = archive.stat(path)
  if not st or st.type == "link" then return end
  archive.chmod(path, mode)
  if st.type == "dir" then
    for _, n in ipairs(archive.list(path) or {}) do chmod_tree(path .. "/" .. n, mode) end
  end
end

-- Copies one context path src (stat st) to image path dest in layer fs.
function Build:place(ins, fs, src, st, dest, into_dir, o)
  if st.type == "dir" then
    -- the contents land in dest; dest itself keeps what ensure_dir gives it
    local existed = archive.stat(fs .. dest)
    assert(self:ensure_dir(fs, dest, o.uid, o.gid))
    local keep = assert(archive.stat(fs .. dest))
    if self.filtered[src] then
      self:copy_filtered(ins, src, src == self.context and "" or src:sub(#self.context + 2), fs .. dest, o)
    else
      local ok, err = archive.copy(src, fs .. dest, o)
      if not ok then self:fail(ins, "%s: %s", ins.cmd, err) end
    end
    if o.chmod then chmod_tree(fs .. dest, o.chmod) end
    if existed or not o.chmod then
      archive.chmod(fs .. dest, keep.mode)
      archive.chown(fs .. dest, keep.uid, keep.gid)
    end
    return
  end
  if o.add and st.type == "file" then
    assert(self:ensure_dir(fs, dest, o.uid, o.gid))
    local n, err = archive.extract(src, fs .. dest, { uid = o.chown and o.uid or nil, gid = o.gid })
    if n then return end
    if err ~= "not an archive" then self:fail(ins, "ADD %s: %s", basename(src), err) end
  end
  local target = into_dir and (dest .. "/" .. basename(src)) or dest
  assert(self:ensure_dir(fs, dirname(target), o.uid, o.gid))
  local ok, err = archive.copy(src, fs .. target, o)
  if not ok then self:fail(ins, "%s: %s", ins.cmd, err) end
  if o.chmod then chmod_tree(fs .. target, o.chmod) end
end

-- COPY and ADD: sources from the context (globs, directories), --chown,
-- --chmod; ADD unpacks local tar archives.
-- Copies what image path `path` shows through stack to layer path dst:
-- files and links as they are, directories merged across layers.
function Build:copy_from_stack(ins, stack, path, dst, o)
  local st, real = image.lookup(stack, path)
  if not st then self:fail(ins, "COPY --from: no such file in the stage: %s", path) end
  if st.type ~= "dir" then
    local ok, err = archive.copy(real, dst, o)
    if not ok then self:fail(ins, "COPY --from: %s", err) end
    return
  end
  if not archive.stat(dst) then assert(archive.mkdir(dst, st.mode, o.uid, o.gid)) end
  for _, n in ipairs(image.list_visible(stack, path) or {}) do
    self:copy_from_stack(ins, stack, (path == "/" and "" or path) .. "/" .. n, dst .. "/" .. n, o)
  end
end

-- The stage or image COPY --from names: {layers, key}.
function Build:from_source(ins, name)
  local stage = self.stages[name:lower()] or self.stage_list[(tonumber(name) or -2) + 1]
  if stage then return stage end
  local base, err = image.resolve_base(name, function() end, true)
  if not base then self:fail(ins, "COPY --from=%s: %s", name, err) end
  return base
end

-- Sources of COPY --from=stage: image paths; the key input is the stage's key.
function Build:stage_sources(ins, stage, words)
  local sources = {}
  for i = 1, #words - 1 do
    local p = clean_abs(words[i]:sub(1, 1) == "/" and words[i] or "/" .. words[i])
    if not image.lookup(stage.layers, p) then
      self:fail(ins, "COPY --from: no such file in the stage: %s", words[i])
    end
    sources[#sources + 1] = p
  end
  return sources, { "stage=" .. tostring(stage.key) }
end

-- Sources of COPY/ADD from the context (globs), with their digests.
-- A file holding the body of heredoc `doc` (expanded unless its delimiter
-- was quoted), in a private temp dir removed after the build.
function Build:heredoc_file(doc)
  if not self.heredoc_dir then
    self.heredoc_dir = assert(archive.mkdtemp(self.store.root .. "/tmp/heredoc-"))
  end
  local path = self.heredoc_dir .. "/" .. doc.name
  local f = assert(io.open(path, "wb"))
  f:write(doc.quoted and doc.body or self:expand(doc.body))
  f:close()
  archive.chmod(path, 420)   -- 0644
  return path
end

function Build:context_sources(ins, words)
  local sources, inputs = {}, {}
  local docs = {}
  for _, d in ipairs(ins.heredocs or {}) do docs[d.name] = d end
  for i = 1, #words - 1 do
    local doc = docs[words[i]:match("^<<%-?[\"']?([%a_][%w_]*)[\"']?$") or ""]
    if doc then
      local path = self:heredoc_file(doc)
      sources[#sources + 1] = path
      inputs[#inputs + 1] = "<<" .. doc.name .. "=" .. archive.sha256(layers_read(path))
      goto continue
    end
    if words[i]:match("^%a[%w+.-]*://") then self:fail(ins, "%s from a URL is not supported", ins.cmd) end
    local found = self:glob(ins, words[i])
    if #found == 0 then self:fail(ins, "%s: no such file in the context: %s", ins.cmd, words[i]) end
    for _, f in ipairs(found) do
      sources[#sources + 1] = f
      local digest, filtered = self:tree_digest(f)
      inputs[#inputs + 1] = f:sub(#self.context + 2) .. "=" .. digest
      if filtered then self.filtered[f] = true end
    end
    ::continue::
  end
  return sources, inputs
end

-- Owner and mode options of COPY/ADD.
function Build:copy_opts(ins)
  local o = { add = ins.cmd == "ADD", uid = 0, gid = 0, chown = ins.flags.chown }
  if ins.flags.chown then
    o.uid, o.gid = image.user_ids(self.layers, self:expand(ins.flags.chown))
    if not o.uid then self:fail(ins, "%s --chown: %s", ins.cmd, o.gid) end
  end
  if ins.flags.chmod then
    o.chmod = tonumber(ins.flags.chmod, 8)
    if not o.chmod then self:fail(ins, "%s --chmod: not an octal mode", ins.cmd) end
  end
  return o
end

-- COPY and ADD: sources from the context (globs, directories) or from an
-- earlier stage (--from), --chown, --chmod; ADD unpacks local tar archives.
local function copy_like(b, ins)
  for flag in pairs(ins.flags) do
    if flag ~= "chown" and flag ~= "chmod" and flag ~= "link" and (flag ~= "from" or ins.cmd ~= "COPY") then
      b:fail(ins, "%s --%s is not supported", ins.cmd, flag)
    end
  end
  local words = ins.json or dockerfile.words(b:expand(ins.args))
  if not words or #words < 2 then b:fail(ins, "%s needs a source and a destination", ins.cmd) end
  local dest = words[#words]
  local into_dir = dest:sub(-1) == "/" or #words > 2
  if dest:sub(1, 1) ~= "/" then dest = b.config.workdir .. "/" .. dest end
  dest = b:resolve_parent(clean_abs(dest))
  local stage = ins.flags.from and b:from_source(ins, b:expand(ins.flags.from))
  local sources, inputs
  if stage then sources, inputs = b:stage_sources(ins, stage, words)
  else sources, inputs = b:context_sources(ins, words) end
  into_dir = into_dir or #sources > 1
  local visible = image.lookup(b.layers, dest)
  if visible and visible.type == "dir" then into_dir = true end
  local o = b:copy_opts(ins)
  local key = sha(b.key, ins.cmd, json.encode(ins.flags), json.encode(words), dest,
    table.concat(inputs, "\n"))
  b:layer(ins, key, function(fs)
    for _, src in ipairs(sources) do
      if stage then
        local st = image.lookup(stage.layers, src)
        local target = (st.type ~= "dir" and into_dir) and (dest .. "/" .. basename(src)) or dest
        assert(b:ensure_dir(fs, dirname(target), o.uid, o.gid))
        b:copy_from_stack(ins, stage.layers, src, fs .. target, o)
        if o.chmod then chmod_tree(fs .. target, o.chmod) end
      else
        b:place(ins, fs, src, assert(archive.stat(src)), dest, into_dir, o)
      end
    end
  end)
end

H.COPY = copy_like
H.ADD = copy_like

-- Last n lines of s.
local function tail(s, n)
  local lines = {}
  for l in (s or ""):gmatch("[^\n]*") do lines[#lines + 1] = l end
  while #lines > 0 and lines[#lines] == "" do lines[#lines] = nil end
  return table.concat(lines, "\n", math.max(1, #lines - n + 1))
end

-- The env a RUN sees: the image env plus the build args.
function Build:run_env()
  local env = {}
  for k, v in pairs(self.args) do env[k] = v end
  for k, v in pairs(self.config.env) do env[k] = v end
  return env
end

function H.RUN(b, ins)
  for flag in pairs(ins.flags) do
    if flag ~= "network" then b:fail(ins, "RUN --%s is not supported", flag) end
  end
  local net = ins.flags.network
  if net ~= nil and net ~= "none" and net ~= "host" and net ~= "default" then
    b:fail(ins, "RUN --network=%s is not supported (none, host, default)", tostring(net))
  end
  local argv, stdin
  if ins.heredocs then
    local rest = ins.args:gsub("<<%-?[\"']?[%a_][%w_]*[\"']?", ""):gsub("^%s+", ""):gsub("%s+$", "")
    if rest == "" then argv = b:argv(ins, ins.heredocs[1].body)
    else argv, stdin = b:argv(ins, rest), ins.heredocs[1].body end
  else
    argv = b:argv(ins)
  end
  local env = b:run_env()
  local key = sha(b.key, "RUN", json.encode(argv), stdin or "")
  local network = (net == "none" or net == "host") and net or b.network
  b:layer(ins, key, function(fs)
    b:progress(ins, "running")
    local res, err = M.run_in_sandbox(b, fs, argv, env, stdin, network)
    if not res then b:fail(ins, "RUN: %s", err) end
    if res.code ~= 0 or res.timed_out then
      local out = tail((res.stdout or "") .. (res.stderr or ""), 20)
      if not b.quiet then io.stderr:write(out, "\n") end
      b:fail(ins, "RUN %s%s\n%s", res.timed_out and "timed out" or
        ("failed with exit code " .. tostring(res.code)),
        res.signal and (" (signal " .. tostring(res.signal) .. ")") or "", out)
    end
  end)
end

-- Runs argv in a build sandbox over the current stack whose writable
-- layer is fs. Returns the exec result or nil, err.
function M.run_in_sandbox(b, fs, argv, env, stdin, network)
  local sandbox = require "engine.sandbox"
  local ok, sb, serr = pcall(sandbox.new, {
    image = { layers = copy_table(b.layers), config = b.config },
    upper_dir = fs, network = network or b.network, workdir = b.config.workdir,
    env = env, user = b.config.user, labels = { build = b.short },
  })
  if not ok or not sb then return nil, "build sandbox: " .. tostring(ok and serr or sb) end
  local res <close> = setmetatable({}, { __close = function() sb:stop() end })
  local r, err = sb:exec(argv, { stdin = stdin, timeout = b.timeout, max_output = 1 << 20 })
  if not r then return nil, err end
  sb:stop()
  return r
end

-- FROM base [AS name]
function Build:from(ins)
  local words = dockerfile.words(dockerfile.expand(ins.args, self.global_args))
  if not words or not words[1] then self:fail(ins, "FROM needs an image") end
  local base = self.stages[words[1]:lower()]
  if not base then
    local err
    base, err = image.resolve_base(words[1], function(msg) self:warn(ins, msg) end)
    if not base then self:fail(ins, "FROM %s: %s", words[1], err) end
  end
  self.layers = copy_table(base.layers)
  self.keys = copy_table(base.keys or {})
  self.base = base.base or base
  self.config = image.normalize_config(copy_table(base.config))
  self.key = sha("FROM", base.key or words[1])
  self.args = {}
  self.stage_name = words[2] and words[2]:upper() == "AS" and words[3] and words[3]:lower() or nil
  self:progress(ins, "")
end

-- Keeps the finished stage for FROM and COPY --from (by name and index).
function Build:end_stage()
  local stage = { layers = copy_table(self.layers), keys = copy_table(self.keys),
                  config = copy_table(self.config), key = self.key, base = self.base }
  self.stage_list[#self.stage_list + 1] = stage   -- COPY --from=0 is the first
  if self.stage_name then self.stages[self.stage_name] = stage end
  for _, k in ipairs(stage.keys) do self.stage_keys[#self.stage_keys + 1] = k end
end

-- Runs every instruction; returns the resolved image.
function Build:run(instructions)
  local seen_from = false
  self.count = #instructions
  for i, ins in ipairs(instructions) do
    self.index = i
    if ins.cmd == "FROM" then
      if seen_from then self:end_stage() end
      self:from(ins)
      seen_from = true
    elseif not seen_from then
      if ins.cmd ~= "ARG" then self:fail(ins, "%s before FROM", ins.cmd) end
      declare_args(self, ins, self.global_args, self.global_args)
    else
      local h = H[ins.cmd]
      if not h then self:fail(ins, "unsupported instruction %s", ins.cmd) end
      h(self, ins)
      if ins.cmd ~= "COPY" and ins.cmd ~= "ADD" and ins.cmd ~= "RUN" then self:progress(ins, "") end
    end
  end
  if not seen_from then self:fail(nil, "no FROM instruction") end
end

-- build(store, image_table, spec) -> {layers, config, key, keys, made} | nil, err
function M.build(store, img, spec)
  local path = img.dockerfile
  local text = path and layers_read(path)
  if not text then return nil, tostring(path) .. ": cannot read the Dockerfile" end
  local context = archive.realpath(img.context or dirname(path))
  if not context then return nil, tostring(img.context) .. ": no such build context" end
  local parsed, perr = dockerfile.parse(text, path)
  if not parsed then return nil, perr end
  local quiet = (img.quiet or os.getenv("ENGINE_IMAGE_QUIET") == "1") and not img.progress
  local b = setmetatable({
    store = store, file = path, short = path:match("[^/]+/[^/]+$") or path, context = context,
    build_args = img.args or {}, args = {}, global_args = {}, quiet = quiet,
    network = img.network or "host", timeout = img.timeout, made = 0, filtered = {},
    stages = {}, stage_list = {}, stage_keys = {}, buffered = {}, progress_fn = img.progress,
    holds = require("engine.layers").hold_list(),
  }, Build)
  local holds <close> = b.holds
  b.ignore, b.ignore_keep = ignore.load(context)
  local ok, err = pcall(b.run, b, parsed.instructions)
  if b.heredoc_dir then archive.remove(b.heredoc_dir) end
  if not ok then
    if getmetatable(err) == BUILD_ERROR then return nil, err.message end
    error(err, 0)
  end
  local name = "dockerfile:" .. (archive.realpath(path) or path) .. " context:" .. context
  store:record { name = name, kind = "dockerfile", layers = b.keys, config = b.config,
                 stage_layers = json.array(b.stage_keys),
                 base = b.base.layers[#b.base.layers] == "host" and "host" or nil }
  return { layers = b.layers, config = b.config, key = b.key, keys = b.keys, made = b.made }
end

M.Build = Build
return M
