// The official `openai` npm client against a REAL deployment (pd-router +
// pd-prefill + pd-decode, started by `test-e2e node`). Exit 0 = all passed.
// Greedy outputs are compared between streaming and non-streaming and
// between completions and chat (same engine, same prompt => same tokens).
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const baseURL = process.env.PD_E2E_BASE_URL;
const apiKey = process.env.PD_E2E_API_KEY;
const model = process.env.PD_E2E_MODEL;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const LONG = 'The quick brown fox jumps over the lazy dog, again and again and again.';

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

async function streamCompletion(params, opts) {
  const { data: stream, response } = await client.completions
    .create({ ...params, stream: true, stream_options: { include_usage: true } }, opts)
    .withResponse();
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'text_completion');
    if (chunk.usage) { usage = chunk.usage; assert.equal(chunk.choices.length, 0); }
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage, chunks, response };
}

const checks = {
  async models() {
    const list = await client.models.list();
    assert.equal(list.data[0].id, model);
  },

  async completionsStreamVsNonStream() {
    const p = { model, prompt: LONG, max_tokens: 20, temperature: 0 };
    const s = await streamCompletion(p, { headers: { 'X-Request-Id': 'e2e-node-1' } });
    assert.equal(s.response.headers.get('x-request-id'), 'e2e-node-1');
    assert.ok(s.finish === 'length' || s.finish === 'stop');
    assert.ok(s.usage && s.usage.completion_tokens > 0 && s.usage.completion_tokens <= 20);
    assert.ok(s.usage.prompt_tokens > 32);
    assert.equal(s.usage.total_tokens, s.usage.prompt_tokens + s.usage.completion_tokens);
    const n = await client.completions.create(p);
    assert.equal(n.choices[0].text, s.text);
    assert.equal(n.choices[0].finish_reason, s.finish);
    assert.deepEqual(n.usage, s.usage);
  },

  async tokenIdPrompt() {
    const ids = Array.from({ length: 40 }, (_, i) => 4 + ((i * 37) % 250));
    const a = await client.completions.create({ model, prompt: ids, max_tokens: 8, temperature: 0 });
    const b = await streamCompletion({ model, prompt: ids, max_tokens: 8, temperature: 0 });
    assert.equal(a.choices[0].text, b.text);
    assert.equal(a.usage.prompt_tokens, 40);
  },

  async chatStreamUsage() {
    const msgs = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi there, how are you?' }];
    const stream = await client.chat.completions.create({
      model, messages: msgs, max_completion_tokens: 12, temperature: 0,
      stream: true, stream_options: { include_usage: true } });
    let text = '', role = null, finish = null, usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role && role === null) role = c.delta.role;
        text += c.delta.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(role, 'assistant');
    assert.ok(finish === 'length' || finish === 'stop');
    assert.ok(usage.completion_tokens > 0 && usage.completion_tokens <= 12);
    const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 12, temperature: 0 });
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, text);
    assert.equal(r.choices[0].finish_reason, finish);
    assert.equal(r.usage.completion_tokens, usage.completion_tokens);
  },

  async streamHelper() {
    const runner = client.beta.chat.completions.stream({
      model, messages: [{ role: 'user', content: 'count' }], max_tokens: 6, temperature: 0 });
    const final = await runner.finalChatCompletion();
    assert.equal(final.choices[0].message.role, 'assistant');
    assert.ok(['length', 'stop'].includes(final.choices[0].finish_reason));
  },

  async parallelStreams() {
    const rs = await Promise.all(Array.from({ length: 8 }, () =>
      streamCompletion({ model, prompt: LONG, max_tokens: 10, temperature: 0 })));
    for (const r of rs) assert.equal(r.text, rs[0].text);
  },

  async errorClasses() {
    await expectError(() => client.completions.create({ model: 'nope', prompt: 'x' }),
      OpenAI.NotFoundError, 404, 'model_not_found');
    await expectError(() => client.completions.create({ model, prompt: 'x', max_tokens: 100000 }),
      OpenAI.BadRequestError, 400);
    await expectError(() => client.completions.create({ model, prompt: 'x', temperature: -3 }),
      OpenAI.BadRequestError, 400);
    const ids = Array.from({ length: 4090 }, () => 65);
    await expectError(() => client.completions.create({ model, prompt: ids, max_tokens: 100 }),
      OpenAI.BadRequestError, 400, 'context_length_exceeded');
    await expectError(() => client.chat.completions.create({ model, messages: [] }),
      OpenAI.BadRequestError, 400);
    const bad = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
    await expectError(() => bad.completions.create({ model, prompt: 'x' }),
      OpenAI.AuthenticationError, 401);
  },

  async abortMidStream() {
    const ac = new AbortController();
    const stream = await client.completions.create(
      { model, prompt: LONG, max_tokens: 2000, ignore_eos: true, stream: true },
      { signal: ac.signal });
    let n = 0;
    try {
      for await (const _ of stream) { if (++n === 3) ac.abort(); }
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', e.message);
    }
    assert.ok(n >= 3);
  },
};

let failed = 0;
for (const [name, fn] of Object.entries(checks)) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack}`);
  }
}
process.exit(failed ? 1 : 0);
