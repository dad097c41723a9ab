// llref.mjs MODEL N_GEN PROMPTS_JSON - llama.cpp (via node-llama-cpp, CPU,
// prebuilt, offline) as the independent reference: for each prompt (a list
// of token ids) greedy-generate N_GEN tokens and print one JSON line
// {"prompt": i, "tokens": [...], "logits": [[vocab floats] per step]}
// (f32 KV cache, no flash attention).
// where logits[s] are the raw logits that chose tokens[s].
import { getLlama } from "node-llama-cpp";

const [model, nGenS, promptsJson] = process.argv.slice(2);
const nGen = Number(nGenS);
const prompts = JSON.parse(promptsJson);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const m = await llama.loadModel({ modelPath: model, gpuLayers: 0, useMmap: true });
// f32 KV cache and no flash attention: the closest llama.cpp gets to exact
const ctx = await m.createContext({ contextSize: 512, batchSize: 512, sequences: prompts.length,
                                    threads: 2, flashAttention: false,
                                    experimentalKvCacheKeyType: "F32",
                                    experimentalKvCacheValueType: "F32" });
for (let p = 0; p < prompts.length; p++) {
    const seq = ctx.getSequence();
    const input = prompts[p].slice(0, -1);
    const last = prompts[p][prompts[p].length - 1];
    const tokens = [];
    const logits = [];
    let cur = last;
    let items = input.concat([[cur, { generateNext: { logits: true, token: true } }]]);
    for (let s = 0; s < nGen; s++) {
        const res = await seq.controlledEvaluate(items);
        const out = res[res.length - 1].next;
        const lg = out.logits; // Map token -> logit, sorted high to low
        let best = -1, bestv = -Infinity;
        const arr = [];
        for (const [t, v] of lg) {
            arr[t] = v;
            if (v > bestv || (v === bestv && t < best)) { bestv = v; best = t; }
        }
        tokens.push(best);
        logits.push(arr);
        cur = best;
        items = [[cur, { generateNext: { logits: true, token: true } }]];
    }
    console.log(JSON.stringify({ prompt: p, tokens, logits }));
    seq.dispose();
}
await ctx.dispose();
await m.dispose();
