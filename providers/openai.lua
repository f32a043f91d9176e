-- providers.openai: OpenAI-compatible chat completions (OpenAI, vLLM, SGLang,
-- llama.cpp, ...) with tool calls.
--
--   local p = require("providers.openai").new{base_url, api_key_env, model,
--     extra_body, max_concurrency, prices, max_retries, timeout, headers}
--   p:complete{messages, tools, model, max_tokens, temperature, extra_body}
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
local engine = require "engine"
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
  for _, extra in ipairs{ self.extra_body or {}, opts.extra_body or {} } do
    for k, v in pairs(extra) do body[k] = v end
  end
  return body
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
  local h = { ["Content-Type"] = "application/json" }
  if self.has_key then h["Authorization"] = "Bearer " .. self:key() end
  for k, v in pairs(self.headers or {}) do h[k] = v end
  return h
end

-- provider:complete(opts) -> result | nil, err, info (see the top).
function OpenAI:complete(opts)
  local model_name = opts.model or self.model
  if type(model_name) ~= "string" then error("openai: no model given (config.model)", 2) end
  local t0 = engine.monotonic()
  local res, err, info = self:post("/chat/completions", build(self, opts, model_name),
                                   self:request_headers())
  if not res then return nil, err, info end
  local v, derr = model.decode(res, "openai")
  local out
  if v then out, derr = parse(v) end
  if not out then
    self.totals.failures = self.totals.failures + 1
    return nil, derr, { kind = "bad_response", status = res.status }
  end
  out.latency = engine.monotonic() - t0
  out.cost = self:add_usage(model_name, out.usage.input_tokens, out.usage.output_tokens,
                            out.latency)
  return out
end

return M
