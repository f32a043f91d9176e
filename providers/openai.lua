-- providers.openai: OpenAI-compatible chat completions (OpenAI, vLLM, SGLang,
-- llama.cpp, ...) with tool calls.
--
--   local p = require("providers.openai").new{base_url, api_key_env, model,
--     extra_body, max_concurrency, prices, max_retries, timeout, headers}
--   p:complete{messages, tools, model, max_tokens, temperature, extra_body,
--              stream, on_delta}
--     -> {message, tool_calls, usage, finish_reason, cost, latency, model, id}
--      | nil, err, info
--   p:usage() -> totals (providers.model)
--
-- Messages use one neutral shape that every provider converts:
--   {role = "system"|"user", content = "..."}
--   {role = "assistant", content = "..." | nil, tool_calls = {{id, name, arguments}}}
--   {role = "tool", tool_call_id = "...", name = "...", content = "..."}
-- Tools: {name, description, parameters = JSON schema}. tool_calls in the
-- result carry `arguments` (a decoded table) and `raw_arguments` (the
-- string); arguments the model garbled give `arguments = nil, error = "..."`.
-- finish_reason is "stop", "tool_calls", "length" or the server's own word.
local json = require "engine.json"
local model = require "providers.model"

local M = {}

local OpenAI = model.extend{ provider = "openai" }

function M.new(config)
  local self = model.base(config, { base_url = "https://api.openai.com/v1",
                                    api_key_env = "OPENAI_API_KEY" })
  return setmetatable(self, OpenAI)
end

local function convert_calls(calls)
  local out = {}
  for i, c in ipairs(calls) do
    out[i] = { id = c.id, type = "function", ["function"] = {
      name = c.name, arguments = c.raw_arguments or json.encode(c.arguments or {}) } }
  end
  return out
end

-- Neutral message -> chat completions message.
local function convert_message(m)
  if m.role == "assistant" then
    local out = { role = "assistant", content = m.content or json.null }
    if m.tool_calls and #m.tool_calls > 0 then out.tool_calls = convert_calls(m.tool_calls) end
    return out
  elseif m.role == "tool" then
    return { role = "tool", tool_call_id = m.tool_call_id, content = m.content or "" }
  end
  return { role = m.role, content = m.content or "" }
end

local function convert_tools(tools)
  local out = {}
  for i, t in ipairs(tools) do
    out[i] = { type = "function", ["function"] = { name = t.name,
      description = t.description, parameters = t.parameters or { type = "object" } } }
  end
  return out
end

-- The request body: config's extra_body, then the call's, override ours.
local function build(self, opts, model_name)
  local msgs = {}
  for i, m in ipairs(opts.messages or {}) do msgs[i] = convert_message(m) end
  local body = { model = model_name, messages = json.array(msgs),
                 temperature = opts.temperature or self.temperature }
  body[self.max_tokens_field or "max_tokens"] = opts.max_tokens or self.max_tokens
  if opts.tools and #opts.tools > 0 then body.tools = convert_tools(opts.tools) end
  return self:add_extra_body(body, opts)
end

-- One tool call from the response.
local function parse_call(c, i)
  local fn = type(c) == "table" and c["function"]
  if type(fn) ~= "table" or type(fn.name) ~= "string" then return nil end
  local raw = fn.arguments
  local call = { id = type(c.id) == "string" and c.id or ("call_" .. i), name = fn.name }
  if type(raw) == "table" then raw = json.encode(raw) end
  call.raw_arguments = type(raw) == "string" and raw or "{}"
  local args, err = json.safe_decode(call.raw_arguments == "" and "{}" or call.raw_arguments)
  if type(args) == "table" then call.arguments = args
  else call.error = "tool call arguments are not a JSON object: " .. (err or call.raw_arguments) end
  return call
end

local FINISH = { stop = "stop", tool_calls = "tool_calls", function_call = "tool_calls",
                 length = "length" }

local function str(v) return type(v) == "string" and v or nil end

