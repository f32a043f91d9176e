-- providers.anthropic: Anthropic's Messages API with tool use, behind the
-- same interface as providers.openai (neutral messages and tools in, the
-- same result shape out; see providers/openai.lua).
--
--   local p = require("providers.anthropic").new{base_url, api_key_env, model,
--     extra_body, max_concurrency, prices, max_retries, timeout, max_tokens,
--     anthropic_version, headers}
--   p:complete{messages, tools, model, max_tokens, temperature, extra_body,
--              stream, on_delta}
local json = require "engine.json"
local model = require "providers.model"

local M = {}

local Anthropic = model.extend{ provider = "anthropic" }

function M.new(config)
  local self = model.base(config, { base_url = "https://api.anthropic.com/v1",
    api_key_env = "ANTHROPIC_API_KEY", max_tokens = 4096,
    anthropic_version = "2023-06-01" })
  return setmetatable(self, Anthropic)
end

-- Content blocks for one neutral message.
local function blocks(m)
  if m.role == "tool" then
    return { { type = "tool_result", tool_use_id = m.tool_call_id,
               content = m.content or "", is_error = m.is_error or nil } }
  end
  local out = {}
  if m.content and m.content ~= "" then out[1] = { type = "text", text = m.content } end
  for _, c in ipairs(m.role == "assistant" and m.tool_calls or {}) do
    out[#out + 1] = { type = "tool_use", id = c.id, name = c.name,
                      input = c.arguments or json.safe_decode(c.raw_arguments or "") or {} }
  end
  return out
end

-- Neutral messages -> (system text, alternating messages). Tool results
-- become user turns; consecutive turns of one role are merged.
local function convert_messages(messages)
  local system, out = {}, {}
  for _, m in ipairs(messages) do
    if m.role == "system" then
      system[#system + 1] = m.content
    else
      local role = m.role == "assistant" and "assistant" or "user"
      local last = out[#out]
      if last and last.role == role then
        for _, b in ipairs(blocks(m)) do last.content[#last.content + 1] = b end
      else
        out[#out + 1] = { role = role, content = json.array(blocks(m)) }
      end
    end
  end
  return #system > 0 and table.concat(system, "\n\n") or nil, out
end

local function build(self, opts, model_name)
  local system, msgs = convert_messages(opts.messages or {})
  local body = { model = model_name, system = system, messages = json.array(msgs),
                 max_tokens = opts.max_tokens or self.max_tokens,
                 temperature = opts.temperature or self.temperature }
  if opts.tools and #opts.tools > 0 then
    body.tools = {}
    for i, t in ipairs(opts.tools) do
      body.tools[i] = { name = t.name, description = t.description,
                        input_schema = t.parameters or { type = "object" } }
    end
  end
  return self:add_extra_body(body, opts)
end

local FINISH = { end_turn = "stop", stop_sequence = "stop", tool_use = "tool_calls",
                 max_tokens = "length" }

-- Response body -> result, or nil, "bad_response: ..."
local function parse(v)
  if type(v.content) ~= "table" then
    return nil, "bad_response: anthropic: no content in the response"
  end
  local text, calls = {}, {}
  for _, b in ipairs(v.content) do
    if type(b) == "table" and b.type == "text" and type(b.text) == "string" then
      text[#text + 1] = b.text
    elseif type(b) == "table" and b.type == "tool_use" then
      local args = type(b.input) == "table" and b.input or {}
      calls[#calls + 1] = { id = tostring(b.id), name = tostring(b.name),
                            arguments = args, raw_arguments = json.encode(args) }
    end
  end
  local u = type(v.usage) == "table" and v.usage or {}
  local input = (tonumber(u.input_tokens) or 0) + (tonumber(u.cache_read_input_tokens) or 0)
    + (tonumber(u.cache_creation_input_tokens) or 0)
  local content = #text > 0 and table.concat(text) or nil
  local stop = type(v.stop_reason) == "string" and v.stop_reason or nil
  return { message = { role = "assistant", content = content, tool_calls = calls },
           tool_calls = calls, model = v.model, id = v.id,
           finish_reason = FINISH[stop] or stop or (#calls > 0 and "tool_calls" or "stop"),
           usage = { input_tokens = input, output_tokens = tonumber(u.output_tokens) or 0 } }
end

function Anthropic:request_headers()
  return self:json_headers({ ["anthropic-version"] = self.anthropic_version }, "x-api-key")
end

-- ---- streaming ------------------------------------------------------------

-- Applies one Messages stream event to the accumulated message.
local function apply_event(acc, name, v, on_delta)
  if name == "message_start" and type(v.message) == "table" then
    acc.id, acc.model = v.message.id, v.message.model
    acc.usage = type(v.message.usage) == "table" and v.message.usage or {}
  elseif name == "content_block_start" and type(v.content_block) == "table" then
    local b = v.content_block
    acc.blocks[(tonumber(v.index) or #acc.blocks) + 1] = { type = b.type, id = b.id,
      name = b.name, text = { b.text }, json = {} }
  elseif name == "content_block_delta" and type(v.delta) == "table" then
    local b = acc.blocks[(tonumber(v.index) or 0) + 1]
    if not b then return end
    local d = v.delta
    if type(d.text) == "string" then
      b.text[#b.text + 1] = d.text
      if on_delta then on_delta(d.text) end
    end
    if type(d.partial_json) == "string" then b.json[#b.json + 1] = d.partial_json end
  elseif name == "message_delta" then
    if type(v.delta) == "table" then acc.stop_reason = v.delta.stop_reason end
    if type(v.usage) == "table" then
      for k, x in pairs(v.usage) do acc.usage[k] = x end
    end
  end
end

local function stream_handlers(on_delta)
  local box = {}
  return box, function()
    local acc = { blocks = {}, usage = {} }
    box.acc = acc
    return function(ev)
      if ev.event == "message_stop" then return true end
      if ev.event == "ping" then return nil end
      local v, err = json.safe_decode(ev.data)
      if type(v) ~= "table" then
        return nil, "bad_response: anthropic stream: invalid JSON in an event (" .. (err or "not an object") .. ")"
      end
      if ev.event == "error" then return nil, "server: anthropic stream: " .. model.error_message(ev.data) end
      apply_event(acc, ev.event, v, on_delta)
    end
  end
end

-- The accumulated stream as a non-streamed response body, or nil, err.
local function assembled(acc)
  local content = {}
  for i, b in ipairs(acc.blocks) do
    if b.type == "tool_use" then
      local raw = table.concat(b.json)
      local input, err = json.safe_decode(raw == "" and "{}" or raw)
      if type(input) ~= "table" then
        return nil, "bad_response: anthropic stream: tool input is not JSON (" .. tostring(err) .. ")"
      end
      content[i] = { type = "tool_use", id = b.id, name = b.name, input = input }
    else
      content[i] = { type = b.type, text = table.concat(b.text) }
    end
  end
  return { id = acc.id, model = acc.model, usage = acc.usage, stop_reason = acc.stop_reason,
           content = content }
end

local WIRE = { name = "anthropic", stream_handlers = stream_handlers, assembled = assembled,
               parse = parse, stream_body = function(body) body.stream = true end }

-- provider:complete(opts) -> result | nil, err, info
-- opts.stream (or config stream = true) streams; opts.on_delta(text).
function Anthropic:complete(opts)
  local model_name = opts.model or self.model
  if type(model_name) ~= "string" then error("anthropic: no model given (config.model)", 2) end
  return self:exchange("/messages", build(self, opts, model_name), model_name, opts, WIRE)
end

return M
