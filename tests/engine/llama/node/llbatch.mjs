// llbatch.mjs MODEL THREADS CTX BATCHES STEPS [K:V ...] - llama.cpp's
// batched decode at a context length, timed the way build/engine/pd-eng-bench
// --ctx CTX --batches B times pdserve: B sequences, each holding CTX tokens
// of its own KV (one prompt pass of CTX tokens, copied to the other
// sequences: node-llama-cpp keeps one KV stream per sequence, so the copy is
// real data), then STEPS decode steps of one token per sequence, all B in one
// llama_decode; the fastest step counts. Per cache type pair K:V (F16, BF16,
// Q8_0, Q4_0; flash attention on, as llama.cpp needs for a quantized V)
// prints one JSON line {"k", "v", "ctx", "batch", "decode_tps"}.
// Used by tests/bench/kv-speed.sh; never by a test.
import { getLlama } from "node-llama-cpp";

const [model, threadsS, ctxS, batchesS, stepsS, ...typeArgs] = process.argv.slice(2);
const threads = Number(threadsS), ctxN = Number(ctxS), nSteps = Number(stepsS ?? 4);
const batches = batchesS.split(",").map(Number);
const maxB = Math.max(...batches);
const types = (typeArgs.length ? typeArgs : ["F16:F16"]).map((s) => s.split(":"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const m = await llama.loadModel({ modelPath: model, gpuLayers: 0, useMmap: true });
const prompt = Array.from({ length: ctxN }, (_, i) => 300 + ((i * 7919) % 20000));
for (const [k, v] of types) {
    const ctx = await m.createContext({ contextSize: ctxN + (nSteps + 1) * batches.length + 16,
        batchSize: 512, sequences: maxB, threads, flashAttention: true,
        experimentalKvCacheKeyType: k, experimentalKvCacheValueType: v });
    const seqs = Array.from({ length: maxB }, () => ctx.getSequence());
    await seqs[0].controlledEvaluate(prompt);
    for (let i = 1; i < maxB; i++)
        if (!await seqs[i]._copyStateFromOtherSequence(seqs[0], ctxN))
            throw new Error(`copying the ${ctxN}-token state to sequence ${i} failed`);
    for (const B of batches) {
        let best = Infinity;
        const one = () => Promise.all(seqs.slice(0, B).map((s, j) =>
            s.controlledEvaluate([[300 + j, { generateNext: { token: true } }]])));
        await one(); // warm
        for (let s = 0; s < nSteps; s++) {
            const t0 = process.hrtime.bigint();
            await one();
            best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
        }
        console.log(JSON.stringify({ k: k.toLowerCase(), v: v.toLowerCase(), ctx: ctxN, batch: B,
                                     decode_tps: B / best }));
    }
    for (const s of seqs)
        s.dispose();
    await ctx.dispose();
}
await m.dispose();
