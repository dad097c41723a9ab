// Structured output through a REAL deployment (pd-router + pd-prefill +
// pd-decode on the built-in model, random weights) with the official
// `openai` client: response_format json_object / json_schema, streaming and
// not, the client's zod helper (client.beta.chat.completions.parse with
// zodResponseFormat), and a 400 for every refused field or schema keyword.
// Every output must parse and validate (zod's safeParse for the zod case, a
// validator below otherwise). Exit 0 = all passed.
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { runChecks } from './run_checks.mjs';

const client = new OpenAI({ baseURL: process.env.PD_E2E_BASE_URL,
  apiKey: process.env.PD_E2E_API_KEY, maxRetries: 0, timeout: 60000 });
const model = process.env.PD_E2E_MODEL;
const msgs = [{ role: 'user', content: 'Describe a person as JSON.' }];

// A JSON-schema validator for the keywords the server accepts, written
// against the JSON Schema meaning of each keyword.
function valid(v, s, root) {
  if (s.$ref) return valid(v, root.$defs[s.$ref.replace('#/$defs/', '')], root);
  if ('const' in s && JSON.stringify(v) !== JSON.stringify(s.const)) return false;
  if (s.enum && !s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) return false;
  if (s.anyOf && !s.anyOf.some((a) => valid(v, a, root))) return false;
  if (s.type) {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    const is = (t) => t === 'null' ? v === null
      : t === 'array' ? Array.isArray(v)
      : t === 'object' ? v !== null && typeof v === 'object' && !Array.isArray(v)
      : t === 'integer' ? Number.isInteger(v)
      : t === 'number' ? typeof v === 'number' && Number.isFinite(v)
      : typeof v === t;
    if (!types.some(is)) return false;
  }
  if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
    for (const r of s.required ?? []) if (!(r in v)) return false;
    for (const [k, x] of Object.entries(v)) {
      const ps = s.properties?.[k];
      if (!ps) { if (s.additionalProperties === false) return false; continue; }
      if (!valid(x, ps, root)) return false;
    }
  }
  if (Array.isArray(v) && s.items) return v.every((x) => valid(x, s.items, root));
  return true;
}

const person = {
  type: 'object',
  $defs: { pet: { type: 'object', properties: { kind: { enum: ['cat', 'dog'] },
    name: { type: 'string' } }, required: ['kind', 'name'], additionalProperties: false } },
  properties: {
    name: { type: 'string' }, age: { type: 'integer' }, height: { type: 'number' },
    member: { type: 'boolean' }, nick: { type: ['string', 'null'] },
    pets: { type: 'array', items: { $ref: '#/$defs/pet' } },
    id: { anyOf: [{ type: 'integer' }, { type: 'string' }] },
  },
  required: ['name', 'age', 'height', 'member', 'nick', 'pets', 'id'],
  additionalProperties: false,
};
const rfSchema = { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } };

