// The official `openai` npm client against a REAL deployment (pd-router +
// pd-prefill + pd-decode, started by `test-e2e node`). Exit 0 = all passed.
// Greedy outputs are compared between streaming and non-streaming and
// between completions and chat (same engine, same prompt => same tokens).
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { runChecks } from './run_checks.mjs';

const baseURL = process.env.PD_E2E_BASE_URL;
const apiKey = process.env.PD_E2E_API_KEY;
const model = process.env.PD_E2E_MODEL;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const LONG = 'The quick brown fox jumps over the lazy dog, again and again and again.';

// The reference: pd-run (single process) on the same model with the same
// token-id prompt and sampling options; it prints the text plus "\n".
function pdRun(ids, maxTokens, o) {
  const args = ['--model', process.env.PD_E2E_GGUF, '--tokens', ids.join(','),
    '--max-tokens', String(maxTokens), '--threads', '1',
    '--temperature', String(o.temperature ?? 0), '--seed', String(o.seed ?? 0)];
  if (o.top_p !== undefined) args.push('--top-p', String(o.top_p));
  if (o.presence_penalty !== undefined) args.push('--presence-penalty', String(o.presence_penalty));
  if (o.frequency_penalty !== undefined) args.push('--frequency-penalty', String(o.frequency_penalty));
  if (o.repetition_penalty !== undefined) args.push('--repetition-penalty', String(o.repetition_penalty));
  if (o.min_p !== undefined) args.push('--min-p', String(o.min_p));
  if (o.logit_bias) args.push('--logit-bias',
    Object.entries(o.logit_bias).map(([k, v]) => `${k}:${v}`).join(','));
  if (o.stop_token_ids) args.push('--stop-token-ids', o.stop_token_ids.join(','));
  const r = spawnSync(process.env.PD_E2E_PDRUN, args, { encoding: 'utf8' });
  assert.equal(r.status, 0, `pd-run failed: ${r.stderr}`);
  assert.ok(r.stdout.endsWith('\n'));
  return r.stdout.slice(0, -1);
}

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
    // the same prompt again: its full blocks come from the prefix cache
    const { prompt_tokens_details: nd, ...nu } = n.usage;
    const { prompt_tokens_details: sd, ...su } = s.usage;
    assert.deepEqual(nu, su);
    assert.ok(nd.cached_tokens >= sd.cached_tokens && nd.cached_tokens > 0);
    assert.ok(nd.cached_tokens < n.usage.prompt_tokens);
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

  // n: choice i samples with seed + i, so it is the n = 1 answer with that
  // seed; streamed chunks carry their choice's index; usage sums the choices.
  async nChoices() {
    const msgs = [{ role: 'user', content: 'tell me a story about a fox' }];
    const base = { model, messages: msgs, max_tokens: 10, temperature: 1, seed: 777 };
    const one = [];
    for (let i = 0; i < 3; i++)
      one.push(await client.chat.completions.create({ ...base, seed: 777 + i }));
    const r = await client.chat.completions.create({ ...base, n: 3 });
    assert.equal(r.choices.length, 3);
    let sum = 0;
    for (let i = 0; i < 3; i++) {
      assert.equal(r.choices[i].index, i);
      assert.equal(r.choices[i].message.content, one[i].choices[0].message.content);
      assert.equal(r.choices[i].finish_reason, one[i].choices[0].finish_reason);
      sum += one[i].usage.completion_tokens;
    }
    assert.equal(r.usage.completion_tokens, sum);
    const stream = await client.chat.completions.create({
      ...base, n: 3, stream: true, stream_options: { include_usage: true } });
    const text = ['', '', ''], roles = [null, null, null], fin = [null, null, null];
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role) roles[c.index] = c.delta.role;
        text[c.index] += c.delta.content ?? '';
        if (c.finish_reason) fin[c.index] = c.finish_reason;
      }
    }
    for (let i = 0; i < 3; i++) {
      assert.equal(roles[i], 'assistant');
      assert.equal(text[i], r.choices[i].message.content);
      assert.equal(fin[i], r.choices[i].finish_reason);
    }
    assert.equal(usage.completion_tokens, sum);
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

  // presence/frequency/repetition penalties, min_p, logit_bias and
  // stop_token_ids through the client, streamed and not, equal pd-run's text.
  async penaltiesMatchReference() {
    const ids = Array.from({ length: 48 }, (_, i) => 4 + ((i * 53) % 250));
    const sets = [
      { temperature: 0.9, seed: 7, presence_penalty: 1.5, frequency_penalty: 0.5 },
      { temperature: 1.0, seed: 8, top_p: 0.9, repetition_penalty: 1.6, min_p: 0.1 },
      { temperature: 0, logit_bias: { 77: 100 } },
      { temperature: 0.8, seed: 9, logit_bias: { 33: 5, 34: -100 }, frequency_penalty: -0.5 },
    ];
    for (const o of sets) {
      const want = pdRun(ids, 16, o);
      const n = await client.completions.create({ model, prompt: ids, max_tokens: 16, ...o });
      assert.equal(n.choices[0].text, want, JSON.stringify(o));
      const s = await streamCompletion({ model, prompt: ids, max_tokens: 16, ...o });
      assert.equal(s.text, want, JSON.stringify(o));
    }
    // stop_token_ids: the greedy continuation cut after the given id
    const greedyIds = spawnSync(process.env.PD_E2E_PDRUN, ['--model', process.env.PD_E2E_GGUF,
      '--tokens', ids.join(','), '--max-tokens', '16', '--threads', '1', '--tokens-out'],
      { encoding: 'utf8' }).stdout.trim().split(' ').map(Number);
    const o = { temperature: 0, stop_token_ids: [greedyIds[3]] };
    const want = pdRun(ids, 16, o);
    const n = await client.completions.create({ model, prompt: ids, max_tokens: 16, ...o });
    assert.equal(n.choices[0].text, want);
    assert.equal(n.choices[0].finish_reason, 'stop');
    assert.equal(n.usage.completion_tokens, greedyIds.indexOf(greedyIds[3]) + 1);
    // chat with penalties: streamed = non-streamed (same seed)
    const c = { model, messages: [{ role: 'user', content: 'tell me a story' }], max_tokens: 12,
      temperature: 0.9, seed: 3, presence_penalty: 1, frequency_penalty: 1, logit_bias: { 50: 3 } };
    const a = await client.chat.completions.create(c);
    const st = await client.chat.completions.create({ ...c, stream: true });
    let text = '';
    for await (const chunk of st) for (const ch of chunk.choices) text += ch.delta.content ?? '';
    assert.equal(text, a.choices[0].message.content);
  },

  // Every refused field gets a 400 that names it.
  async refusedFields() {
    const msgs = [{ role: 'user', content: 'x' }];
    const cases = [
      // tools are served (tools_e2e.mjs); a tool_choice needs tools
      [() => client.chat.completions.create({ model, messages: msgs, tool_choice: 'required' }),
        'tool_choice', null],
      // structured output is served (structured_e2e.mjs); a bad schema is refused
      [() => client.chat.completions.create({ model, messages: msgs,
        response_format: { type: 'json_schema', json_schema: { name: 'x',
          schema: { type: 'object', properties: { a: { type: 'string', pattern: '(?=a)' } } } } } }),
      'response_format', 'unsupported_schema'],
      [() => client.chat.completions.create({ model, messages: msgs, top_logprobs: 2 }),
        'top_logprobs', null],
      [() => client.chat.completions.create({ model, messages: msgs, n: 64 }), 'n', null],
      [() => client.chat.completions.create({ model, messages: [{ role: 'user' }] }),
        'messages[0].content', null],
      [() => client.chat.completions.create({ model, messages: msgs, frobnicate: 1 }),
        'frobnicate', 'unknown_parameter'],
      [() => client.completions.create({ model, prompt: 'x', max_completion_tokens: 4 }),
        'max_completion_tokens', 'unknown_parameter'],
      [() => client.completions.create({ model, prompt: 'x', echo: true }), 'echo', 'unsupported_parameter'],
      [() => client.completions.create({ model, prompt: 'x', logit_bias: { 5: 101 } }), 'logit_bias', null],
      [() => client.completions.create({ model, prompt: 'x', presence_penalty: 3 }), 'presence_penalty', null],
    ];
    for (const [fn, param, code] of cases) {
      const e = await expectError(fn, OpenAI.BadRequestError, 400);
      assert.equal(e.param, param);
      assert.equal(e.code, code);
      assert.equal(e.type, 'invalid_request_error');
    }
  },

  // An unseeded request draws a fresh seed, says which (X-Seed), and that
  // seed reproduces it; created is the request's time.
  async seedsAndCreated() {
    const p = { model, prompt: LONG, max_tokens: 12, temperature: 1 };
    const t0 = Math.floor(Date.now() / 1000);
    const { data: a, response: ra } = await client.completions.create(p).withResponse();
    const b = await streamCompletion(p);
    const rb = b.response;
    const t1 = Math.ceil(Date.now() / 1000);
    const sa = ra.headers.get('x-seed'), sb = rb.headers.get('x-seed');
    assert.ok(sa && sb && sa !== sb, `seeds ${sa} ${sb}`);
    assert.ok(a.created >= t0 && a.created <= t1, `created ${a.created} not in [${t0}, ${t1}]`);
    const again = await client.completions.create({ ...p, seed: Number(sa) });
    assert.equal(again.choices[0].text, a.choices[0].text);
    const s = await streamCompletion({ ...p, seed: Number(sb) });
    assert.equal(s.text, b.text);
    assert.equal(s.response.headers.get('x-seed'), sb);
    // and across modes: random tokens may include a byte 0, which must not
    // cut the non-streamed text (it is escaped as \u0000)
    for (let k = 0; k < 6; k++) {
      const x = await streamCompletion(p);
      const y = await client.completions.create({ ...p, seed: Number(x.response.headers.get('x-seed')) });
      assert.equal(y.choices[0].text, x.text);
    }
  },

  // logprobs in OpenAI's shapes, through the client, streamed and not.
  async chatLogprobs() {
    const c = { model, messages: [{ role: 'user', content: 'say something' }], max_tokens: 10,
      temperature: 0, logprobs: true, top_logprobs: 3 };
    const a = await client.chat.completions.create(c);
    const lp = a.choices[0].logprobs;
    assert.equal(lp.refusal, null);
    assert.equal(lp.content.length, a.usage.completion_tokens);
    let text = '';
    for (const e of lp.content) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0);
      assert.ok(Array.isArray(e.bytes));
      assert.equal(e.top_logprobs.length, 3);
      for (let k = 1; k < 3; k++) assert.ok(e.top_logprobs[k].logprob <= e.top_logprobs[k - 1].logprob);
      // greedy without penalties picks the model's most likely token
      assert.equal(e.top_logprobs[0].token, e.token);
      assert.equal(e.top_logprobs[0].logprob, e.logprob);
      assert.ok(e.top_logprobs.reduce((x, t) => x + Math.exp(t.logprob), 0) <= 1 + 1e-6);
      text += Buffer.from(e.bytes).toString('latin1');
    }
    // the bytes of the tokens are the bytes of the text (EOS excepted)
    const body = Buffer.from(a.choices[0].message.content, 'utf8').toString('latin1');
    assert.ok(text.startsWith(body), `${JSON.stringify(text)} vs ${JSON.stringify(body)}`);
    // streamed: the same entries, spread over the chunks
    const st = await client.chat.completions.create({ ...c, stream: true });
    const got = [];
    for await (const chunk of st)
      for (const ch of chunk.choices) if (ch.logprobs) got.push(...ch.logprobs.content);
    assert.deepEqual(got, lp.content);
    // the SDK's stream helper accumulates them too
    const final = await client.beta.chat.completions.stream(c).finalChatCompletion();
    assert.deepEqual(final.choices[0].logprobs.content, lp.content);
    // no logprobs asked: null
    const n = await client.chat.completions.create({ ...c, logprobs: false, top_logprobs: undefined });
    assert.equal(n.choices[0].logprobs, null);
  },

  async completionsLogprobsMatchReference() {
    const ids = Array.from({ length: 24 }, (_, i) => 4 + ((i * 71) % 250));
    const r = spawnSync(process.env.PD_E2E_PDRUN, ['--model', process.env.PD_E2E_GGUF,
      '--tokens', ids.join(','), '--max-tokens', '8', '--threads', '1', '--temperature', '0.8',
      '--seed', '21', '--tokens-out', '--logprobs-out', '2'], { encoding: 'utf8' });
    assert.equal(r.status, 0);
    const ref = r.stdout.split('\n').filter((l) => l.startsWith('#lp ')).map((l) => Number(l.split(' ')[2]));
    const p = { model, prompt: ids, max_tokens: 8, temperature: 0.8, seed: 21, logprobs: 2 };
    const a = await client.completions.create(p);
    const l = a.choices[0].logprobs;
    assert.equal(l.token_logprobs.length, ref.length);
    l.token_logprobs.forEach((v, i) => assert.ok(Math.abs(v - ref[i]) < 2e-3, `${i}: ${v} vs ${ref[i]}`));
    assert.equal(l.tokens.length, ref.length);
    assert.equal(l.text_offset[0], 0);
    for (const d of l.top_logprobs) assert.ok(Object.keys(d).length >= 1 && Object.keys(d).length <= 3);
    const s = await client.completions.create({ ...p, stream: true });
    const tl = [];
    for await (const chunk of s) for (const c of chunk.choices) if (c.logprobs) tl.push(...c.logprobs.token_logprobs);
    assert.deepEqual(tl, l.token_logprobs);
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
  'embeddings.create on a model without pooling: 400 embeddings_unsupported': async () => {
    // the built-in GGUF has no pooling_type and this prefill no embeddings.pooling
    await assert.rejects(client.embeddings.create({ model, input: 'hello' }), (e) => {
      assert.equal(e.status, 400, e.message);
      assert.equal(e.code, 'embeddings_unsupported', e.message);
      assert.equal(e.param, 'model');
      assert.match(e.message, /pooling/);
      return true;
    });
  },
};

await runChecks(checks);
