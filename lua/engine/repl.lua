-- engine repl [FILE.lua] [--task NAME]: interactive Lua with the engine
-- loaded. Every line runs as its own task, so blocking primitives just work;
-- Ctrl-C cancels the running line (or clears the prompt), Ctrl-D exits.
-- Given an environment file, the session plays one of its tasks
-- (engine.play): task, sb, ctx, sh(), score() and reset() are at hand.
local engine = require "engine"

local M = {}

local MAX_DEPTH = 4
local MAX_ITEMS = 50

-- ---- printing values --------------------------------------------------------

local function is_identifier(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" or ta == "string" then return a < b end
    return tostring(a) < tostring(b)
  end)
  return keys
end

local render

local function render_key(k, seen, depth)
  if is_identifier(k) then return k end
  return "[" .. render(k, seen, depth) .. "]"
end

-- Renders a table: sequence items first, then the other keys sorted;
-- depth-limited, long tables cut, cycles marked.
local function render_table(t, seen, depth, indent)
  if seen[t] then return "<cycle " .. tostring(t) .. ">" end
  local mt = getmetatable(t)
  if mt and mt.__tostring then return tostring(t) end
  if depth >= MAX_DEPTH then return "{...}" end
  seen[t] = true
  local parts, n = {}, #t
  for i = 1, math.min(n, MAX_ITEMS) do parts[#parts + 1] = render(t[i], seen, depth + 1, indent .. "  ") end
  for _, k in ipairs(sorted_keys(t)) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then
      if #parts >= MAX_ITEMS then parts[#parts + 1] = "..." break end
      parts[#parts + 1] = render_key(k, seen, depth + 1) .. " = " .. render(t[k], seen, depth + 1, indent .. "  ")
    end
  end
  seen[t] = nil
  if #parts == 0 then return "{}" end
  local flat = "{ " .. table.concat(parts, ", ") .. " }"
  if #flat <= 78 then return flat end
  return "{\n" .. indent .. "  " .. table.concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end

render = function(v, seen, depth, indent)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) == "table" then return render_table(v, seen or {}, depth or 0, indent or "") end
  return tostring(v)
end

M.render = render

local function print_values(res)
  local out = {}
  for i = 1, res.n do out[i] = render(res[i]) end
  if #out > 0 then print(table.concat(out, "\t")) end
end

-- ---- completion -----------------------------------------------------------

-- Candidates for "a.b.c" / "a:b": the fields of the table the prefix names.
local function complete(env, text)
  local path, sep, partial = text:match("^(.-)([%.:]?)([%w_]*)$")
  local scope = env
  if sep ~= "" then
    for name in path:gmatch("[^%.:]+") do
      if type(scope) ~= "table" then return {} end
      scope = scope[name]
    end
  end
  local found, seen = {}, {}
  local function add_fields(t)
    if type(t) ~= "table" then return end
    for k, v in pairs(t) do
      if type(k) == "string" and k:sub(1, #partial) == partial and not seen[k] then
        if sep ~= ":" or type(v) == "function" then
          seen[k] = true
          found[#found + 1] = path .. sep .. k
        end
      end
    end
  end
  add_fields(scope)
  local mt = type(scope) == "table" and getmetatable(scope) or
             (type(scope) == "userdata" and getmetatable(scope))
  if type(mt) == "table" then add_fields(mt.__index) end
  if sep == "" then add_fields(_G) end
  table.sort(found)
  return found
end

M.complete = complete

-- ---- evaluation -------------------------------------------------------------

-- Compiles a chunk: as an expression first, then as statements. Returns
-- fn, or nil + "incomplete", or nil + error message.
local function compile(source, env)
  local fn = load("return " .. source, "=stdin", "t", env)
  if fn then return fn end
  local err
  fn, err = load(source, "=stdin", "t", env)
  if fn then return fn end
  if err:match("<eof>$") then return nil, "incomplete" end
  return nil, err
end

M.compile = compile

-- Drops the REPL's own frames from a line's traceback.
function M.trim_traceback(msg)
  local out = {}
  for line in (msg .. "\n"):gmatch("(.-)\n") do
    if line:match("engine/repl%.lua") or line:match("^%s*%[C%]: in %?$") then break end
    out[#out + 1] = line
  end
  return table.concat(out, "\n")
end

-- Runs one chunk as a task the prompt can cancel.
local function run_chunk(fn, state)
  local task = engine.spawn(function() return table.pack(fn()) end)
  state.running = task
  local ok, res = task:join()
  state.running = nil
  if ok then
    print_values(res)
  elseif engine.is_cancel(res) then
    print("\ncancelled")
  else
    print(M.trim_traceback(tostring(res)))
  end
end

local function history_path()
  local home = os.getenv("HOME")
  return home and (home .. "/.engine_history") or nil
end

-- Reads, compiles and runs chunks until Ctrl-D; an incomplete chunk keeps
-- reading with the ">> " prompt, Ctrl-C at the prompt drops it.
-- Without a terminal (input piped in), lines are read plainly: no prompt,
-- no editing, no history.
local function plain_reader()
  return {
    readline = function() return io.read("l") end,
    load_history = function() end, save_history = function() end,
    set_completer = function() end, add_history = function() end,
  }
end

local function session(env, state)
  local edit = state.tty and require "engine.edit" or plain_reader()
  local hist = state.tty and history_path()
  if hist then edit.load_history(hist) end
  edit.set_completer(function(text) return complete(env, text) end)
  local chunk
  while true do
    local line = edit.readline(chunk and ">> " or "> ")
    if line == nil then break end
    if line == false then
      chunk = nil
    else
      chunk = chunk and (chunk .. "\n" .. line) or line
      local fn, err = compile(chunk, env)
      if fn then
        if chunk:match("%S") then edit.add_history(chunk) end
        chunk = nil
        run_chunk(fn, state)
      elseif err ~= "incomplete" then
        print(err)
        chunk = nil
      end
    end
  end
  if hist then edit.save_history(hist) end
  if state.tty then io.stdout:write("\n") end
end

-- Sets up the session's globals; with an env file, starts playing it.
local function make_env(argv)
  local env = setmetatable({ engine = engine }, { __index = _G })
  local file, task_name, out
  local i = 1
  while argv[i] do
    local a = argv[i]
    if a == "--task" or a == "-t" then task_name = argv[i + 1]; i = i + 2
    elseif a == "--out" then out = argv[i + 1]; i = i + 2
    elseif a:sub(1, 1) == "-" then return nil, "repl: unknown flag " .. a
    else file = a; i = i + 1 end
  end
  if not file then return env end
  local play = require("engine.play").start(file, { task = task_name, out = out })
  for k, v in pairs(play) do if type(k) == "string" then env[k] = v end end
  env.play = play
  return env
end

function M.main(argv)
  local ok_env, env, err = pcall(make_env, argv)
  if not ok_env then io.stderr:write("engine: ", tostring(env), "\n") return 1 end
  if not env then io.stderr:write("engine: ", err, "\n") return 2 end
  local state = { tty = require("engine.edit").isatty() }
  engine.on_interrupt(function()
    if state.running then state.running:cancel()
    else require("engine.edit").interrupt() end
  end)
  if state.tty then io.stdout:write("engine ", engine.version, " — Lua 5.4; Ctrl-D exits\n") end
  local t = engine.spawn(session, env, state)
  local ok, res = t:join()
  engine.on_interrupt(nil)
  if env.play and env.play.finish then env.play:finish() end
  if not ok then io.stderr:write("engine: ", tostring(res), "\n") return 1 end
  return 0
end

return M
