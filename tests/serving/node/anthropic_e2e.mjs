// Anthropic's official `@anthropic-ai/sdk` against a REAL deployment
// (pd-router + pd-prefill + pd-decode, started by `test-e2e node`; the
// built-in model, ChatML = the Hermes tool format, random weights):
// messages.create and messages.stream give the chat API's tokens, a
// tool_use -> tool_result round trip, countTokens, stop sequences, errors
// in Anthropic's envelope; and the same prompt + seed through
// /v1/chat/completions, /v1/messages and /v1/responses gives the same
// tokens. Exit 0 = all passed.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { runChecks } from './run_checks.mjs';

const base = process.env.PD_E2E_BASE_URL;           // http://127.0.0.1:PORT/v1
const root = base.replace(/\/v1\/?$/, '');           // the Anthropic SDK adds /v1/messages
const apiKey = process.env.PD_E2E_API_KEY;
const model = process.env.PD_E2E_MODEL;
const anthropic = new Anthropic({ baseURL: root, apiKey, maxRetries: 0, timeout: 60000 });
const openai = new OpenAI({ baseURL: base, apiKey, maxRetries: 0, timeout: 60000 });
const system = 'You are terse.';
const msgs = [{ role: 'user', content: 'What is the weather in Oslo for the next 3 days?' }];
const weatherParams = { type: 'object', properties: { city: { type: 'string' },
  days: { type: 'integer' }, unit: { enum: ['c', 'f'] } },
  required: ['city', 'days', 'unit'], additionalProperties: false };
const tools = [{ name: 'get_weather', description: 'Weather forecast', input_schema: weatherParams }];

function weatherValid(a) {
  return a && typeof a.city === 'string' && Number.isInteger(a.days) && ['c', 'f'].includes(a.unit)
    && Object.keys(a).sort().join() === 'city,days,unit';
}

const text = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

