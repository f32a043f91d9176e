-- engine.toml: a TOML 1.0.0 reader in pure Lua 5.4.
--
-- toml.parse(text [, filename]) -> table | nil, "FILE:LINE:COL: message"
-- toml.read(path)               -> table | nil, msg
--
-- Strings, integers, floats and booleans map to the Lua types; arrays are
-- sequences carrying `toml.array_mt` (so an empty array differs from an empty
-- table); date/time values are tables carrying `toml.datetime_mt`.
--
-- The parser is a hand-written recursive descent over byte positions. Syntax
-- errors are raised internally as a tagged error object and turned into a
-- `nil, msg` return at the API boundary; every other error propagates.

local M = {}

local byte, sub, find, match = string.byte, string.sub, string.find, string.match
local format, gsub = string.format, string.gsub
local tointeger, mtype = math.tointeger, math.type

M.array_mt = { __name = "toml.array" }
M.datetime_mt = { __name = "toml.datetime" }

-- True when `v` is a TOML array produced by this module.
function M.is_array(v)
  return getmetatable(v) == M.array_mt
end

local BOM = "\239\187\191"
local INTEGER_MAX = math.maxinteger
local MAX_DEPTH = 1000 -- nested arrays / inline tables

---------------------------------------------------------------------------
-- Date/time values
---------------------------------------------------------------------------

-- Fraction digits padded to at least milliseconds, as toml-test prints them.
local function frac_text(frac)
  if not frac then return "" end
  if #frac < 3 then frac = frac .. string.rep("0", 3 - #frac) end
  return "." .. frac
end

-- RFC 3339 text: 'T' separator, seconds always present, upper-case 'Z'.
function M.datetime_mt.__tostring(d)
  local date, time = "", ""
  if d.year then date = format("%04d-%02d-%02d", d.year, d.month, d.day) end
  if d.hour then
    time = format("%02d:%02d:%02d", d.hour, d.min, d.sec) .. frac_text(d.frac)
  end
  local sep = (date ~= "" and time ~= "") and "T" or ""
  return date .. sep .. time .. (d.offset or "")
end

local function is_leap(y)
  return y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0)
end

local MONTH_DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }

local function days_in(y, m)
  if m == 2 and is_leap(y) then return 29 end
  return MONTH_DAYS[m]
end

---------------------------------------------------------------------------
-- Errors and positions
---------------------------------------------------------------------------

local parse_error_mt = {}

-- Raise a syntax error at byte position `pos`; caught by M.parse.
local function fail(pos, fmt, ...)
  error(setmetatable({ pos = pos, msg = format(fmt, ...) }, parse_error_mt), 0)
end

-- 1-based line and column (in characters) of byte position `pos` in `s`.
local function line_col(s, pos)
  local line, start = 1, 1
  for nl in string.gmatch(sub(s, 1, pos - 1), "()\n") do
    line, start = line + 1, nl + 1
  end
  local col = select(2, gsub(sub(s, start, pos - 1), "[^\128-\191]", "")) + 1
  return line, col
end

-- Printable name of the byte at `pos`, for messages.
local function describe(s, pos)
  local c = byte(s, pos)
  if not c then return "end of file" end
  if c == 10 then return "newline" end
  if c < 32 or c == 127 then return format("control character U+%04X", c) end
  return format("'%s'", match(s, "^[%z\1-\127\194-\244][\128-\191]*", pos))
end

-- Fail at `pos`, naming the character found there and `what` was expected.
local function unexpected(s, pos, what)
  fail(pos, "unexpected %s, expected %s", describe(s, pos), what)
end

---------------------------------------------------------------------------
-- Whitespace, comments, newlines
---------------------------------------------------------------------------

-- Skip spaces and tabs; returns the next position.
local function skip_ws(s, i)
  return select(2, find(s, "^[ \t]*", i)) + 1
end

-- Skip a comment starting at `i` (which holds '#'), rejecting control
-- characters; returns the position of the terminating newline or EOF.
local function skip_comment(s, i)
  local j = find(s, "[%z\1-\8\10-\31\127]", i)
  if not j then return #s + 1 end
  if byte(s, j) == 10 or (byte(s, j) == 13 and byte(s, j + 1) == 10) then
    return j
  end
  fail(j, "%s in comment", describe(s, j))
