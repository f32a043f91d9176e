-- engine.dockerfile: parses a Dockerfile into instructions, and the small
-- shell-like helpers a build needs: variable expansion ($X, ${X},
-- ${X:-word}, ${X:+word}), word splitting with quotes, KEY=VALUE pairs.
--
-- parse(text, filename) -> {instructions = {...}} or nil, "FILE:LINE: msg".
-- Each instruction: {cmd = "COPY", line = N, args = "rest of the line",
-- flags = {chown = "1:1"}, json = {...} (exec form) or nil, heredocs =
-- {{name=, body=, strip=}}, text = "COPY ..." (the whole logical line)}.
local json = require "engine.json"

local M = {}

local KNOWN = {
  FROM = true, RUN = true, CMD = true, LABEL = true, MAINTAINER = true,
  EXPOSE = true, ENV = true, ADD = true, COPY = true, ENTRYPOINT = true,
  VOLUME = true, USER = true, WORKDIR = true, ARG = true, ONBUILD = true,
  STOPSIGNAL = true, HEALTHCHECK = true, SHELL = true,
}

-- Instructions whose leading --flags are parsed out of args.
local FLAGGED = { COPY = true, ADD = true, RUN = true, FROM = true, HEALTHCHECK = true }

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- Reads leading parser directives (# escape=`, # syntax=...).
local function directives(lines)
  local d, i = { escape = "\\" }, 1
  while lines[i] do
    local k, v = lines[i]:match("^%s*#%s*([%a_]+)%s*=%s*(%S+)%s*$")
    if not k then break end
    d[k:lower()] = v
    i = i + 1
  end
  return d
end

-- Splits off leading "--name=value" flags. Returns flags, rest.
local function split_flags(args)
  local flags = {}
  while true do
    local name, value, rest = args:match("^%-%-([%w%-]+)=(%S*)%s*(.*)$")
    if not name then
      name, rest = args:match("^%-%-([%w%-]+)%s+(.*)$")
      if not name then break end
      value = true
    end
    flags[name] = value
    args = rest
  end
  return flags, args
end

-- Heredoc markers in args: <<EOF, <<-EOF, <<"EOF", <<'EOF'.
local function heredoc_markers(args)
  local found = {}
  for dash, q, name in args:gmatch("<<(%-?)([\"']?)([%a_][%w_]*)%2") do
    found[#found + 1] = { name = name, strip = dash == "-", quoted = q ~= "" }
  end
  return found
end

-- Reads heredoc bodies starting at lines[i]. Returns next index or nil.
local function read_heredocs(lines, i, docs)
  for _, doc in ipairs(docs) do
    local body = {}
    while true do
      local l = lines[i]
      if l == nil then return nil, doc.name end
      i = i + 1
      local cmp = doc.strip and l:gsub("^\t+", "") or l
      if cmp == doc.name then break end
      body[#body + 1] = cmp
    end
    doc.body = table.concat(body, "\n") .. "\n"
  end
  return i
end

-- Parses the JSON (exec) form, or nil when args are not a JSON string array.
local function exec_form(args)
  if not args:match("^%[") then return nil end
  local ok, v = pcall(json.decode, args)
  if not ok or type(v) ~= "table" then return nil end
  for i = 1, #v do if type(v[i]) ~= "string" then return nil end end
  return v
end

-- Joins continuation lines into one logical instruction starting at i.
-- Returns text, next index. Comment lines inside are dropped.
local function logical_line(lines, i, esc)
  local parts = {}
  while lines[i] do
    local l = lines[i]
    i = i + 1
    if #parts == 0 or not l:match("^%s*#") then
      local body = l:gsub("%s+$", "")
      if body:sub(-1) == esc and body:sub(-2, -2) ~= esc then
        parts[#parts + 1] = body:sub(1, -2)
      elseif #parts > 0 and body == "" then
        -- an empty line inside a continuation is skipped
      else
        parts[#parts + 1] = body
        break
      end
    end
  end
  return table.concat(parts), i
end

-- parse(text, filename) -> {instructions, directives} | nil, err
function M.parse(text, filename)
  filename = filename or "Dockerfile"
  local lines = {}
  for l in (text:gsub("\r\n", "\n") .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local d = directives(lines)
  local out, i = {}, 1
  while i <= #lines do
    local start = i
    local l = lines[i]
    if l:match("^%s*$") or l:match("^%s*#") then
      i = i + 1
    else
      local logical
      logical, i = logical_line(lines, i, d.escape)
      local cmd, args = trim(logical):match("^(%S+)%s*(.*)$")
      local ins = { cmd = cmd:upper(), line = start, args = args, flags = {}, text = trim(logical) }
      if not KNOWN[ins.cmd] then
        return nil, string.format("%s:%d: unknown instruction %s", filename, start, cmd)
      end
      if FLAGGED[ins.cmd] then ins.flags, ins.args = split_flags(args) end
      ins.json = exec_form(ins.args)
      local docs = (ins.cmd == "RUN" or ins.cmd == "COPY") and heredoc_markers(ins.args) or {}
      if #docs > 0 and not ins.json then
        local nexti, missing = read_heredocs(lines, i, docs)
        if not nexti then
          return nil, string.format("%s:%d: heredoc %s is not terminated", filename, start, missing)
        end
        ins.heredocs, i = docs, nexti
      end
      out[#out + 1] = ins
    end
  end
  return { instructions = out, directives = d }
end

-- Expands $NAME, ${NAME}, ${NAME:-word}, ${NAME:+word}, ${NAME-word}
-- in s from vars; "\$" is a literal "$". Unset names expand to "".
function M.expand(s, vars)
  local function lookup(name, op, word)
    local v = vars[name]
    if op == ":-" then return (v == nil or v == "") and M.expand(word, vars) or v end
    if op == "-" then return v == nil and M.expand(word, vars) or v end
    if op == ":+" then return (v ~= nil and v ~= "") and M.expand(word, vars) or "" end
    if op == "+" then return v ~= nil and M.expand(word, vars) or "" end
    return v or ""
  end
  local out, i = {}, 1
  while i <= #s do
    local c = s:sub(i, i)
    if c == "\\" and s:sub(i + 1, i + 1) == "$" then
      out[#out + 1], i = "$", i + 2
    elseif c == "$" then
      local name, op, word, stop = s:match("^{([%a_][%w_]*)([:]?[%-+]?)([^}]*)}()", i + 1)
      if name then
        out[#out + 1], i = lookup(name, op ~= "" and op or nil, word), stop
      else
        name, stop = s:match("^([%a_][%w_]*)()", i + 1)
        if name then out[#out + 1], i = lookup(name), stop
        else out[#out + 1], i = "$", i + 1 end
      end
    else
      out[#out + 1], i = c, i + 1
    end
  end
  return table.concat(out)
end

-- Splits s into words: whitespace separates, quotes group, and backslash
-- escapes the next character (not inside single quotes). Quotes are removed.
function M.words(s)
  local words, cur, q, have = {}, {}, nil, false
  local i = 1
  while i <= #s do
    local c = s:sub(i, i)
    if q then
      if c == q then q = nil
      elseif c == "\\" and q == '"' and s:sub(i + 1, i + 1):match('["\\$]') then
        i = i + 1
        cur[#cur + 1] = s:sub(i, i)
      else cur[#cur + 1] = c end
    elseif c == '"' or c == "'" then q, have = c, true
    elseif c == "\\" and i < #s then
      i = i + 1
      cur[#cur + 1], have = s:sub(i, i), true
    elseif c:match("%s") then
      if have or #cur > 0 then words[#words + 1] = table.concat(cur) end
      cur, have = {}, false
    else cur[#cur + 1], have = c, true end
    i = i + 1
  end
  if q then return nil, "unterminated quote" end
  if have or #cur > 0 then words[#words + 1] = table.concat(cur) end
  return words
end

-- KEY=VALUE pairs (ENV, LABEL, ARG), or the legacy "ENV KEY value words"
-- form when allow_legacy. Values are expanded from vars when given.
-- Returns a list of {key, value} or nil, err.
function M.pairs(s, vars, allow_legacy)
  local first = s:match("^%S+")
  if allow_legacy and first and not first:find("=", 1, true) then
    local key, rest = s:match("^(%S+)%s*(.*)$")
    local ws, err = M.words(vars and M.expand(rest, vars) or rest)
    if not ws then return nil, err end
    return { { key, table.concat(ws, " ") } }
  end
  local ws, err = M.words(vars and M.expand(s, vars) or s)
  if not ws then return nil, err end
  local out = {}
  for _, w in ipairs(ws) do
    local k, v = w:match("^([^=]+)=(.*)$")
    if not k then return nil, "expected KEY=VALUE, got '" .. w .. "'" end
    out[#out + 1] = { k, v }
  end
  return out
end

return M
