// The Vercel AI SDK's default OpenAI provider (`createOpenAI({baseURL})(model)`
// talks to POST /v1/responses) against a REAL deployment (pd-router +
// pd-prefill + pd-decode, started by `test-e2e node`; the built-in model,
// random weights): generateText, streamText, generateObject and a
// two-step tool loop. pdserve stores nothing: where the SDK (store: true,
// its default) would refer to an earlier answer's item by id
// (item_reference), the request gets a 400 naming the item;
// providerOptions.openai.store = false sends the items themselves.
// Exit 0 = all passed.
import { generateText, streamText, generateObject, tool, stepCountIs, jsonSchema } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import assert from 'node:assert/strict';
import { runChecks } from '../node/run_checks.mjs';

const openai = createOpenAI({ baseURL: process.env.PD_E2E_BASE_URL,
  apiKey: process.env.PD_E2E_API_KEY });
const model = openai(process.env.PD_E2E_MODEL);
const prompt = 'What is the weather in Oslo for the next 3 days?';
const noStore = { openai: { store: false } };

const weather = tool({
  description: 'Weather forecast',
  inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' },
    days: { type: 'integer' } }, required: ['city', 'days'], additionalProperties: false }),
  execute: async ({ city, days }) => ({ city, days, forecast: ['snow', 'sun', 'rain'] }),
});

const checks = {
  async generateAndStream() {
    const g = await generateText({ model, prompt, maxOutputTokens: 12, temperature: 0,
      maxRetries: 0 });
    assert.ok(g.text.length > 0);
    assert.ok(['stop', 'length'].includes(g.finishReason), g.finishReason);
    assert.ok(g.usage.outputTokens > 0 && g.usage.outputTokens <= 12);
    const s = streamText({ model, prompt, maxOutputTokens: 12, temperature: 0, maxRetries: 0 });
    let text = '';
    for await (const d of s.textStream) text += d;
    assert.equal(text, g.text);
    assert.equal((await s.usage).outputTokens, g.usage.outputTokens);
  },

  async generateObject() {
    const { object } = await generateObject({ model, maxRetries: 0, temperature: 1,
      prompt: 'Describe a pet as JSON.', maxOutputTokens: 1500,
      schema: jsonSchema({ type: 'object', properties: { kind: { enum: ['cat', 'dog'] },
        legs: { type: 'integer' } }, required: ['kind', 'legs'], additionalProperties: false }) });
    assert.ok(['cat', 'dog'].includes(object.kind), JSON.stringify(object));
    assert.ok(Number.isInteger(object.legs));
  },

  // call (forced) -> tool result -> answer (toolChoice none in step 2)
  async twoStepToolLoop() {
    const r = await generateText({ model, prompt, tools: { weather }, maxRetries: 0,
      temperature: 1, maxOutputTokens: 200, stopWhen: stepCountIs(2),
      providerOptions: noStore,
      prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0
        ? { type: 'tool', toolName: 'weather' } : 'none' }) });
    assert.equal(r.steps.length, 2);
    assert.equal(r.steps[0].toolCalls[0].toolName, 'weather');
    assert.equal(typeof r.steps[0].toolResults[0].output.city, 'string');
    assert.ok(r.steps[1].usage.inputTokens > r.steps[0].usage.inputTokens + 20);
    // the same loop with the SDK's default store (true): the call goes back
    // as a function_call item too (it has no item to refer to)
    const d = await generateText({ model, prompt, tools: { weather }, maxRetries: 0,
      temperature: 1, maxOutputTokens: 200, stopWhen: stepCountIs(2),
      prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0
        ? { type: 'tool', toolName: 'weather' } : 'none' }) });
    assert.equal(d.steps.length, 2);
    assert.equal(d.steps[0].toolCalls[0].toolName, 'weather');
    assert.equal(d.steps[1].toolCalls.length, 0);
  },

  // with store (the SDK's default) an earlier answer's text that carries its
  // item id is sent as an item_reference: refused with the item named
  // (nothing is stored); store: false sends the text itself
  async itemReferenceRefused() {
    const messages = [{ role: 'user', content: 'Hi' },
      { role: 'assistant', content: [{ type: 'text', text: 'Hello.',
        providerOptions: { openai: { itemId: 'msg_123' } } }] },
      { role: 'user', content: prompt }];
    await assert.rejects(generateText({ model, messages, maxOutputTokens: 4, maxRetries: 0 }),
      (e) => /input\[1\]\.type/.test(e.message) && /not supported/.test(e.message));
    const ok = await generateText({ model, messages, maxOutputTokens: 4, maxRetries: 0,
      providerOptions: noStore });
    assert.ok(ok.usage.inputTokens > 10);
  },
};

await runChecks(checks);