end

-- If a newline (LF or CRLF) starts at `i`, return the position after it.
local function newline_at(s, i)
  local c = byte(s, i)
  if c == 10 then return i + 1 end
  if c == 13 and byte(s, i + 1) == 10 then return i + 2 end
  return nil
end

-- Skip whitespace, comments and newlines (inside arrays).
local function skip_wsnl(s, i)
  while true do
    i = skip_ws(s, i)
    if byte(s, i) == 35 then i = skip_comment(s, i) end
    local n = newline_at(s, i)
    if not n then return i end
    i = n
  end
end

-- Expect optional whitespace/comment then a newline or EOF.
local function end_of_line(s, i)
  i = skip_ws(s, i)
  if byte(s, i) == 35 then i = skip_comment(s, i) end
  if i > #s then return i end
  return newline_at(s, i) or unexpected(s, i, "end of line")
end

---------------------------------------------------------------------------
-- Strings
---------------------------------------------------------------------------

local ESCAPES = {
  b = "\b", t = "\t", n = "\n", f = "\f", r = "\r", ['"'] = '"', ["\\"] = "\\",
}

-- Decode the escape whose backslash is at `i`; returns text and next position.
local function escape(s, i)
  local c = sub(s, i + 1, i + 1)
  if ESCAPES[c] then return ESCAPES[c], i + 2 end
  local len = (c == "u" and 4) or (c == "U" and 8)
  if not len then fail(i, "invalid escape sequence: '\\' then %s", describe(s, i + 1)) end
  local hex = match(s, "^" .. string.rep("%x", len), i + 2)
  if not hex then fail(i, "\\%s needs %d hex digits", c, len) end
  local cp = tonumber(hex, 16)
  if cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then
    fail(i, "escape \\%s%s is not a Unicode scalar value", c, hex)
  end
  return utf8.char(cp), i + 2 + len
end

-- Report a forbidden character found inside a string at `j`.
local function bad_string_char(s, j)
  if byte(s, j) == nil or newline_at(s, j) then fail(j, "unterminated string") end
  fail(j, "%s in string", describe(s, j))
end

