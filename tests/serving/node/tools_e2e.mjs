// Tool calling through a REAL deployment (pd-router + pd-prefill +
// pd-decode on the built-in model, ChatML = the Hermes tool format, random
// weights) with the official `openai` client: tool_choice "required" and
// named are constrained, so every answer is a call to a declared tool whose
// arguments validate against its parameters, streamed (delta.tool_calls) and
// not; the client's zodFunction + parse() helper reads parsed_arguments;
// n > 1 gives a call per choice; the call and its result render into the
// next turn; refused fields get their 400. Exit 0 = all passed.
import OpenAI from 'openai';
import { zodFunction } from 'openai/helpers/zod';
import { z } from 'zod';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import { runChecks } from './run_checks.mjs';

const client = new OpenAI({ baseURL: process.env.PD_E2E_BASE_URL,
  apiKey: process.env.PD_E2E_API_KEY, maxRetries: 0, timeout: 60000 });
const model = process.env.PD_E2E_MODEL;
const ajv = new Ajv({ strict: false });
const msgs = [{ role: 'user', content: 'What is the weather in Oslo for the next 3 days?' }];

const weatherParams = { type: 'object', properties: { city: { type: 'string' },
  days: { type: 'integer' }, unit: { enum: ['c', 'f'] } },
  required: ['city', 'days', 'unit'], additionalProperties: false };
const addParams = { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } },
  required: ['a', 'b'], additionalProperties: false };
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather forecast',
    parameters: weatherParams } },
  { type: 'function', function: { name: 'add', description: 'Add numbers', parameters: addParams } },
];
const params = { get_weather: weatherParams, add: addParams };

// The arguments a schema above allows (exact keys, types, enum).
function argsValid(name, args) {
  const s = params[name];
  if (!s || args === null || typeof args !== 'object' || Array.isArray(args)) return false;
  if (Object.keys(args).sort().join() !== Object.keys(s.properties).sort().join()) return false;
  return Object.entries(s.properties).every(([k, p]) => p.enum ? p.enum.includes(args[k])
    : p.type === 'integer' ? Number.isInteger(args[k])
    : p.type === 'number' ? typeof args[k] === 'number' && Number.isFinite(args[k])
    : typeof args[k] === p.type);
}

function checkCall(c, want) {
  assert.equal(c.type, 'function');
  assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
  if (want) assert.equal(c.function.name, want);
  const args = JSON.parse(c.function.arguments);
  assert.ok(argsValid(c.function.name, args), `${c.function.name} ${c.function.arguments}`);
}

async function expect400(p, param) {
  try {
    await client.chat.completions.create({ model, messages: msgs, ...p });
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, `${e.constructor.name}: ${e.message}`);
    assert.equal(e.param, param, e.message);
    return;
  }
  assert.fail(`accepted: ${JSON.stringify(p)}`);
}

