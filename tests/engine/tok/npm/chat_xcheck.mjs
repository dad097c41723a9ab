// chat_xcheck.mjs CHAT_CLI TEMPLATES_DIR: every conversation below rendered
// by eng_chat (chat_cli) and by the model's own Jinja template
// (@huggingface/jinja) must be the same text, byte for byte. Tool-call
// arguments are given as objects, as vLLM and llama.cpp hand them to the
// templates (the OpenAI API carries them as JSON strings).
import { Template } from '@huggingface/jinja';
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';

const [cli, dir] = process.argv.slice(2);
const templates = [
  { name: 'qwen2.5', file: 'Qwen-Qwen2.5-7B-Instruct.jinja', multiCalls: true,
    bos: '', eos: '<|im_end|>' },
  { name: 'llama3.1', file: 'meta-llama-Llama-3.1-8B-Instruct.jinja', multiCalls: false,
    bos: '<|begin_of_text|>', eos: '<|eot_id|>' },
];

const weather = { type: 'function', function: { name: 'get_weather',
  description: 'Current weather for a city, "quoted" and ünïcödé',
  parameters: { type: 'object', properties: { city: { type: 'string', description: 'City' },
    unit: { type: 'string', enum: ['c', 'f'] }, days: { type: 'integer' },
    tags: { type: 'array', items: { type: 'string' } }, opts: { type: 'object', properties: {} } },
  required: ['city', 'unit'], additionalProperties: false } } };
const add = { type: 'function', function: { name: 'add', description: 'Add two numbers',
  parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } },
    required: ['a', 'b'] } } };
const call = (name, args) => ({ id: 'c1', type: 'function', function: { name, arguments: args } });

const cases = [
  { what: 'system + user, two tools',
    messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Weather in Oslo?' }],
    tools: [weather, add] },
  { what: 'no system, one tool',
    messages: [{ role: 'user', content: '  What is 2+3? \n' }], tools: [add] },
  { what: 'a call, its result, a follow-up',
    messages: [{ role: 'system', content: 'sys' }, { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: '', tool_calls: [call('get_weather', { city: 'Oslo', unit: 'c', tags: ['a', 'b'], opts: {} })] },
      { role: 'tool', tool_call_id: 'c1', content: '{"temp": 3, "sky": "snow \\"heavy\\""}\nline 2' },
      { role: 'user', content: 'And tomorrow?' }],
    tools: [weather, add] },
  { what: 'two calls in one turn, two results',
    multi: true,
    messages: [{ role: 'user', content: 'Add 1+2 and 3+4' },
      { role: 'assistant', content: 'Sure.', tool_calls: [call('add', { a: 1, b: 2 }), call('add', { a: 3.5, b: -4 })] },
      { role: 'tool', content: '3' }, { role: 'tool', content: '-0.5' }],
    tools: [add] },
  { what: 'no tools (plain chat)',
    messages: [{ role: 'system', content: 'S' }, { role: 'user', content: 'hi' },
      { role: 'assistant', content: 'hello' }, { role: 'user', content: 'bye' }],
    tools: [] },
];

let bad = 0, n = 0;
for (const t of templates) {
  const tpl = new Template(readFileSync(`${dir}/${t.file}`, 'utf8'));
  for (const c of cases) {
    if (c.multi && !t.multiCalls) continue;
    const ctx = { messages: c.messages, add_generation_prompt: true, bos_token: t.bos,
      eos_token: t.eos };
    if (c.tools.length) ctx.tools = c.tools;
    const want = tpl.render(ctx);
    const r = spawnSync(cli, { input: JSON.stringify({ template: t.name, messages: c.messages,
      tools: c.tools, add_generation_prompt: true }), encoding: 'utf8' });
    n++;
    if (r.status !== 0 || r.stdout !== want) {
      bad++;
      let i = 0;
      while (i < want.length && r.stdout[i] === want[i]) i++;
      console.log(`MISMATCH ${t.name} / ${c.what} (exit ${r.status} ${r.stderr.trim()}) at byte ${i}:\n` +
        `  ours:   ${JSON.stringify(r.stdout.slice(Math.max(0, i - 60), i + 80))}\n` +
        `  jinja:  ${JSON.stringify(want.slice(Math.max(0, i - 60), i + 80))}`);
    }
  }
}
console.log(`${n - bad}/${n} renderings equal to the models' own templates`);
process.exit(bad ? 1 : 0);