-- Response body -> result, or nil, "bad_response: ..."
local function parse(v)
  local choice = type(v.choices) == "table" and v.choices[1]
  local msg = type(choice) == "table" and choice.message
  if type(msg) ~= "table" then return nil, "bad_response: openai: no choices[1].message in the response" end
  local calls = {}
  for i, c in ipairs(type(msg.tool_calls) == "table" and msg.tool_calls or {}) do
    calls[#calls + 1] = parse_call(c, i)
  end
  local u = type(v.usage) == "table" and v.usage or {}
  local message = { role = "assistant", content = str(msg.content), tool_calls = calls,
                    reasoning = str(msg.reasoning_content) or str(msg.reasoning) }
  local finish = str(choice.finish_reason)
  return { message = message, tool_calls = calls, model = str(v.model), id = str(v.id),
           finish_reason = FINISH[finish] or finish or (#calls > 0 and "tool_calls" or "stop"),
           usage = { input_tokens = tonumber(u.prompt_tokens) or 0,
                     output_tokens = tonumber(u.completion_tokens) or 0 } }
end

function OpenAI:request_headers()
  return self:json_headers(nil, "Authorization", "Bearer ")
end

-- ---- streaming ------------------------------------------------------------

-- Folds one chunk's tool-call deltas into acc.calls (by index).
local function add_call_deltas(acc, deltas)
  for _, tc in ipairs(type(deltas) == "table" and deltas or {}) do
    local i = (tonumber(tc.index) or #acc.calls) + 1
    local slot = acc.calls[i] or { args = {} }
    acc.calls[i] = slot
    slot.id = slot.id or str(tc.id)
    local fn = type(tc["function"]) == "table" and tc["function"] or {}
    slot.name = slot.name or str(fn.name)
    slot.args[#slot.args + 1] = str(fn.arguments)
  end
end

local function add_chunk(acc, v, on_delta)
  acc.id, acc.model = acc.id or str(v.id), acc.model or str(v.model)
  if type(v.usage) == "table" then acc.usage = v.usage end
  local ch = type(v.choices) == "table" and v.choices[1]
  if type(ch) ~= "table" then return end
  local d = type(ch.delta) == "table" and ch.delta or {}
  local text = str(d.content)
  if text then
    acc.content[#acc.content + 1] = text
    if on_delta then on_delta(text) end
  end
  acc.reasoning[#acc.reasoning + 1] = str(d.reasoning_content) or str(d.reasoning)
  add_call_deltas(acc, d.tool_calls)
  acc.finish = str(ch.finish_reason) or acc.finish
end

-- A handler factory for Base:post: each attempt starts a fresh accumulator.
local function stream_handlers(on_delta)
  local box = {}
  return box, function()
    local acc = { content = {}, reasoning = {}, calls = {} }
    box.acc = acc
    return function(ev)
      if ev.data == "[DONE]" then return true end
      local v, err = json.safe_decode(ev.data)
      if type(v) ~= "table" then
        return nil, "bad_response: openai stream: invalid JSON in an event (" .. (err or "not an object") .. ")"
      end
      if v.error ~= nil then return nil, "server: openai stream: " .. model.error_message(ev.data) end
      add_chunk(acc, v, on_delta)
    end
  end
end

-- The accumulated stream as a non-streamed response body.
local function assembled(acc)
  local calls = {}
  for i, c in ipairs(acc.calls) do
    calls[i] = { id = c.id, ["function"] = { name = c.name, arguments = table.concat(c.args) } }
  end
  return { id = acc.id, model = acc.model, usage = acc.usage,
           choices = { { finish_reason = acc.finish, message = {
             content = #acc.content > 0 and table.concat(acc.content) or nil,
             reasoning_content = #acc.reasoning > 0 and table.concat(acc.reasoning) or nil,
             tool_calls = calls } } } }
end

local WIRE = { name = "openai", stream_handlers = stream_handlers, assembled = assembled,
               parse = parse, stream_body = function(body)
                 body.stream, body.stream_options = true, { include_usage = true }
               end }

-- provider:complete(opts) -> result | nil, err, info (see the top).
-- opts.stream (or config stream = true) streams the response; opts.on_delta
-- (text) then sees the text as it arrives.
function OpenAI:complete(opts)
  local model_name = opts.model or self.model
  if type(model_name) ~= "string" then error("openai: no model given (config.model)", 2) end
  return self:exchange("/chat/completions", build(self, opts, model_name), model_name, opts, WIRE)
end

return M