async function expect400(params, param, needle) {
  try {
    await client.chat.completions.create({ model, messages: msgs, ...params });
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, `${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, 400);
    if (param) assert.equal(e.param, param);
    if (needle) assert.ok(e.message.includes(needle), `'${e.message}' lacks '${needle}'`);
    return;
  }
  assert.fail(`accepted: ${JSON.stringify(params)}`);
}

// An independent validator for the schemas zod emits (formats included).
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

const checks = {
  // zod's .int() / .min() / .max() / .email() / .uuid() / .date() /
  // .datetime() / .default() and arrays with .min(): the schema the
  // client's helper sends is accepted, and every answer validates (ajv
  // against that schema, and zod's own parse)
  async zodBoundsAndFormats() {
    const Item = z.object({ sku: z.string().uuid(), qty: z.number().int().min(1).max(99) });
    const Order = z.object({
      id: z.string().uuid(), email: z.string().email(), name: z.string().min(1).max(12),
      count: z.number().int().min(-5).max(5),
      big: z.number().int().min(-9007199254740991).max(9007199254740991),
      status: z.enum(['new', 'paid']).default('new'),
      items: z.array(Item).min(1).max(2), tags: z.array(z.string().max(6)).min(2).max(3),
      day: z.string().date(), at: z.string().datetime(),
    });
    const rf = zodResponseFormat(Order, 'order');
    const validate = ajv.compile(rf.json_schema.schema);
    for (let seed = 1; seed <= 3; seed++) {
      const r = await client.beta.chat.completions.parse({ model, messages: msgs,
        max_tokens: 1500, temperature: 1, seed, response_format: rf });
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'stop', m.content);
      assert.ok(validate(JSON.parse(m.content)), `${m.content}: ${ajv.errorsText(validate.errors)}`);
      assert.ok(Order.safeParse(m.parsed).success, m.content);
    }
  },

  async jsonSchemaNonStream() {
    for (let seed = 1; seed <= 6; seed++) {
      const r = await client.chat.completions.create({ model, messages: msgs,
        max_tokens: seed % 2 ? 1500 : 120,
        temperature: 1, seed, response_format: rfSchema });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', `seed ${seed}: ${c.message.content}`);
      const v = JSON.parse(c.message.content);
      assert.ok(valid(v, person, person), `seed ${seed}: invalid ${c.message.content}`);
    }
  },

  async jsonSchemaStreamEqualsNonStream() {
    const p = { model, messages: msgs, max_tokens: 1500, temperature: 1, seed: 42,
      response_format: rfSchema };
    const n = await client.chat.completions.create(p);
    const s = await client.chat.completions.create({ ...p, stream: true });
    let text = '', finish = null;
    for await (const ch of s) for (const c of ch.choices) {
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(text, n.choices[0].message.content);
    assert.equal(finish, 'stop');
    assert.ok(valid(JSON.parse(text), person, person));
  },

  // max_tokens bounds the output: the mask closes the JSON in time.
  async jsonObject() {
    for (let seed = 1; seed <= 6; seed++) {
      const max_tokens = [1500, 40, 200][seed % 3];
      const r = await client.chat.completions.create({ model, messages: msgs, max_tokens,
        temperature: 1, seed, response_format: { type: 'json_object' } });
      assert.ok(r.usage.completion_tokens <= max_tokens);
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', c.message.content);
      const v = JSON.parse(c.message.content);
      assert.ok(v !== null && typeof v === 'object' && !Array.isArray(v));
    }
  },

  // logprobs stay those of the model's (unmasked) distribution: finite
  async withLogprobs() {
    const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 300,
      temperature: 1, seed: 3, logprobs: true, top_logprobs: 5,
      response_format: { type: 'json_object' } });
    const c = r.choices[0];
    JSON.parse(c.message.content);
    assert.equal(c.logprobs.content.length, r.usage.completion_tokens);
    for (const t of c.logprobs.content) {
      assert.ok(Number.isFinite(t.logprob) && t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 5);
      for (const a of t.top_logprobs) assert.ok(Number.isFinite(a.logprob));
    }
  },

  async zodHelperParse() {
    const Pet = z.object({ kind: z.enum(['cat', 'dog']), name: z.string() });
    const Person = z.object({ name: z.string(), age: z.number().int(), pets: z.array(Pet),
      nick: z.string().nullable() });
    for (let seed = 1; seed <= 4; seed++) {
      const r = await client.beta.chat.completions.parse({ model, messages: msgs,
        max_tokens: 1500, temperature: 1, seed,
        response_format: zodResponseFormat(Person, 'person') });
      const m = r.choices[0].message;
      assert.ok(m.parsed, m.content);
      assert.ok(Person.safeParse(m.parsed).success, m.content);
    }
  },

  async zodHelperStream() {
    const Person = z.object({ name: z.string(), tags: z.array(z.string()) });
    const runner = client.beta.chat.completions.stream({ model, messages: msgs,
      max_tokens: 1500, temperature: 1, seed: 9,
      response_format: zodResponseFormat(Person, 'p') });
    const fin = await runner.finalChatCompletion();
    assert.ok(Person.safeParse(fin.choices[0].message.parsed).success,
      fin.choices[0].message.content);
  },

  async refusals() {
    for (const kw of ['pattern', 'format', 'oneOf', 'allOf', 'not', 'patternProperties',
      'uniqueItems']) {
      await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x',
        schema: { type: 'object', properties: { a: { type: 'string', [kw]: 1 } },
          required: ['a'], additionalProperties: false } } } }, 'response_format', kw);
    }
    // a refused keyword is named by its JSON pointer
    await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'object', properties: { age: { type: 'number', minimum: 0 } } } } } },
    'response_format', 'at /properties/age/minimum');
    await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'array' } } } }, 'response_format', 'root');
    await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'object', properties: { a: { $ref: '#/$defs/n' } },
        $defs: { n: { type: 'object', properties: { k: { $ref: '#/$defs/n' } } } } } } } },
    'response_format', 'recursive');
    await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'bad name!',
      schema: person } } }, 'response_format', 'name');
    await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: person, extra: 1 } } }, 'response_format', 'extra');
    await expect400({ response_format: { type: 'json_schema' } }, 'response_format');
    await expect400({ response_format: { type: 'xml' } }, 'response_format');
    await expect400({ response_format: { type: 'json_object' }, ignore_eos: true }, 'ignore_eos');
    await expect400({ response_format: { type: 'json_object' }, min_tokens: 3 }, 'min_tokens');
  },
};

await runChecks(checks);
