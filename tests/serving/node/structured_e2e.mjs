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
import Ajv2020 from 'ajv/dist/2020.js';
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

  // recursion: a tree (items $ref "#") and a linked list ($defs), as raw
  // schemas through the SDK; every answer validates with ajv
  async recursiveTreeAndList() {
    const tree = { type: 'object', properties: { value: { type: 'integer' },
      children: { type: 'array', items: { $ref: '#' } } },
    required: ['value', 'children'], additionalProperties: false };
    const list = { type: 'object', $defs: { node: { type: 'object', properties: {
      v: { type: 'string', maxLength: 8 }, next: { anyOf: [{ type: 'null' }, { $ref: '#/$defs/node' }] } },
    required: ['v', 'next'], additionalProperties: false } },
    properties: { head: { $ref: '#/$defs/node' } }, required: ['head'], additionalProperties: false };
    for (const [name, schema] of [['tree', tree], ['list', list]]) {
      const validate = ajv.compile(schema);
      for (let seed = 1; seed <= 3; seed++) {
        const r = await client.chat.completions.create({ model, messages: msgs,
          max_tokens: seed === 2 ? 150 : 1500, temperature: 1, seed,
          response_format: { type: 'json_schema', json_schema: { name, schema } } });
        const c = r.choices[0];
        assert.equal(c.finish_reason, 'stop', c.message.content);
        assert.ok(validate(JSON.parse(c.message.content)),
          `${name} seed ${seed}: ${c.message.content}: ${ajv.errorsText(validate.errors)}`);
      }
    }
  },

  // the keywords added with the rule engine, checked by ajv (+ ajv-formats)
  async patternsFormatsNumbers() {
    const schema = { type: 'object', properties: {
      code: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}$' },
      host: { type: 'string', format: 'hostname' }, ip: { type: 'string', format: 'ipv4' },
      ip6: { type: 'string', format: 'ipv6' }, uri: { type: 'string', format: 'uri' },
      dur: { type: 'string', format: 'duration' },
      m: { type: 'integer', multipleOf: 7, minimum: -70, maximum: 70 },
      p: { type: 'number', minimum: 0, maximum: 1 },
      pair: { type: 'array', prefixItems: [{ type: 'string' }, { type: 'integer' }], items: false },
      map: { type: 'object', additionalProperties: { type: 'boolean' } } },
    required: ['code', 'host', 'ip', 'ip6', 'uri', 'dur', 'm', 'p', 'pair', 'map'],
    additionalProperties: false };
    const validate = new Ajv2020({ strict: false, allErrors: true }); // prefixItems
    addFormats(validate);
    const v = validate.compile(schema);
    for (let seed = 1; seed <= 3; seed++) {
      const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 1500,
        temperature: 1, seed, response_format: { type: 'json_schema', json_schema: { name: 'k', schema } } });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', c.message.content);
      assert.ok(v(JSON.parse(c.message.content)), `${c.message.content}: ${validate.errorsText(v.errors)}`);
    }
  },

  // vLLM's guided_regex / structured_outputs.regex (chat and completions):
  // the whole output matches the same expression as a JS RegExp
  async guidedRegex() {
    const re = '[a-z]{2,8}@[a-z]{2,6}\\.(com|org)( [0-9]{1,3}){0,2}';
    const js = new RegExp(`^(?:${re})$`);
    for (let seed = 1; seed <= 3; seed++) {
      const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 200,
        temperature: 1, seed, guided_regex: re });
      assert.equal(r.choices[0].finish_reason, 'stop');
      assert.match(r.choices[0].message.content, js);
      const k = await client.completions.create({ model, prompt: 'mail:', max_tokens: 200,
        temperature: 1, seed, structured_outputs: { regex: re } });
      assert.match(k.choices[0].text, js);
    }
  },

  // llama-server's GBNF "grammar" (recursive through parentheses) and
  // guided_choice: checked by a small parser / the list
  async gbnfAndChoice() {
    const grammar = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\n' +
      'term ::= factor (("*" | "/") factor)*\nfactor ::= [0-9]{1,3} | "(" expr ")"\n';
    const parse = (s) => {
      let i = 0;
      const factor = () => {
        if (s[i] === '(') { i++; expr(); if (s[i++] !== ')') throw new Error('no )'); return; }
        const m = /^[0-9]{1,3}/.exec(s.slice(i));
        if (!m) throw new Error(`digit expected at ${i}`);
        i += m[0].length;
      };
      const term = () => { factor(); while (s[i] === '*' || s[i] === '/') { i++; factor(); } };
      const expr = () => { term(); while (s[i] === '+' || s[i] === '-') { i++; term(); } };
      expr();
      if (i !== s.length) throw new Error(`trailing at ${i}`);
    };
    for (let seed = 1; seed <= 3; seed++) {
      const r = await client.chat.completions.create({ model, messages: msgs,
        max_tokens: seed === 2 ? 30 : 300, temperature: 1, seed, grammar });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', c.message.content);
      assert.doesNotThrow(() => parse(c.message.content), c.message.content);
      const ch = await client.chat.completions.create({ model, messages: msgs, max_tokens: 20,
        temperature: 1, seed, guided_choice: ['red', 'green', 'a "blue" one'] });
      assert.ok(['red', 'green', 'a "blue" one'].includes(ch.choices[0].message.content),
        ch.choices[0].message.content);
    }
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
      schema: { type: 'object', properties: { age: { type: 'number', multipleOf: 0.5 } } } } } },
    'response_format', 'at /properties/age/multipleOf');
    await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'array' } } } }, 'response_format', 'root');
    await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'object', properties: { a: { $ref: '#/$defs/n' } }, required: ['a'],
        $defs: { n: { type: 'object', properties: { k: { $ref: '#/$defs/n' } }, required: ['k'] } } } } } },
    'response_format', 'never ends');
    await expect400({ grammar: 'root ::= root "a" | "b"' }, 'grammar', 'left recursion');
    await expect400({ guided_regex: '(?<=a)b' }, 'guided_regex', 'lookaround');
    await expect400({ guided_regex: 'a', grammar: 'root ::= "a"' }, 'guided_regex');
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
