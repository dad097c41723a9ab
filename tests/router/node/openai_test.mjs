// The official `openai` npm client against pd-router + fake daemons (started
// by test-router-int --node). Exit 0 = all checks passed.
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const baseURL = process.env.PD_ROUTER_URL;
const apiKey = process.env.PD_API_KEY;
const model = process.env.PD_MODEL;
const SCRIPT = process.env.PD_SCRIPT_TEXT;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 10000 });
const LONG = 'The quick brown fox jumps over the lazy dog again and again';

async function expectError(fn, Cls, status, code) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof Cls, `expected ${Cls.name}, got ${e.constructor.name}: ${e.message}`);
    if (status !== undefined) assert.equal(e.status, status);
    if (code !== undefined) assert.equal(e.code, code);
    return e;
  }
  assert.fail(`expected ${Cls.name}`);
}

const checks = {
  async models() {
    const list = await client.models.list();
    assert.equal(list.data[0].id, model);
  },

  async completionsStreamUsage() {
    const { data: stream, response } = await client.completions.create(
      { model, prompt: LONG, max_tokens: 50, stream: true, stream_options: { include_usage: true } },
      { headers: { 'X-Request-Id': 'node-stream-1' } }).withResponse();
    assert.equal(response.headers.get('x-request-id'), 'node-stream-1');
    let text = '', finish = null, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(text, SCRIPT);
    assert.equal(finish, 'stop');
    assert.equal(usage.completion_tokens, SCRIPT.length);
    assert.ok(usage.prompt_tokens >= 32);
  },

  async chatStreamUsage() {
    const stream = await client.chat.completions.create({
      model, messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }],
      max_completion_tokens: 50, stream: true, stream_options: { include_usage: true } });
    let text = '', role = null, finish = null, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role && role === null) role = c.delta.role;
        text += c.delta.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(role, 'assistant');
    assert.equal(text, SCRIPT);
    assert.equal(finish, 'stop');
    assert.equal(usage.completion_tokens, SCRIPT.length);
  },

  async chatNonStream() {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 });
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, SCRIPT.slice(0, 5));
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 5);
  },

  async streamHelper() {
    // the SDK's higher-level helper accumulates the final message
    const runner = client.beta.chat.completions.stream({
      model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 50 });
    const final = await runner.finalChatCompletion();
    assert.equal(final.choices[0].message.content, SCRIPT);
  },

  async errors() {
    await expectError(() => client.completions.create({ model, prompt: 'x', max_tokens: 1e6 }),
      OpenAI.BadRequestError, 400);
    await expectError(() => client.completions.create({ model, prompt: 'x'.repeat(5000), max_tokens: 10 }),
      OpenAI.BadRequestError, 400, 'context_length_exceeded');
    await expectError(() => client.completions.create({ model: 'nope', prompt: 'x' }),
      OpenAI.NotFoundError, 404);
    const bad = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
    await expectError(() => bad.completions.create({ model, prompt: 'x' }),
      OpenAI.AuthenticationError, 401);
    await expectError(() => client.chat.completions.create({ model, messages: 'hi' }),
      OpenAI.BadRequestError, 400);
  },

  async midStreamFailureIsAnError() {
    // the fake decode fails after one token on every attempt: the stream must
    // end with an error, never as a clean (successful) completion
    const stream = await client.completions.create({ model, prompt: 'FAILME', max_tokens: 50, stream: true });
    let text = '';
    await expectError(async () => {
      for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    }, OpenAI.APIError);
    assert.ok(text.length >= 1 && SCRIPT.startsWith(text), `partial text ${text}`);
  },
};

let failed = 0;
for (const [name, fn] of Object.entries(checks)) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}
process.exit(failed ? 1 : 0);
