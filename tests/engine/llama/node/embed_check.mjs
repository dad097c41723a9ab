// embed_check.mjs PD_RUN MODEL...: llama.cpp's embedding (node-llama-cpp
// createEmbeddingContext / getEmbeddingFor, CPU, prebuilt) against
// pd-run --embed on the same GGUF, for a few prompts. Each MODEL carries
// its <arch>.pooling_type (pd-mkmodel --pooling), which llama.cpp applies;
// pd-run is given the same pooling explicitly. Cosine >= 0.9999 each.
// Exit 0 = agree, 1 = mismatch, 77 = llama.cpp unusable here (skip).
import { execFileSync } from "node:child_process";
import { llamaOrSkip } from "./llama_or_skip.mjs";

const [pdrun, ...models] = process.argv.slice(2);
const llama = await llamaOrSkip();
const prompts = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings are a prompt pass and nothing else: exactly what a prefill daemon does.",
    "x",
];
const POOL = { 1: "mean", 2: "cls", 3: "last" };
let failures = 0, worst = 1;
for (const modelPath of models) {
    const model = await llama.loadModel({ modelPath });
    const arch = model.fileInfo.metadata.general.architecture;
    const pool = POOL[model.fileInfo.metadata[arch]?.pooling_type];
    if (!pool) {
        console.error(`${modelPath}: no pooling_type in the GGUF`);
        process.exit(1);
    }
    const ctx = await model.createEmbeddingContext({ contextSize: 256, threads: 1 });
    for (const p of prompts) {
        // the tokens llama.cpp evaluates: getEmbeddingFor prepends BOS (and
        // appends EOS where the vocabulary wants it) through _prepareInput
        const tokens = Array.from(model.tokenize(p));
        ctx._prepareInput(tokens);
        const theirs = (await ctx.getEmbeddingFor(tokens)).vector;
        // a model that appends EOS: pd-run tokenizes the text (BOS + EOS as the
        // router's /v1/embeddings does); else the same ids
        const src = model.tokens.shouldAppendEosToken ? ["--prompt", p]
                                                      : ["--tokens", tokens.join(",")];
        const ours = execFileSync(pdrun, ["--model", modelPath, ...src,
            "--embed", pool, "--threads", "1"]).toString().trim().split(" ").map(Number);
        if (ours.length !== theirs.length) {
            failures++;
            console.error(`MISMATCH ${pool} ${JSON.stringify(p)}: length ${ours.length} vs ${theirs.length}`);
            continue;
        }
        let d = 0, na = 0, nb = 0;
        for (let i = 0; i < ours.length; i++) {
            d += ours[i] * theirs[i]; na += ours[i] * ours[i]; nb += theirs[i] * theirs[i];
        }
        const cos = d / Math.sqrt(na * nb);
        worst = Math.min(worst, cos);
        console.log(`${pool}${src[0] === "--prompt" ? " (text, EOS)" : ""} ${tokens.length} tokens: cosine ${cos.toFixed(7)}`);
        if (!(cos >= 0.9999)) {
            failures++;
            console.error(`MISMATCH ${pool} ${JSON.stringify(p)}: cosine ${cos}`);
        }
    }
    await ctx.dispose();
    await model.dispose();
}
console.log(`worst cosine ${worst.toFixed(7)}; ${failures} mismatches`);
process.exit(failures ? 1 : 0);
