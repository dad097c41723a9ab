// The official `openai` client's Responses API against a REAL deployment
// (pd-router + pd-prefill + pd-decode, started by `test-e2e node`; the
// built-in model, ChatML = the Hermes tool format, random weights):
// responses.create plain (the chat API's tokens) and streamed (the
// Responses event sequence, and the client's responses.stream helper), a
// function-call round trip, text.format json_schema on the grammar engine,
// and 400s naming store / previous_response_id. Exit 0 = all passed.
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import { runChecks } from './run_checks.mjs';

const client = new OpenAI({ baseURL: process.env.PD_E2E_BASE_URL,
  apiKey: process.env.PD_E2E_API_KEY, maxRetries: 0, timeout: 60000 });
const model = process.env.PD_E2E_MODEL;
const ajv = new Ajv({ strict: false });
const instructions = 'You are terse.';
const question = 'What is the weather in Oslo for the next 3 days?';
const weatherParams = { type: 'object', properties: { city: { type: 'string' },
  days: { type: 'integer' }, unit: { enum: ['c', 'f'] } },
  required: ['city', 'days', 'unit'], additionalProperties: false };
const tools = [{ type: 'function', name: 'get_weather', description: 'Weather forecast',
  parameters: weatherParams, strict: true }];
const validWeather = ajv.compile(weatherParams);

async function streamed(params) {
  const stream = await client.responses.create({ ...params, stream: true });
  const types = [];
  let text = '', args = '', final = null, seq = -1;
  for await (const e of stream) {
    types.push(e.type);
    assert.equal(e.sequence_number, seq + 1);
    seq = e.sequence_number;
    if (e.type === 'response.output_text.delta') text += e.delta;
    if (e.type === 'response.function_call_arguments.delta') args += e.delta;
    if (e.type === 'response.completed' || e.type === 'response.incomplete') final = e.response;
  }
  return { types, text, args, final };
}

async function expect400(params, param) {
  try {
    await client.responses.create({ model, input: question, max_output_tokens: 4, ...params });
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, `${e.constructor.name}: ${e.message}`);
    assert.equal(e.param, param, e.message);
    assert.ok(e.message.includes(param), e.message);
    return;
  }
  assert.fail(`accepted: ${JSON.stringify(params)}`);
}

const checks = {
  async createEqualsChat() {
    const r = await client.responses.create({ model, instructions, input: question,
      max_output_tokens: 16, temperature: 0 });
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.equal(r.instructions, instructions); // echoed, as OpenAI does
    assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
    assert.equal(r.output[0].type, 'message');
    assert.equal(r.output[0].content[0].type, 'output_text');
    const c = await client.chat.completions.create({ model, max_tokens: 16, temperature: 0,
      messages: [{ role: 'system', content: instructions }, { role: 'user', content: question }] });
    assert.equal(r.output_text, c.choices[0].message.content);
    assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
    assert.equal(r.usage.output_tokens, c.usage.completion_tokens);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
    assert.equal(r.status, c.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  },

  async streamEqualsCreate() {
    const p = { model, instructions, input: question, max_output_tokens: 16, temperature: 0 };
    const r = await client.responses.create(p);
    const s = await streamed(p);
    assert.equal(s.text, r.output_text);
    assert.deepEqual(s.types.slice(0, 4), ['response.created', 'response.in_progress',
      'response.output_item.added', 'response.content_part.added']);
    assert.ok(s.types.includes('response.output_text.delta'));
    assert.deepEqual(s.types.slice(-4), ['response.output_text.done', 'response.content_part.done',
      'response.output_item.done', r.status === 'completed' ? 'response.completed'
        : 'response.incomplete']);
    assert.equal(s.final.output[0].content[0].text, r.output_text);
    assert.equal(s.final.usage.output_tokens, r.usage.output_tokens);
    // the client's own stream helper accumulates the same events (this
    // client version takes only response.completed as the final snapshot,
    // not response.incomplete: the text is compared, not the status)
    const h = client.responses.stream(p);
    const fin = await h.finalResponse();
    assert.equal(fin.output[0].content[0].text, r.output_text);
  },

  async functionCallRoundTrip() {
    const input = [{ role: 'user', content: question }];
    const p = { model, input, tools, tool_choice: { type: 'function', name: 'get_weather' },
      max_output_tokens: 300, temperature: 1, seed: 8 };
    const r1 = await client.responses.create(p);
    const fc = r1.output.find((o) => o.type === 'function_call');
    assert.ok(fc, JSON.stringify(r1.output));
    assert.equal(fc.name, 'get_weather');
    assert.match(fc.call_id, /^call_[A-Za-z0-9]{24}$/);
    const args = JSON.parse(fc.arguments);
    assert.ok(validWeather(args), fc.arguments);
    // streamed: the same call through function_call_arguments.delta
    const s = await streamed(p);
    assert.equal(s.args, fc.arguments);
    assert.ok(s.types.includes('response.function_call_arguments.done'));
    // the call and its output go back as input items
    const r2 = await client.responses.create({ model, tools, tool_choice: 'none',
      input: [...input, ...r1.output, { type: 'function_call_output', call_id: fc.call_id,
        output: '{"forecast": ["snow", "sun", "rain"]}' }],
      max_output_tokens: 8, temperature: 0 });
    assert.equal(r2.output[0].type, 'message');
    assert.equal(r2.output.some((o) => o.type === 'function_call'), false);
    assert.ok(r2.usage.input_tokens > r1.usage.input_tokens + 40,
      `${r2.usage.input_tokens} vs ${r1.usage.input_tokens}`);
  },

  async textFormatJsonSchema() {
    const schema = { type: 'object', properties: { kind: { enum: ['cat', 'dog'] },
      legs: { type: 'integer' }, tame: { type: 'boolean' } },
    required: ['kind', 'legs', 'tame'], additionalProperties: false };
    const validate = ajv.compile(schema);
    for (let seed = 1; seed <= 2; seed++) {
      const r = await client.responses.create({ model, input: 'Describe a pet as JSON.',
        text: { format: { type: 'json_schema', name: 'pet', schema, strict: true } },
        max_output_tokens: 1500, temperature: 1, seed });
      assert.equal(r.status, 'completed', r.output_text);
      const obj = JSON.parse(r.output_text);
      assert.ok(validate(obj), `${r.output_text}: ${ajv.errorsText(validate.errors)}`);
    }
  },

  async refusalsNamed() {
    await expect400({ store: true }, 'store');
    await expect400({ previous_response_id: 'resp_123' }, 'previous_response_id');
    await expect400({ frequency: 1 }, 'frequency');
    await expect400({ tools: [{ type: 'web_search' }] }, 'tools[0].type');
    await expect400({ input: [{ role: 'user', content: [{ type: 'input_image',
      image_url: 'https://example.com/a.png' }] }] }, 'input[0].content[0].type');
    await expect400({ max_output_tokens: 100000 }, 'max_output_tokens');
  },
};

await runChecks(checks);