-- Basic string "..." opening at `i`; returns value and next position.
local function basic_string(s, i)
  local parts, j = {}, i + 1
  while true do
    local k = find(s, '["\\%z\1-\8\10-\31\127]', j)
    if not k then bad_string_char(s, #s + 1) end
    parts[#parts + 1] = sub(s, j, k - 1)
    local c = byte(s, k)
    if c == 34 then return table.concat(parts), k + 1 end
    if c ~= 92 then bad_string_char(s, k) end
    parts[#parts + 1], j = escape(s, k)
  end
end

-- Literal string '...' opening at `i`; returns value and next position.
local function literal_string(s, i)
  local k = find(s, "['%z\1-\8\10-\31\127]", i + 1)
  if not k then bad_string_char(s, #s + 1) end
  if byte(s, k) ~= 39 then bad_string_char(s, k) end
  return sub(s, i + 1, k - 1), k + 1
end

-- In a multi-line string, a run of quotes at `k`: returns the quotes that
-- belong to the content and whether the string ended, plus the next position.
local function quote_run(s, k, q)
  local n = select(2, find(s, "^" .. q .. "*", k)) - k + 1
  if n < 3 then return string.rep(q, n), false, k + n end
  if n > 5 then fail(k + 5, "too many quotes ending a multi-line string") end
  return string.rep(q, n - 3), true, k + n
end

-- Backslash at `k` in a multi-line basic string: a line-ending backslash
-- swallows whitespace and newlines; anything else is an ordinary escape.
local function ml_escape(s, k)
  local j = skip_ws(s, k + 1)
  if not newline_at(s, j) then return escape(s, k) end
  while true do
    local n = newline_at(s, j)
    if not n then return "", j end
    j = skip_ws(s, n)
  end
end

-- Multi-line string opening at `i` (`"""` or `'''`); returns value and next
-- position. CRLF inside the content is normalised to LF.
local function multiline_string(s, i, q)
  local stop = q == '"' and '["\\%z\1-\8\11-\31\127]' or "['%z\1-\8\11-\31\127]"
  local parts, j = {}, newline_at(s, i + 3) or i + 3
  while true do
    local k = find(s, stop, j)
    if not k then fail(#s + 1, "unterminated multi-line string") end
    parts[#parts + 1] = sub(s, j, k - 1)
    local c, text, done = byte(s, k), nil, false
    if c == byte(q) then
      text, done, j = quote_run(s, k, q)
    elseif c == 92 then
      text, j = ml_escape(s, k)
    elseif c == 13 and byte(s, k + 1) == 10 then
      text, j = "\n", k + 2
    else
      fail(k, "%s in string", describe(s, k))
    end
    parts[#parts + 1] = text
    if done then return table.concat(parts), j end
  end
end

-- Any string opening at `i`; `single_line` rejects the multi-line forms.
local function string_value(s, i, single_line)
  local q = sub(s, i, i)
  if sub(s, i, i + 2) == q .. q .. q then
    if single_line then fail(i, "multi-line string not allowed here") end
    return multiline_string(s, i, q)
  end
  if q == '"' then return basic_string(s, i) end
  return literal_string(s, i)
end

---------------------------------------------------------------------------
-- Keys
---------------------------------------------------------------------------

-- Dotted key at `i`; returns list of key strings, their start positions, and
-- the position after the key.
local function parse_key(s, i)
  local keys, at = {}, {}
  while true do
    local c, k, j = byte(s, i), nil, nil
    if c == 34 or c == 39 then
      k, j = string_value(s, i, true)
    else
      k = match(s, "^[A-Za-z0-9_%-]+", i)
      if not k then unexpected(s, i, "a key") end
      j = i + #k
    end
    keys[#keys + 1], at[#at + 1] = k, i
    j = skip_ws(s, j)
    if byte(s, j) ~= 46 then return keys, at, j end
    i = skip_ws(s, j + 1)
  end
end

---------------------------------------------------------------------------
-- Numbers and dates
---------------------------------------------------------------------------

-- True when underscores in `digits` each sit between two digits.
local function good_underscores(digits)
  return not (find(digits, "^_") or find(digits, "_$") or find(digits, "__"))
end

-- Integer in base 2, 8 or 16 from `digits` (underscores removed); nil when it
-- exceeds the signed 64-bit range.
local function based_integer(digits, base)
  local v = 0
  for d in string.gmatch(digits, ".") do
    local n = tonumber(d, base)
    if v > (INTEGER_MAX - n) // base then return nil end
    v = v * base + n
  end
  return v
end

-- Prefixed integer 0x / 0o / 0b; nil when `tok` is not of that form.
local function prefixed_integer(tok, pos)
  local p, digits = match(tok, "^0([xob])(.*)$")
  if not p then return nil end
  local class = ({ x = "^[%x_]+$", o = "^[0-7_]+$", b = "^[01_]+$" })[p]
  if not match(digits, class) or not good_underscores(digits) then
    fail(pos, "invalid integer '%s'", tok)
  end
  local v = based_integer(gsub(digits, "_", ""), ({ x = 16, o = 8, b = 2 })[p])
  return v or fail(pos, "integer '%s' out of 64-bit range", tok)
end

-- Decimal integer with optional sign; nil when `tok` is not of that form.
local function decimal_integer(tok, pos)
  local digits = match(tok, "^[%+%-]?([0-9_]+)$")
  if not digits then return nil end
  if not good_underscores(digits) or not find(digits, "^%d") then
    fail(pos, "invalid integer '%s'", tok)
  end
  if find(digits, "^0[0-9_]") then fail(pos, "leading zero in '%s'", tok) end
  local v = tonumber((gsub(tok, "_", "")))
  if mtype(v) ~= "integer" then fail(pos, "integer '%s' out of 64-bit range", tok) end
  return v
end

local SPECIAL_FLOATS = {
  inf = math.huge, ["+inf"] = math.huge, ["-inf"] = -math.huge,
  nan = 0 / 0, ["+nan"] = 0 / 0, ["-nan"] = -(0 / 0),
}

-- Float with optional fraction and exponent; nil when `tok` is not a float.
local function float_value(tok, pos)
  if SPECIAL_FLOATS[tok] then return SPECIAL_FLOATS[tok] end
  local int, frac, exp = match(tok, "^[%+%-]?([0-9_]+)(%.?[0-9_]*)([eE]?[%+%-]?[0-9_]*)$")
  if not int or (frac == "" and exp == "") then return nil end
  local ok = good_underscores(int) and find(int, "^%d") and not find(int, "^0[0-9_]")
  if frac ~= "" then ok = ok and match(frac, "^%.%d[0-9_]*$") and good_underscores(sub(frac, 2)) end
  if exp ~= "" then
    local e = match(exp, "^[eE][%+%-]?(%d[0-9_]*)$")
    ok = ok and e and good_underscores(e)
  end
  if not ok then fail(pos, "invalid number '%s'", tok) end
  return tonumber((gsub(tok, "_", "")))
end

-- Parse "HH:MM:SS[.frac][offset]" into `d`; returns the unparsed rest.
local function parse_time(d, str, pos)
  local h, mi, sec, rest = match(str, "^(%d%d):(%d%d):(%d%d)(.*)$")
  if not h then fail(pos, "invalid time in '%s'", str) end
  d.hour, d.min, d.sec = tointeger(h), tointeger(mi), tointeger(sec)
  if d.hour > 23 or d.min > 59 or d.sec > 60 then fail(pos, "time out of range in '%s'", str) end
  if sub(rest, 1, 1) == "." then
    d.frac, rest = match(rest, "^%.(%d+)(.*)$")
    if not d.frac then fail(pos, "invalid fraction of a second in '%s'", str) end
  end
  return rest
end

-- Parse a time offset ("Z" or "+HH:MM") into `d`.
local function parse_offset(d, rest, pos)
  if rest == "Z" or rest == "z" then d.offset = "Z"; return end
  local oh, om = match(rest, "^[%+%-](%d%d):(%d%d)$")
  if not oh or tointeger(oh) > 23 or tointeger(om) > 59 then
    fail(pos, "invalid time offset '%s'", rest)
  end
  d.offset = rest
end

-- Date, date-time or time token; nil when `tok` does not look like one.
local function datetime_value(tok, pos)
  local d = setmetatable({}, M.datetime_mt)
  if match(tok, "^%d%d:") then
    if parse_time(d, tok, pos) ~= "" then fail(pos, "invalid local time '%s'", tok) end
    d.kind = "time-local"
    return d
  end
  local y, mo, day, rest = match(tok, "^(%d%d%d%d)%-(%d%d)%-(%d%d)(.*)$")
  if not y then return nil end
  d.year, d.month, d.day = tointeger(y), tointeger(mo), tointeger(day)
  if d.month < 1 or d.month > 12 or d.day < 1 or d.day > days_in(d.year, d.month) then
    fail(pos, "invalid date '%s'", tok)
  end
  if rest == "" then d.kind = "date-local"; return d end
  if not match(rest, "^[Tt]") then fail(pos, "invalid date-time '%s'", tok) end
  rest = parse_time(d, sub(rest, 2), pos)
  if rest == "" then d.kind = "datetime-local"; return d end
  parse_offset(d, rest, pos)
  d.kind = "datetime"
  return d
end

local TOKEN = "^[A-Za-z0-9_:%.%+%-]+"

-- Bare scalar (boolean, number, date/time) at `i`; returns value and next
-- position. A date followed by a space and a time forms one date-time.
local function scalar(s, i)
  local tok = match(s, TOKEN, i)
  if not tok then unexpected(s, i, "a value") end
  local j = i + #tok
  if match(tok, "^%d%d%d%d%-%d%d%-%d%d$") and match(s, "^ %d%d:", j) then
    local time = match(s, TOKEN, j + 1)
    tok, j = tok .. "T" .. time, j + 1 + #time
  end
  if tok == "true" then return true, j end
  if tok == "false" then return false, j end
  local v = datetime_value(tok, i) or prefixed_integer(tok, i)
  if v == nil then v = decimal_integer(tok, i) end
  if v == nil then v = float_value(tok, i) end
  if v == nil then fail(i, "invalid value '%s'", tok) end
  return v, j
end

---------------------------------------------------------------------------
-- Tables: definition rules
---------------------------------------------------------------------------
-- p.kind[t] records how each table came to be:
--   "implicit" created as a parent in a [header]; may be defined later once
--   "header"   defined by [header] or [[header]] (or the root)
--   "dotted"   created by a dotted key; extendable only by dotted keys
--   "inline"   inline table (or inside one): immutable
--   "aot"      an array of tables created by [[header]]

-- Fail at the n-th part of a dotted key, naming the path up to it.
local function key_error(at, keys, n, what)
  local name = table.concat(keys, ".", 1, n)
  fail(at[n], "%s '%s'", what, name)
end

-- Assign `keys` = `val` inside table `t`, creating dotted tables on the way.
local function set_dotted(p, t, keys, at, val)
  for n = 1, #keys - 1 do
    local v = t[keys[n]]
    if v == nil then
      v = {}
      p.kind[v], t[keys[n]] = "dotted", v
    elseif p.kind[v] ~= "dotted" then
      key_error(at, keys, n, "cannot add keys to already defined")
    end
    t = v
  end
  if t[keys[#keys]] ~= nil then key_error(at, keys, #keys, "duplicate key") end
  t[keys[#keys]] = val
end

-- Walk the parents of a [header] path from the root, creating implicit tables
-- and descending into the last element of arrays of tables.
local function header_parent(p, keys, at)
  local t = p.root
  for n = 1, #keys - 1 do
    local v = t[keys[n]]
    local kind = p.kind[v]
    if v == nil then
      v = {}
      p.kind[v], t[keys[n]] = "implicit", v
    elseif kind == "aot" then
      v = v[#v]
    elseif kind ~= "implicit" and kind ~= "header" and kind ~= "dotted" then
      key_error(at, keys, n, "cannot extend")
    end
    t = v
  end
  return t
end

-- [a.b.c]: define (or complete an implicit) table and make it current.
local function table_header(p, keys, at)
  local parent, last = header_parent(p, keys, at), keys[#keys]
  local t = parent[last]
  if t == nil then
    t = {}
    parent[last] = t
  elseif p.kind[t] ~= "implicit" then
    key_error(at, keys, #keys, "cannot redefine")
  end
  p.kind[t] = "header"
  return t
end

-- [[a.b.c]]: append a new table to an array of tables and make it current.
local function array_header(p, keys, at)
  local parent, last = header_parent(p, keys, at), keys[#keys]
  local arr = parent[last]
  if arr == nil then
    arr = setmetatable({}, M.array_mt)
    p.kind[arr], parent[last] = "aot", arr
  elseif p.kind[arr] ~= "aot" then
    key_error(at, keys, #keys, "cannot append to non-array-of-tables")
  end
  local t = {}
  p.kind[t] = "header"
  arr[#arr + 1] = t
  return t
end

-- Freeze an inline table and the dotted tables created within it.
local function mark_inline(p, t)
  p.kind[t] = "inline"
  for _, v in pairs(t) do
    if p.kind[v] == "dotted" then mark_inline(p, v) end
  end
end

---------------------------------------------------------------------------
-- Values
---------------------------------------------------------------------------

local value

-- Array "[...]" opening at `i`; returns the array and next position.
local function array_value(p, i)
  local s, arr = p.s, setmetatable({}, M.array_mt)
  local j = skip_wsnl(s, i + 1)
  while byte(s, j) ~= 93 do
    arr[#arr + 1], j = value(p, j)
    j = skip_wsnl(s, j)
    local c = byte(s, j)
    if c == 44 then
      j = skip_wsnl(s, j + 1)
    elseif c ~= 93 then
      unexpected(s, j, "',' or ']'")
    end
  end
  return arr, j + 1
end

local keyval

-- Inline table "{...}" opening at `i`; returns the table and next position.
local function inline_table(p, i)
  local s, t = p.s, {}
  local j = skip_ws(s, i + 1)
  if byte(s, j) ~= 125 then
    while true do
      j = skip_ws(s, keyval(p, t, j))
      local c = byte(s, j)
      if c == 125 then break end
      if c ~= 44 then unexpected(s, j, "',' or '}'") end
      j = skip_ws(s, j + 1)
    end
  end
  mark_inline(p, t)
  return t, j + 1
end

-- Any value at `i`; returns the value and next position. Nesting is bounded
-- so hostile input gets a parse error rather than a Lua stack overflow.
function value(p, i)
  local c = byte(p.s, i)
  if c == 34 or c == 39 then return string_value(p.s, i) end
  if c ~= 91 and c ~= 123 then return scalar(p.s, i) end
  if p.depth >= MAX_DEPTH then fail(i, "nesting deeper than %d levels", MAX_DEPTH) end
  p.depth = p.depth + 1
  local v, j = (c == 91 and array_value or inline_table)(p, i)
  p.depth = p.depth - 1
  return v, j
end

-- "key = value" at `i`, stored into `t`; returns the position after it.
function keyval(p, t, i)
  local s = p.s
  local keys, at, j = parse_key(s, i)
  if byte(s, j) ~= 61 then unexpected(s, j, "'='") end
  local v
  v, j = value(p, skip_ws(s, j + 1))
  set_dotted(p, t, keys, at, v)
  return j
end

---------------------------------------------------------------------------
-- Document
---------------------------------------------------------------------------

-- "[key]" or "[[key]]" at `i`; switches p.current; returns position after.
local function header(p, i)
  local s = p.s
  local aot = byte(s, i + 1) == 91
  local keys, at, j = parse_key(s, skip_ws(s, i + (aot and 2 or 1)))
  local close = aot and "]]" or "]"
  if sub(s, j, j + #close - 1) ~= close then unexpected(s, j, "'" .. close .. "'") end
  p.current = (aot and array_header or table_header)(p, keys, at)
  return j + #close
end

-- One line of the document at `i`; returns the start of the next line.
local function line(p, i)
  local s = p.s
  i = skip_ws(s, i)
  local c = byte(s, i)
  if c == 91 then
    i = header(p, i)
  elseif c ~= 35 and c ~= 10 and c ~= 13 and c ~= nil then
    i = keyval(p, p.current, i)
  end
  return end_of_line(s, i)
end

-- Parse the whole document; raises parse errors.
local function document(s)
  local ok, bad = utf8.len(s)
  if not ok then fail(bad, "invalid UTF-8") end
  local root = {}
  local p = { s = s, root = root, current = root, kind = { [root] = "header" }, depth = 0 }
  local i = sub(s, 1, 3) == BOM and 4 or 1
  while i <= #s do i = line(p, i) end
  return root
end

-- Parse TOML `text`; returns the table, or nil and "FILE:LINE:COL: message".
function M.parse(text, filename)
  if type(text) ~= "string" then error("toml.parse: text must be a string", 2) end
  filename = filename or "<string>"
  local ok, res = pcall(document, text)
  if ok then return res end
  if getmetatable(res) ~= parse_error_mt then error(res, 0) end
  local line_no, col = line_col(text, res.pos)
  local msg = gsub(res.msg, "%c", function(c) return format("\\x%02X", byte(c)) end)
  return nil, format("%s:%d:%d: %s", filename, line_no, col, msg)
end

-- Read and parse the file at `path`; returns the table or nil, msg.
function M.read(path)
  local f, err, code = io.open(path, "rb")
  if not f then
    if code == 2 then return nil, path .. ": no such file" end -- ENOENT
    return nil, err
  end
  local text = f:read("a")
  f:close()
  if not text then return nil, path .. ": read error" end
  return M.parse(text, path)
end

return M
