-- engine show RUN_DIR [--json]: the summary of an existing run, read from
-- its run.json and episodes.jsonl (a torn last line is ignored).
local trace = require "engine.trace"
local report = require "engine.report"
local runner = require "engine.runner"

local USAGE = "usage: engine show RUN_DIR [--json]\n"

return function(argv)
  local dir, as_json
  for _, a in ipairs(argv) do
    if a == "--json" then as_json = true
    elseif a == "-h" or a == "--help" then io.stdout:write(USAGE); return 0
    elseif a:sub(1, 1) == "-" then io.stderr:write("engine: show: unknown flag ", a, "\n"); return 2
    elseif dir then io.stderr:write("engine: show: one RUN_DIR only\n"); return 2
    else dir = a end
  end
  if not dir then io.stderr:write(USAGE); return 2 end
  dir = dir:gsub("/+$", "")
  local meta, records, torn = trace.read(dir)
  if not meta then io.stderr:write("engine: show: ", records, "\n"); return 1 end
  local s = runner.summary(meta, records)
  s.run_dir, s.torn_lines = dir, torn
  if as_json then
    io.stdout:write(trace.encode(trace.plain(s)), "\n")
  else
    io.stdout:write(report.format(s, runner.header(meta, dir)))
    if torn > 0 then io.stdout:write("(", torn, " unreadable line(s) in episodes.jsonl skipped)\n") end
  end
  return 0
end