async function expectErr(fn, Cls, status, type, needle) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof Cls, `expected ${Cls.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    assert.equal(e.error.type, 'error', JSON.stringify(e.error));
    assert.equal(e.error.error.type, type);
    if (needle) assert.ok(e.error.error.message.includes(needle), e.error.error.message);
    return;
  }
  assert.fail(`expected ${Cls.name}`);
}

const checks = {
  // greedy: the Messages answer is the chat answer, token for token
  async createEqualsChat() {
    const a = await anthropic.messages.create({ model, system, messages: msgs, max_tokens: 16,
      temperature: 0 });
    assert.equal(a.type, 'message');
    assert.equal(a.role, 'assistant');
    assert.match(a.id, /^msg_/);
    assert.equal(a.model, model);
    assert.equal(a.content[0].type, 'text');
    assert.ok(['end_turn', 'max_tokens'].includes(a.stop_reason), a.stop_reason);
    assert.ok(a.usage.output_tokens > 0 && a.usage.output_tokens <= 16);
    const c = await openai.chat.completions.create({ model, max_tokens: 16, temperature: 0,
      messages: [{ role: 'system', content: system }, ...msgs] });
    assert.equal(text(a), c.choices[0].message.content);
    assert.equal(a.usage.output_tokens, c.usage.completion_tokens);
    assert.equal(a.usage.input_tokens + a.usage.cache_read_input_tokens, c.usage.prompt_tokens);
    assert.equal(a.stop_reason, c.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  },

  // messages.stream: the SDK's accumulator over Anthropic's event types
  async streamEqualsCreate() {
    const p = { model, system, messages: msgs, max_tokens: 16, temperature: 0 };
    const a = await anthropic.messages.create(p);
    const stream = anthropic.messages.stream(p);
    const types = [];
    let deltas = '';
    stream.on('streamEvent', (e) => types.push(e.type));
    stream.on('text', (t) => { deltas += t; });
    const fin = await stream.finalMessage();
    assert.equal(text(fin), text(a));
    assert.equal(deltas, text(a));
    assert.equal(fin.stop_reason, a.stop_reason);
    assert.equal(fin.usage.output_tokens, a.usage.output_tokens);
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    assert.equal(types.at(-2), 'message_delta');
    assert.ok(types.includes('content_block_start') && types.includes('content_block_delta') &&
      types.includes('content_block_stop'), types.join());
  },

  // sampled (temperature 1, a seed): the same tokens through all three doors
  async sameTokensThreeDoors() {
    const c = await openai.chat.completions.create({ model, messages: msgs, max_tokens: 12,
      temperature: 1, seed: 42 });
    const a = await anthropic.messages.create({ model, messages: msgs, max_tokens: 12,
      temperature: 1, seed: 42 });
    const r = await openai.responses.create({ model, input: msgs, max_output_tokens: 12,
      temperature: 1, seed: 42 });
    assert.equal(text(a), c.choices[0].message.content);
    assert.equal(r.output_text, c.choices[0].message.content);
    assert.equal(a.usage.output_tokens, c.usage.completion_tokens);
    assert.equal(r.usage.output_tokens, c.usage.completion_tokens);
    assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
  },

  // a forced tool_use, its tool_result in the next turn, answered as text
  async toolUseRoundTrip() {
    const r1 = await anthropic.messages.create({ model, messages: msgs, tools,
      tool_choice: { type: 'tool', name: 'get_weather' }, max_tokens: 300, temperature: 1,
      seed: 8 });
    assert.equal(r1.stop_reason, 'tool_use', JSON.stringify(r1.content));
    const tu = r1.content.find((b) => b.type === 'tool_use');
    assert.ok(tu, JSON.stringify(r1.content));
    assert.match(tu.id, /^toolu_[A-Za-z0-9]{24}$/);
    assert.equal(tu.name, 'get_weather');
    assert.ok(weatherValid(tu.input), JSON.stringify(tu.input));
    // streamed, the same call (input_json_delta)
    const s = anthropic.messages.stream({ model, messages: msgs, tools,
      tool_choice: { type: 'tool', name: 'get_weather' }, max_tokens: 300, temperature: 1,
      seed: 8 });
    let json = '';
    s.on('inputJson', (d) => { json += d; });
    const fin = await s.finalMessage();
    assert.equal(fin.stop_reason, 'tool_use');
    assert.deepEqual(fin.content.find((b) => b.type === 'tool_use').input, tu.input);
    assert.deepEqual(JSON.parse(json), tu.input);
    const turn = [...msgs, { role: 'assistant', content: r1.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id,
        content: '{"forecast": ["snow", "sun", "rain"]}' }] }];
    const r2 = await anthropic.messages.create({ model, messages: turn, tools,
      tool_choice: { type: 'none' }, max_tokens: 8, temperature: 0 });
    assert.equal(r2.content[0].type, 'text');
    assert.ok(['end_turn', 'max_tokens'].includes(r2.stop_reason));
    const in1 = r1.usage.input_tokens + r1.usage.cache_read_input_tokens;
    const in2 = r2.usage.input_tokens + r2.usage.cache_read_input_tokens;
    assert.ok(in2 > in1 + 40, `${in2} vs ${in1}`);
    // tool_choice any: a call to one of the tools
    const r3 = await anthropic.messages.create({ model, messages: msgs, tools,
      tool_choice: { type: 'any' }, max_tokens: 300, temperature: 1, seed: 9 });
    assert.equal(r3.stop_reason, 'tool_use');
  },

  async countTokens() {
    const n = await anthropic.messages.countTokens({ model, system, messages: msgs });
    const a = await anthropic.messages.create({ model, system, messages: msgs, max_tokens: 2,
      temperature: 0 });
    assert.equal(n.input_tokens, a.usage.input_tokens + a.usage.cache_read_input_tokens);
    const t = await anthropic.messages.countTokens({ model, system, messages: msgs, tools });
    assert.ok(t.input_tokens > n.input_tokens + 20, `${t.input_tokens} vs ${n.input_tokens}`);
  },

  // a stop sequence taken from the greedy answer ends it there
  async stopSequence() {
    const p = { model, messages: msgs, max_tokens: 24, temperature: 0 };
    const full = text(await anthropic.messages.create(p));
    assert.ok(full.length >= 8, `answer too short to cut: ${JSON.stringify(full)}`);
    const stop = full.slice(4, 7);
    const at = full.indexOf(stop);
    const b = await anthropic.messages.create({ ...p, stop_sequences: [stop] });
    assert.equal(b.stop_reason, 'stop_sequence');
    assert.equal(b.stop_sequence, stop);
    assert.equal(text(b), full.slice(0, at));
  },

  async errorsInAnthropicsEnvelope() {
    await expectErr(() => anthropic.messages.create({ model, messages: msgs, max_tokens: 4,
      frequency: 1 }), Anthropic.BadRequestError, 400, 'invalid_request_error', "'frequency'");
    await expectErr(() => anthropic.messages.create({ model, messages: msgs }),
      Anthropic.BadRequestError, 400, 'invalid_request_error', 'max_tokens');
    await expectErr(() => anthropic.messages.create({ model, messages: msgs, max_tokens: 4,
      thinking: { type: 'enabled', budget_tokens: 1024 } }), Anthropic.BadRequestError, 400,
    'invalid_request_error', 'thinking');
    await expectErr(() => anthropic.messages.create({ model: 'claude-nope', messages: msgs,
      max_tokens: 4 }), Anthropic.NotFoundError, 404, 'not_found_error', 'claude-nope');
    const wrong = new Anthropic({ baseURL: root, apiKey: 'wrong-key', maxRetries: 0 });
    await expectErr(() => wrong.messages.create({ model, messages: msgs, max_tokens: 4 }),
      Anthropic.AuthenticationError, 401, 'authentication_error');
    // Bearer works too (the SDK's authToken)
    const bearer = new Anthropic({ baseURL: root, apiKey: null, authToken: apiKey, maxRetries: 0 });
    const ok = await bearer.messages.create({ model, messages: msgs, max_tokens: 2 });
    assert.equal(ok.type, 'message');
  },
};

await runChecks(checks);
