// LangChain's OpenAIEmbeddings (@langchain/openai) against a REAL deployment
// (`test-e2e node-emb`: the prefill pools by embeddings.pooling=mean):
// embedQuery and embedDocuments, and dimensions (1024 of the built-in
// model's 1920: its first values are zero for short prompts); the vectors
// equal the plain /v1/embeddings answer. Exit 0 = all passed.
import { OpenAIEmbeddings } from '@langchain/openai';
import assert from 'node:assert/strict';
import { runChecks } from '../node/run_checks.mjs';

const base = process.env.PD_E2E_BASE_URL, apiKey = process.env.PD_E2E_API_KEY;
const model = process.env.PD_E2E_MODEL;
const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);
const cos = (a, b) => dot(a, b) / Math.sqrt(dot(a, a) * dot(b, b));
async function plain(input) {
  const r = await fetch(`${base}/embeddings`, { method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, input, encoding_format: 'float' }) });
  assert.equal(r.status, 200);
  return (await r.json()).data.map((d) => d.embedding);
}
const emb = new OpenAIEmbeddings({ model, apiKey, configuration: { baseURL: base }, maxRetries: 0 });

await runChecks({
  'embedQuery': async () => {
    const v = await emb.embedQuery('The licensor grants you');
    const [want] = await plain('The licensor grants you');
    assert.equal(v.length, want.length);
    assert.ok(cos(v, want) >= 0.99999);
  },
  'embedDocuments (one request, in order)': async () => {
    const docs = ['This program is free software', 'x', 'You may convey verbatim copies'];
    const vs = await emb.embedDocuments(docs);
    const want = await plain(docs);
    assert.equal(vs.length, 3);
    vs.forEach((v, i) => assert.ok(cos(v, want[i]) >= 0.99999));
  },
  'dimensions': async () => {
    const e2 = new OpenAIEmbeddings({ model, apiKey, configuration: { baseURL: base },
      dimensions: 1024, maxRetries: 0 });
    const v = await e2.embedQuery('hello');
    assert.equal(v.length, 1024);
    assert.ok(Math.abs(dot(v, v) - 1) < 1e-5);
  },
});
