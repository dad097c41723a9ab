// A LangGraph agent loop through a REAL deployment (pd-router + pd-prefill +
// pd-decode on the built-in model, random weights): LangChain's ChatOpenAI
// with bound tools, LangGraph's ToolNode running them, three model steps
// (call, call, answer). The second and third requests carry the
// assistant's tool_calls and the ToolNode's {"role": "tool", "name": ...}
// results, which the server must accept (issue 29). Random weights do not
// choose to call, so steps 1-2 force a call (tool_choice "required") and
// step 3 answers (tool_choice "none"). Every call's arguments validate
// against the tool's zod schema (LangChain parses them). Exit 0 = passed.
import { ChatOpenAI } from '@langchain/openai';
import { tool } from '@langchain/core/tools';
import { HumanMessage, ToolMessage } from '@langchain/core/messages';
import { StateGraph, MessagesAnnotation, START, END } from '@langchain/langgraph';
import { ToolNode } from '@langchain/langgraph/prebuilt';
import { z } from 'zod';
import assert from 'node:assert/strict';
import { runChecks } from '../node/run_checks.mjs';

const bodies = []; // every request body the client sent
const llm = new ChatOpenAI({ model: process.env.PD_E2E_MODEL, apiKey: process.env.PD_E2E_API_KEY,
  temperature: 1, maxTokens: 200, maxRetries: 0, timeout: 60000,
  configuration: { baseURL: process.env.PD_E2E_BASE_URL,
    fetch: async (url, init) => { bodies.push(JSON.parse(init.body)); return fetch(url, init); } } });

const ran = [];
const getWeather = tool(async ({ city, days }) => {
  ran.push(['get_weather', city, days]);
  return JSON.stringify({ city, forecast: Array(days).fill('snow') });
}, { name: 'get_weather', description: 'Weather forecast for a city',
  schema: z.object({ city: z.string().min(1).max(20), days: z.number().int().min(1).max(5) }) });
const add = tool(async ({ a, b }) => { ran.push(['add', a, b]); return String(a + b); },
  { name: 'add', description: 'Add two integers',
    schema: z.object({ a: z.number().int(), b: z.number().int() }) });
const tools = [getWeather, add];

const checks = {
  async reactAgentThreeSteps() {
    let step = 0;
    const agent = async (state) => {
      step++;
      const m = llm.bindTools(tools, { tool_choice: step < 3 ? 'required' : 'none', seed: step });
      return { messages: [await m.invoke(state.messages)] };
    };
    const route = (state) => (state.messages.at(-1).tool_calls?.length ? 'tools' : END);
    const graph = new StateGraph(MessagesAnnotation)
      .addNode('agent', agent).addNode('tools', new ToolNode(tools))
      .addEdge(START, 'agent').addConditionalEdges('agent', route, ['tools', END])
      .addEdge('tools', 'agent').compile();
    const out = await graph.invoke({ messages: [new HumanMessage({ content: 'Weather in Oslo?',
      name: 'alice' })] }, { recursionLimit: 10 });
    assert.equal(step, 3);
    assert.equal(ran.length, 2, JSON.stringify(ran));
    const results = out.messages.filter((m) => m instanceof ToolMessage);
    assert.equal(results.length, 2);
    assert.equal(typeof out.messages.at(-1).content, 'string');
    // what went over the wire: names on the user and tool messages
    assert.equal(bodies.length, 3);
    const last = bodies[2].messages;
    assert.ok(last.some((m) => m.role === 'user' && m.name === 'alice'), JSON.stringify(last));
    const toolMsgs = last.filter((m) => m.role === 'tool');
    assert.equal(toolMsgs.length, 2);
    for (const m of toolMsgs) assert.ok(['get_weather', 'add'].includes(m.name), JSON.stringify(m));
    assert.equal(last.filter((m) => m.role === 'assistant' && m.tool_calls?.length).length, 2);
  },
};

await runChecks(checks);
