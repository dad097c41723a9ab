// The official `openai` client's embeddings.create against a REAL deployment
// (pd-router + pd-prefill --embeddings.pooling=mean + pd-decode, started by
// `test-e2e node-emb`; the built-in model): a string, a batch of strings,
// token ids, base64 (the client decodes it), dimensions (truncated and
// renormalised), usage; each vector equals pd-run --embed mean on the same
// GGUF (cosine >= 0.9999); refusals name their field. Exit 0 = all passed.
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { runChecks } from './run_checks.mjs';

const client = new OpenAI({ baseURL: process.env.PD_E2E_BASE_URL,
  apiKey: process.env.PD_E2E_API_KEY, maxRetries: 0, timeout: 60000 });
const model = process.env.PD_E2E_MODEL;
const ref = (args) => execFileSync(process.env.PD_E2E_PDRUN, ['--model', process.env.PD_E2E_GGUF,
  ...args, '--embed', 'mean', '--threads', '1']).toString().trim().split(' ').map(Number);
const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);
const cos = (a, b) => dot(a, b) / Math.sqrt(dot(a, a) * dot(b, b));
const texts = ['This program is free software', 'The licensor grants you', 'x'];

async function bad(params, param) {
  await assert.rejects(client.embeddings.create({ model, ...params }), (e) => {
    assert.equal(e.status, 400, e.message);
    assert.equal(e.param, param, e.message);
    return true;
  });
}

await runChecks({
  'one string: pd-run --embed mean, unit length, usage': async () => {
    const r = await client.embeddings.create({ model, input: texts[0], encoding_format: 'float' });
    assert.equal(r.object, 'list');
    assert.equal(r.model, model);
    assert.equal(r.data.length, 1);
    assert.equal(r.data[0].object, 'embedding');
    assert.equal(r.data[0].index, 0);
    const v = r.data[0].embedding, want = ref(['--prompt', texts[0]]);
    assert.equal(v.length, want.length);
    assert.ok(Math.abs(dot(v, v) - 1) < 1e-5);
    assert.ok(cos(v, want) >= 0.9999, `cosine ${cos(v, want)}`);
    assert.ok(r.usage.prompt_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
  },
  'a batch of strings, in order; bitwise the same as one by one': async () => {
    const r = await client.embeddings.create({ model, input: texts, encoding_format: 'float' });
    assert.deepEqual(r.data.map((d) => d.index), [0, 1, 2]);
    let tokens = 0;
    for (const [i, t] of texts.entries()) {
      const one = await client.embeddings.create({ model, input: t, encoding_format: 'float' });
      assert.deepEqual(r.data[i].embedding, one.data[0].embedding); // the prefill batches
      tokens += one.usage.prompt_tokens;
    }
    assert.equal(r.usage.prompt_tokens, tokens);
  },
  'token ids, and an array of them': async () => {
    const ids = [1, 84, 104, 101];
    const r = await client.embeddings.create({ model, input: ids, encoding_format: 'float' });
    assert.equal(r.usage.prompt_tokens, 4);
    assert.ok(cos(r.data[0].embedding, ref(['--tokens', ids.join(',')])) >= 0.9999);
    const r2 = await client.embeddings.create({ model, input: [ids, [1, 65]], encoding_format: 'float' });
    assert.equal(r2.data.length, 2);
    assert.equal(r2.usage.prompt_tokens, 6);
  },
  'base64 (the client default) decodes to the float answer': async () => {
    const f = await client.embeddings.create({ model, input: texts[1], encoding_format: 'float' });
    const b = await client.embeddings.create({ model, input: texts[1] }); // SDK: base64, decoded
    assert.equal(b.data[0].embedding.length, f.data[0].embedding.length);
    b.data[0].embedding.forEach((x, i) => assert.ok(Math.abs(x - f.data[0].embedding[i]) < 1e-6));
    const raw = await client.embeddings.create({ model, input: texts[1], encoding_format: 'base64' });
    assert.equal(typeof raw.data[0].embedding, 'string');
  },
  'dimensions: the first values, renormalised': async () => {
    const f = await client.embeddings.create({ model, input: texts[0], encoding_format: 'float' });
    const k = f.data[0].embedding.length >> 1;
    const d = await client.embeddings.create({ model, input: texts[0], dimensions: k,
      encoding_format: 'float' });
    const v = d.data[0].embedding, head = f.data[0].embedding.slice(0, k);
    assert.equal(v.length, k);
    assert.ok(Math.abs(dot(v, v) - 1) < 1e-5);
    assert.ok(cos(v, head) >= 0.99999);
    await bad({ input: 'x', dimensions: 1000000 }, 'dimensions');
  },
  'refusals name the field': async () => {
    await bad({ input: '' }, 'input');
    await bad({ input: [] }, 'input');
    await bad({ input: ['a', 7] }, 'input[1]');
    await bad({ input: [-1] }, 'input');
    await bad({ input: 'x', encoding_format: 'int8' }, 'encoding_format');
    await bad({ input: 'x', dimensions: 0 }, 'dimensions');
    await bad({ input: 'x', pooling: 'max' }, 'pooling');
    await bad({ input: Array(5000).fill(1) }, 'input'); // beyond the context
    const r = await client.embeddings.create({ model, input: 'x', user: 'u-1' });
    assert.equal(r.data.length, 1);
  },
});
