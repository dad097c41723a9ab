// llref.mjs MODEL N_GEN PROMPTS_JSON [FORCED_JSON] - llama.cpp (via
// node-llama-cpp, CPU, prebuilt, offline) as the independent reference: for
// each prompt (a list of token ids) greedy-generate N_GEN tokens and print
// one JSON line
// {"prompt": i, "tokens": [...], "logits": [[vocab floats] per step]}
// (f32 KV cache, no flash attention), where logits[s] are the raw logits
// that chose tokens[s]. FORCED_JSON (one list of N_GEN token ids per
// prompt, e.g. the other engine's greedy tokens) adds "tf_logits": the
// logits after the prompt and forced[0..s-1] (teacher forcing: the same
// history as the other engine at every step, so logits stay comparable past
// a near-tie that the two engines break differently). The CPU variant
// llama.cpp loaded (libggml-cpu-*.so) goes to stderr as "llama.cpp cpu: X".
import fs from "node:fs";
import { getLlama } from "node-llama-cpp";

const [model, nGenS, promptsJson, forcedJson] = process.argv.slice(2);
const nGen = Number(nGenS);
const prompts = JSON.parse(promptsJson);
const forced = forcedJson ? JSON.parse(forcedJson) : null;
const logitArray = (lg) => { // Map token -> logit
    const arr = [];
    for (const [t, v] of lg)
        arr[t] = v;
    return arr;
};
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const m = await llama.loadModel({ modelPath: model, gpuLayers: 0, useMmap: true });
// f32 KV cache and no flash attention: the closest llama.cpp gets to exact
const ctx = await m.createContext({ contextSize: 512, batchSize: 512, sequences: prompts.length,
                                    threads: Number(process.env.LLREF_THREADS || 1), flashAttention: false,
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
    seq.dispose();
    const out = { prompt: p, tokens, logits };
    if (forced) { // one batch: the prompt, then forced[0..nGen-2], logits at each
        const tf = ctx.getSequence();
        const want = { generateNext: { logits: true } };
        const items = input.concat([[last, want]],
                                   forced[p].slice(0, nGen - 1).map((t) => [t, want]));
        const res = await tf.controlledEvaluate(items);
        out.tf_logits = res.slice(input.length).map((r) => logitArray(r.next.logits));
        tf.dispose();
    }
    console.log(JSON.stringify(out));
}
const cpu = fs.readFileSync("/proc/self/maps", "utf8").match(/libggml-cpu-([\w-]+)\.so/);
console.error(`llama.cpp cpu: ${cpu ? cpu[1] : "?"}`);
await ctx.dispose();
await m.dispose();