const checks = {
  async requiredNonStream() {
    const seen = new Set();
    for (let seed = 1; seed <= 6; seed++) {
      const r = await client.chat.completions.create({ model, messages: msgs, tools,
        tool_choice: 'required', max_tokens: 300, temperature: 1, seed });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
      assert.equal(c.message.content, null);
      assert.equal(c.message.tool_calls.length, 1);
      checkCall(c.message.tool_calls[0]);
      seen.add(c.message.tool_calls[0].function.name);
    }
    assert.ok(seen.size >= 1);
  },

  async namedStreamEqualsNonStream() {
    const p = { model, messages: msgs, tools, max_tokens: 300, temperature: 1, seed: 5,
      tool_choice: { type: 'function', function: { name: 'add' } } };
    const n = await client.chat.completions.create(p);
    checkCall(n.choices[0].message.tool_calls[0], 'add');
    const s = await client.chat.completions.create({ ...p, stream: true });
    const calls = [];
    let finish = null, content = '';
    for await (const ch of s) for (const c of ch.choices) {
      content += c.delta.content ?? '';
      for (const t of c.delta.tool_calls ?? []) {
        calls[t.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
        if (t.id) calls[t.index].id = t.id;
        if (t.function?.name) calls[t.index].function.name += t.function.name;
        calls[t.index].function.arguments += t.function?.arguments ?? '';
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(content, '');
    assert.equal(calls.length, 1);
    checkCall(calls[0], 'add');
    assert.equal(calls[0].function.arguments, n.choices[0].message.tool_calls[0].function.arguments);
  },

  // the client's own helpers: zodFunction (strict tools) + parse()
  async zodFunctionParse() {
    const Weather = z.object({ city: z.string(), days: z.number().int() });
    const r = await client.beta.chat.completions.parse({ model, messages: msgs,
      tools: [zodFunction({ name: 'get_weather', parameters: Weather })],
      tool_choice: 'required', max_tokens: 300, temperature: 1, seed: 11 });
    const t = r.choices[0].message.tool_calls[0];
    assert.equal(t.function.name, 'get_weather');
    assert.ok(Weather.safeParse(t.function.parsed_arguments).success, t.function.arguments);
  },

  // the client's streaming helper accumulates delta.tool_calls
  async streamHelper() {
    const runner = client.beta.chat.completions.stream({ model, messages: msgs, tools,
      tool_choice: 'required', max_tokens: 300, temperature: 1, seed: 21 });
    const fin = await runner.finalChatCompletion();
    assert.equal(fin.choices[0].finish_reason, 'tool_calls');
    checkCall(fin.choices[0].message.tool_calls[0]);
  },

  async nChoicesEachACall() {
    const r = await client.chat.completions.create({ model, messages: msgs, tools, n: 3,
      tool_choice: 'required', max_tokens: 300, temperature: 1, seed: 3 });
    assert.equal(r.choices.length, 3);
    for (const c of r.choices) {
      assert.equal(c.finish_reason, 'tool_calls');
      checkCall(c.message.tool_calls[0]);
    }
  },

  // the call and its result go back in the next turn: rendered (the prompt
  // grows by them) and answered as text with tool_choice "none"
  async roundTrip() {
    const r1 = await client.chat.completions.create({ model, messages: msgs, tools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      max_tokens: 300, temperature: 1, seed: 8 });
    const m = r1.choices[0].message;
    const turn = [...msgs, m, { role: 'tool', tool_call_id: m.tool_calls[0].id,
      content: '{"forecast": ["snow", "sun", "rain"]}' }];
    const r2 = await client.chat.completions.create({ model, messages: turn, tools,
      tool_choice: 'none', max_tokens: 8, temperature: 0 });
    assert.equal(r2.choices[0].message.tool_calls, undefined);
    assert.ok(r2.choices[0].finish_reason === 'length' || r2.choices[0].finish_reason === 'stop');
    assert.ok(r2.usage.prompt_tokens > r1.usage.prompt_tokens + 40,
      `${r2.usage.prompt_tokens} vs ${r1.usage.prompt_tokens}`);
  },

  // auto: the model may answer in text (with random weights it does)
  async autoAnswersText() {
    const r = await client.chat.completions.create({ model, messages: msgs, tools,
      max_tokens: 12, temperature: 0 });
    const c = r.choices[0];
    assert.ok(c.finish_reason === 'length' || c.finish_reason === 'stop');
    assert.equal(typeof c.message.content, 'string');
  },

  // "required" with 20 tools: every answer is a call to one of them, its
  // arguments valid (ajv on the tool's parameters)
  async twentyToolsRequired() {
    // (small definitions: the built-in model's 4096-token context holds them)
    const many = Array.from({ length: 20 }, (_, i) => ({ type: 'function', function: {
      name: `t${i}`, parameters: { type: 'object',
        properties: { n: { type: 'integer', minimum: i, maximum: i + 9 } },
        required: ['n'] } } }));
    const validators = Object.fromEntries(many.map((t) => [t.function.name,
      ajv.compile(t.function.parameters)]));
    const seen = new Set();
    for (let seed = 1; seed <= 4; seed++) {
      const r = await client.chat.completions.create({ model, messages: msgs, tools: many,
        tool_choice: 'required', max_tokens: 100, temperature: 1, seed });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
      const t = c.message.tool_calls[0];
      const v = validators[t.function.name];
      assert.ok(v, t.function.name);
      assert.ok(v(JSON.parse(t.function.arguments)), `${t.function.arguments}: ${ajv.errorsText(v.errors)}`);
      seen.add(t.function.name);
    }
    assert.ok(seen.size >= 1);
  },

  // an agent loop: call, then the result comes back as {"role": "tool",
  // "name": ...} (LangChain's ToolNode sends the name), and names on the
  // other roles too; the second request is accepted and rendered
  async toolLoopWithNames() {
    const first = [{ role: 'system', content: 'You are a weather bot.', name: 'rules' },
      { role: 'user', content: 'Weather in Oslo?', name: 'alice' }];
    const r1 = await client.chat.completions.create({ model, messages: first, tools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      max_tokens: 300, temperature: 1, seed: 4 });
    const call = r1.choices[0].message.tool_calls[0];
    checkCall(call, 'get_weather');
    const turn = [...first, { ...r1.choices[0].message, name: 'weather-agent' },
      { role: 'tool', tool_call_id: call.id, name: 'get_weather', content: '{"temp": -3}' }];
    const r2 = await client.chat.completions.create({ model, messages: turn, tools,
      tool_choice: 'auto', max_tokens: 8, temperature: 0 });
    assert.ok(['stop', 'length', 'tool_calls'].includes(r2.choices[0].finish_reason));
    assert.ok(r2.usage.prompt_tokens > r1.usage.prompt_tokens + 20);
  },

  // logprobs with tools: the call comes back as tool_calls, with logprobs
  async logprobsWithTools() {
    const r = await client.chat.completions.create({ model, messages: msgs, tools,
      tool_choice: 'required', logprobs: true, top_logprobs: 2, max_tokens: 300,
      temperature: 1, seed: 6 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    checkCall(c.message.tool_calls[0]);
    assert.equal(c.logprobs.content.length, r.usage.completion_tokens);
    assert.equal(c.logprobs.content[0].top_logprobs.length, 2);
    const s = await client.chat.completions.create({ model, messages: msgs, tools,
      logprobs: true, max_tokens: 10, temperature: 0, stream: true });
    let n = 0;
    for await (const ch of s) for (const x of ch.choices) n += x.logprobs?.content?.length ?? 0;
    assert.ok(n >= 1 && n <= 10, `${n}`);
  },

  // a forced call cut by max_tokens is still a call, never content
  async forcedCallCutShort() {
    const r = await client.chat.completions.create({ model, messages: msgs, tools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      max_tokens: 6, temperature: 1, seed: 2 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'length');
    assert.equal(c.message.content, null);
    assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
    assert.equal(typeof c.message.tool_calls[0].function.arguments, 'string');
  },

  async refusals() {
    await expect400({ tool_choice: 'required' }, 'tool_choice');
    await expect400({ tools, tool_choice: { type: 'function', function: { name: 'nope' } } },
      'tool_choice');
    await expect400({ tools: [{ type: 'function', function: { name: 'bad name' } }] },
      'tools[0].function.name');
    await expect400({ tools: [{ type: 'function', function: { name: 'f', parameters: {
      type: 'object', properties: { s: { type: 'string', pattern: '(?=x)' } } } } }],
    tool_choice: 'required' }, 'tools[0].function.parameters');
    await expect400({ tools, tool_choice: 'required', response_format: { type: 'json_object' } },
      'tool_choice');
    await expect400({ functions: [{ name: 'f', parameters: {} }] }, 'functions');
  },
};

await runChecks(checks);
