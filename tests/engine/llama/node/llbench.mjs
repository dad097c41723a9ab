// llbench.mjs MODEL THREADS [PREFILL] [STEPS] - llama.cpp (node-llama-cpp's
// prebuilt CPU build, offline: getLlama({gpu: false, build: "never"})) timed
// the way build/engine/pd-eng-bench times pdserve: prefill of PREFILL tokens
// (best of 3, history cleared each time) and batch-1 decode at position
// PREFILL (the fastest of STEPS single-token steps). Prints one JSON line
// {"prefill_tps": x, "decode_tps": y, "threads": t}. Used by
// tests/bench/qkernels-vs-llamacpp.sh; never by a test.
import { getLlama } from "node-llama-cpp";

const [model, threadsS, prefillS, stepsS] = process.argv.slice(2);
const threads = Number(threadsS), nPre = Number(prefillS ?? 64), nSteps = Number(stepsS ?? 8);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const m = await llama.loadModel({ modelPath: model, gpuLayers: 0, useMmap: true });
// the context holds the prompt and the decode steps (512 at least, as before)
const ctx = await m.createContext({ contextSize: Math.max(512, nPre + nSteps + 8),
                                    batchSize: 512, sequences: 1, threads, flashAttention: false });
const prompt = Array.from({ length: nPre }, (_, i) => 300 + ((i * 7919) % 20000));
let bestPre = Infinity, bestDec = Infinity;
const seq = ctx.getSequence();
for (let rep = 0; rep < 3; rep++) {
    await seq.clearHistory();
    const items = prompt.slice(0, -1).concat([[prompt[nPre - 1],
        { generateNext: { token: true } }]]);
    let t0 = process.hrtime.bigint();
    let res = await seq.controlledEvaluate(items);
    bestPre = Math.min(bestPre, Number(process.hrtime.bigint() - t0) / 1e9);
    if (rep === 0) {
        let tok = res[res.length - 1].next.token;
        for (let s = 0; s < nSteps; s++) {
            t0 = process.hrtime.bigint();
            res = await seq.controlledEvaluate([[tok, { generateNext: { token: true } }]]);
            bestDec = Math.min(bestDec, Number(process.hrtime.bigint() - t0) / 1e9);
            tok = res[0].next.token;
        }
    }
}
seq.dispose();
console.log(JSON.stringify({ prefill_tps: nPre / bestPre, decode_tps: 1 / bestDec, threads }));
await ctx.dispose();
await m.dispose();
