local engine = require "engine"
local http = require "engine.http"
local json = require "engine.json"
local model = require "providers.model"
local openai = require "providers.openai"
local anthropic = require "providers.anthropic"
local server = require "spec.fixtures.http.server"

local KEY = "sk-test-SECRET-4242"

local function chat(content, tool_calls, usage, finish)
  return { json = { id = "c1", model = "m", choices = { {
    message = { role = "assistant", content = content, tool_calls = tool_calls },
    finish_reason = finish or (tool_calls and "tool_calls" or "stop") } },
    usage = usage or { prompt_tokens = 10, completion_tokens = 5 } } }
end

-- Everything reachable from a value, as text (functions and metatables aside).
local function dump(v, seen, out)
  seen, out = seen or {}, out or {}
  if type(v) == "table" and not seen[v] then
    seen[v] = true
    for k, x in pairs(v) do dump(k, seen, out); dump(x, seen, out) end
  elseif type(v) ~= "table" then
    out[#out + 1] = tostring(v)
  end
  return table.concat(out, " ")
end

describe("model providers", function()
  local srv
  setup(function() srv = server.start() end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset() end)

  local function new_openai(cfg)
    local c = { base_url = srv.url .. "/v1", api_key = KEY, model = "m",
                backoff_base = 0.05, backoff_max = 0.2 }
    for k, v in pairs(cfg or {}) do c[k] = v end
    return openai.new(c)
  end

  describe("openai", function()
    it("lets the call's extra_body win over the config's, and config headers over its own", function()
      srv:script{ chat("ok") }
      local p = new_openai{ extra_body = { top_k = 5, seed = 1 }, headers = { ["X-Team"] = "a" } }
      assert(p:complete{ messages = { { role = "user", content = "hi" } }, extra_body = { top_k = 7 } })
      local req = srv:requests()[1]
      local body = json.decode(req.body)
      assert.same({ 7, 1 }, { body.top_k, body.seed })
      assert.equal("a", req.headers["x-team"])
      assert.equal("Bearer " .. KEY, req.headers["authorization"])
      assert.equal("application/json", req.headers["content-type"])
    end)

    it("sends messages, tools and extra body; parses tool calls, usage and cost", function()
      srv:script{ chat(json.null, { { id = "t1", type = "function",
        ["function"] = { name = "bash", arguments = '{"command":"ls -la"}' } } }) }
      local p = new_openai{ extra_body = { top_k = 5 },
        prices = { m = { input = 1.0, output = 2.0 } } }
      local r = assert(p:complete{
        messages = { { role = "system", content = "sys" }, { role = "user", content = "hi" },
          { role = "assistant", tool_calls = { { id = "t0", name = "bash", arguments = {} } } },
          { role = "tool", tool_call_id = "t0", content = "out" } },
        tools = { { name = "bash", description = "run", parameters = { type = "object",
          properties = { command = { type = "string" } } } } },
        max_tokens = 100, temperature = 0.5 })
      assert.equal("tool_calls", r.finish_reason)
      assert.equal(1, #r.tool_calls)
      assert.equal("bash", r.tool_calls[1].name)
      assert.equal("t1", r.tool_calls[1].id)
      assert.same({ command = "ls -la" }, r.tool_calls[1].arguments)
      assert.is_nil(r.message.content)
      assert.same({ input_tokens = 10, output_tokens = 5 }, r.usage)
      assert.near(20e-6, r.cost, 1e-12)
      local req = srv:requests()[1]
      assert.equal("/v1/chat/completions", req.path)
      assert.equal("Bearer " .. KEY, req.headers["authorization"])
      local body = json.decode(req.body)
      assert.equal("m", body.model)
      assert.equal(5, body.top_k)
      assert.equal(100, body.max_tokens)
      assert.equal("function", body.tools[1].type)
      assert.equal("{}", body.messages[3].tool_calls[1]["function"].arguments)
      assert.equal("tool", body.messages[4].role)
      assert.equal("t0", body.messages[4].tool_call_id)
      local u = p:usage()
      assert.equal(1, u.requests)
      assert.equal(1, u.calls)
      assert.equal(10, u.input_tokens)
      assert.near(20e-6, u.cost, 1e-12)
    end)

    it("keeps garbled tool arguments as an error on the call", function()
      srv:script{ chat(nil, { { id = "t1", ["function"] = { name = "bash", arguments = "{oops" } } }) }
      local r = assert(new_openai():complete{ messages = { { role = "user", content = "x" } } })
      assert.is_nil(r.tool_calls[1].arguments)
      assert.matches("not a JSON object", r.tool_calls[1].error)
      assert.equal("{oops", r.tool_calls[1].raw_arguments)
    end)

    it("retries 5xx with backoff, then succeeds", function()
      srv:script{ { status = 500 }, { status = 502, body = "bad gateway" }, chat("ok") }
      local p = new_openai()
      local r = assert(p:complete{ messages = { { role = "user", content = "x" } } })
      assert.equal("ok", r.message.content)
      assert.equal(3, #srv:requests())
      assert.equal(2, p:usage().retries)
      assert.equal(3, p:usage().attempts)
    end)

    it("honours Retry-After on 429", function()
      srv:script{ { status = 429, headers = { ["Retry-After"] = "1" }, body = "slow down" },
                  chat("ok") }
      local r = assert(new_openai():complete{ messages = { { role = "user", content = "x" } } })
      assert.equal("ok", r.message.content)
      local reqs = srv:requests()
      assert.equal(2, #reqs)
      assert.is_true(reqs[2].time - reqs[1].time >= 0.95,
        "retried after " .. (reqs[2].time - reqs[1].time))
    end)

    it("does not retry other 4xx", function()
      for _, status in ipairs{ 400, 401, 404 } do
        srv:reset()
        srv:script{ { status = status, json = { error = { message = "nope " .. status } } } }
        local r, err, info = new_openai():complete{ messages = { { role = "user", content = "x" } } }
        assert.is_nil(r)
        assert.equal("http: http " .. status .. ": nope " .. status, err)
        assert.equal("http", info.kind)
        assert.equal(1, #srv:requests())
      end
    end)

    it("gives up after max_retries with the last error", function()
      srv:script{ { status = 503 }, { status = 503 }, { status = 503 }, chat("too late") }
      local p = new_openai{ max_retries = 2 }
      local r, err, info = p:complete{ messages = { { role = "user", content = "x" } } }
      assert.is_nil(r)
      assert.matches("^server: http 503", err)
      assert.same({ kind = "server", status = 503, attempts = 3 }, info)
      assert.equal(3, #srv:requests())
      assert.equal(1, p:usage().failures)
    end)

    it("retries connection failures", function()
      local p = new_openai{ base_url = "http://127.0.0.1:1/v1", max_retries = 2 }
      local r, err, info = p:complete{ messages = { { role = "user", content = "x" } } }
      assert.is_nil(r)
      assert.matches("^connect: ", err)
      assert.equal(3, info.attempts)
    end)

    it("times out a stalled response and retries it", function()
      srv:script{ { body = string.rep(" ", 200), stall = 5 }, chat("second try") }
      local p = new_openai{ timeout = 0.5 }
      local r = assert(p:complete{ messages = { { role = "user", content = "x" } } })
      assert.equal("second try", r.message.content)
      assert.equal(2, #srv:requests())
    end)

    it("says clearly when the server sends malformed JSON, without retrying", function()
      srv:script{ { status = 200, body = '{"choices": [ {"message": ' } }
      local r, err, info = new_openai():complete{ messages = { { role = "user", content = "x" } } }
      assert.is_nil(r)
      assert.matches("^bad_response: openai returned invalid JSON", err)
      assert.equal("bad_response", info.kind)
      assert.equal(1, #srv:requests())
      srv:script{ { json = { choices = {} } } }
      r, err = new_openai():complete{ messages = { { role = "user", content = "x" } } }
      assert.is_nil(r)
      assert.matches("no choices%[1%]%.message", err)
    end)

    it("recognises context overflow", function()
      srv:script{ { status = 400, json = { error = { message =
        "This model's maximum context length is 4096 tokens.", code = "context_length_exceeded" } } } }
      local r, err, info = new_openai():complete{ messages = { { role = "user", content = "x" } } }
      assert.is_nil(r)
      assert.equal("context_overflow", info.kind)
      assert.matches("^context_overflow: ", err)
    end)

    it("caps requests in flight per provider", function()
      local list = {}
      for i = 1, 6 do list[i] = chat("r", nil, nil, nil); list[i].delay = 0.3 end
      srv:script(list)
      local p = new_openai{ max_concurrency = 2 }
      local peak, done = 0, false
      local sampler = engine.spawn(function()
        while not done do
          peak = math.max(peak, http.core.stats().transfers)
          engine.sleep(0.01)
        end
      end)
      local tasks = {}
      for i = 1, 6 do
        tasks[i] = engine.spawn(function()
          return assert(p:complete{ messages = { { role = "user", content = "x" } } })
        end)
      end
      for _, t in ipairs(tasks) do assert.is_true((t:join())) end
      done = true
      sampler:join()
      assert.equal(2, peak)
      assert.equal(6, p:usage().requests)
    end)

    it("keeps the API key out of everything but the request header", function()
      local p = openai.new{ base_url = srv.url, api_key_env = "ENGINE_SPEC_NO_SUCH_KEY" }
      assert.is_false(p.has_key)
      srv:script{ chat("ok") }
      p = new_openai()
      assert(p:complete{ messages = { { role = "user", content = "x" } } })
      assert.is_nil(dump(p):find(KEY, 1, true))
      assert.is_nil(dump(p:usage()):find(KEY, 1, true))
      assert.is_nil(json.encode(p:usage()):find(KEY, 1, true))
    end)

    it("raises without a model", function()
      local p = openai.new{ base_url = srv.url }
      assert.has_error(function() p:complete{ messages = {} } end,
        "openai: no model given (config.model)")
    end)
  end)

  describe("anthropic", function()
    it("speaks the Messages API with tool use", function()
      srv:script{ { json = { id = "msg1", model = "claude", stop_reason = "tool_use",
        content = { { type = "text", text = "running it" },
                    { type = "tool_use", id = "tu1", name = "bash", input = { command = "pwd" } } },
        usage = { input_tokens = 20, output_tokens = 7, cache_read_input_tokens = 3 } } } }
      local p = anthropic.new{ base_url = srv.url .. "/v1", api_key = KEY, model = "claude",
        prices = { input = 3, output = 15 } }
      local r = assert(p:complete{
        messages = { { role = "system", content = "be brief" }, { role = "user", content = "go" },
          { role = "assistant", content = "ok", tool_calls = { { id = "tu0", name = "bash",
            arguments = { command = "ls" } } } },
          { role = "tool", tool_call_id = "tu0", content = "a b" },
          { role = "user", content = "next" } },
        tools = { { name = "bash", description = "run", parameters = { type = "object" } } } })
      assert.equal("tool_calls", r.finish_reason)
      assert.equal("running it", r.message.content)
      assert.same({ command = "pwd" }, r.tool_calls[1].arguments)
      assert.equal("tu1", r.tool_calls[1].id)
      assert.same({ input_tokens = 23, output_tokens = 7 }, r.usage)
      assert.near((23 * 3 + 7 * 15) / 1e6, r.cost, 1e-12)
      local req = srv:requests()[1]
      assert.equal("/v1/messages", req.path)
      assert.equal(KEY, req.headers["x-api-key"])
      assert.equal("2023-06-01", req.headers["anthropic-version"])
      local body = json.decode(req.body)
      assert.equal("be brief", body.system)
      assert.equal(4096, body.max_tokens)
      assert.equal(3, #body.messages)           -- tool result + user text merged
      assert.equal("tool_use", body.messages[2].content[2].type)
      assert.equal("tool_result", body.messages[3].content[1].type)
      assert.equal("tu0", body.messages[3].content[1].tool_use_id)
      assert.equal("text", body.messages[3].content[2].type)
      assert.equal("object", body.tools[1].input_schema.type)
    end)

    it("retries overloaded (529) and recognises a too-long prompt", function()
      srv:script{ { status = 529, json = { type = "error", error = { message = "Overloaded" } } },
                  { status = 400, json = { type = "error", error = {
                    type = "invalid_request_error", message = "prompt is too long: 300000 tokens" } } } }
      local p = anthropic.new{ base_url = srv.url .. "/v1", model = "c", backoff_base = 0.05 }
      local r, err, info = p:complete{ messages = { { role = "user", content = "x" } } }
      assert.is_nil(r)
      assert.equal("context_overflow", info.kind)
      assert.matches("prompt is too long", err)
      assert.equal(2, #srv:requests())
      assert.is_nil(srv:requests()[1].headers["x-api-key"])
    end)
  end)

  describe("streaming", function()
    local function sse(events)
      local chunks = {}
      for i, e in ipairs(events) do
        local data = type(e) == "string" and e or json.encode(e)
        chunks[i] = { data = "data: " .. data .. "\n\n" }
      end
      return { chunks = chunks }
    end

    local function openai_stream()
      return sse{
        { id = "s1", model = "m", choices = { { index = 0, delta = { role = "assistant", content = "Hel" } } } },
        { choices = { { index = 0, delta = { content = "lo" } } } },
        { choices = { { index = 0, delta = { tool_calls = { { index = 0, id = "t9", type = "function",
          ["function"] = { name = "bash", arguments = '{"comm' } } } } } } },
        { choices = { { index = 0, delta = { tool_calls = { { index = 0,
          ["function"] = { arguments = 'and":"ls"}' } } } } } } },
        { choices = { { index = 0, delta = {}, finish_reason = "tool_calls" } } },
        { choices = {}, usage = { prompt_tokens = 12, completion_tokens = 4 } },
        "[DONE]" }
    end

    it("assembles an OpenAI stream: text deltas, split tool calls, usage", function()
      srv:script{ openai_stream() }
      local seen = {}
      local r = assert(new_openai():complete{ messages = { { role = "user", content = "x" } },
        stream = true, on_delta = function(t) seen[#seen + 1] = t end })
      assert.same({ "Hel", "lo" }, seen)
      assert.equal("Hello", r.message.content)
      assert.equal("tool_calls", r.finish_reason)
      assert.same({ command = "ls" }, r.tool_calls[1].arguments)
      assert.equal("t9", r.tool_calls[1].id)
      assert.same({ input_tokens = 12, output_tokens = 4 }, r.usage)
      local body = json.decode(srv:requests()[1].body)
      assert.is_true(body.stream)
      assert.is_true(body.stream_options.include_usage)
    end)

    it("retries a stream that fails before or during the response, from scratch", function()
      local stalled = openai_stream()
      stalled.chunks = { stalled.chunks[1], stalled.chunks[2] }
      stalled.stall = 5
      srv:script{ { status = 503, body = "busy" }, stalled, openai_stream() }
      local p = new_openai{ timeout = 0.8, stream = true }
      local r = assert(p:complete{ messages = { { role = "user", content = "x" } } })
      assert.equal("Hello", r.message.content)
      assert.equal(3, #srv:requests())
      assert.equal(2, p:usage().retries)
    end)

    it("fails clearly on a malformed event, without retrying", function()
      srv:script{ sse{ { choices = { { delta = { content = "a" } } } }, "{broken" } }
      local r, err, info = new_openai():complete{ messages = { { role = "user", content = "x" } }, stream = true }
      assert.is_nil(r)
      assert.matches("^bad_response: openai stream: invalid JSON", err)
      assert.equal("bad_response", info.kind)
      assert.equal(1, #srv:requests())
    end)

    it("assembles an Anthropic stream with tool use", function()
      local function ev(name, data)
        return { data = "event: " .. name .. "\ndata: " .. json.encode(data) .. "\n\n" }
      end
      srv:script{ { chunks = {
        ev("message_start", { type = "message_start", message = { id = "m1", model = "c",
          usage = { input_tokens = 30, output_tokens = 1 } } }),
        ev("content_block_start", { index = 0, content_block = { type = "text", text = "" } }),
        ev("ping", { type = "ping" }),
        ev("content_block_delta", { index = 0, delta = { type = "text_delta", text = "Let me " } }),
        ev("content_block_delta", { index = 0, delta = { type = "text_delta", text = "look." } }),
        ev("content_block_start", { index = 1, content_block = { type = "tool_use", id = "tu1",
          name = "bash", input = {} } }),
        ev("content_block_delta", { index = 1, delta = { type = "input_json_delta", partial_json = '{"command": ' } }),
        ev("content_block_delta", { index = 1, delta = { type = "input_json_delta", partial_json = '"pwd"}' } }),
        ev("message_delta", { delta = { stop_reason = "tool_use" }, usage = { output_tokens = 9 } }),
        ev("message_stop", { type = "message_stop" }) } } }
      local p = anthropic.new{ base_url = srv.url .. "/v1", model = "c", stream = true }
      local r = assert(p:complete{ messages = { { role = "user", content = "x" } } })
      assert.equal("Let me look.", r.message.content)
      assert.equal("tool_calls", r.finish_reason)
      assert.same({ command = "pwd" }, r.tool_calls[1].arguments)
      assert.same({ input_tokens = 30, output_tokens = 9 }, r.usage)
      assert.is_true(json.decode(srv:requests()[1].body).stream)
    end)
  end)

  describe("backoff", function()
    it("grows exponentially with jitter, capped", function()
      local b = model.base({ base_url = "x", backoff_base = 1, backoff_max = 8 })
      b.random = function() return 1 end
      assert.same({ 1, 2, 4, 8, 8 }, { b:backoff(1), b:backoff(2), b:backoff(3), b:backoff(4), b:backoff(5) })
      b.random = function() return 0 end
      assert.equal(2, b:backoff(3))
    end)

    it("reads Retry-After as seconds, milliseconds or an HTTP date", function()
      assert.equal(3, model.retry_after{ ["retry-after"] = "3" })
      assert.equal(0.25, model.retry_after{ ["retry-after-ms"] = "250" })
      assert.is_nil(model.retry_after{})
      local when = os.date("!%a, %d %b %Y %H:%M:%S GMT", math.floor(engine.now()) + 30)
      local s = model.retry_after{ ["retry-after"] = when }
      assert.is_true(s > 27 and s <= 30, tostring(s))
      local b = model.base({ base_url = "x", retry_after_max = 10 })
      assert.equal(10, b:backoff(1, { ["retry-after"] = "100" }))
    end)
  end)
end)
