// llamacpp_check.mjs PD_RUN TOK_CLI MODEL: llama.cpp (via node-llama-cpp,
// CPU, prebuilt) loads pdserve's built-in model like any GGUF, and
//   - its tokenizer encodes texts exactly as engine/tok does (tok_cli);
//   - its greedy continuations equal pd-run's token ids up to a near-tie,
//     its log-probabilities on pd-run's tokens within a tolerance (below).
// Exit 0 = agree, 1 = mismatch, 77 = llama.cpp unusable here (skip).
import { execFileSync } from "node:child_process";
import { llamaOrSkip } from "./llama_or_skip.mjs";
import fs from "node:fs";

const [pdrun, tokcli, modelPath] = process.argv.slice(2);
const llama = await llamaOrSkip();
const model = await llama.loadModel({ modelPath });
let failures = 0;
const fail = (msg) => { failures++; console.error("MISMATCH: " + msg); };

const texts = [
    "This program is free software; you can redistribute it and/or modify it",
    "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND.",
    "Section 3.1(b), 2.2 and 10: you'll see the licensor's 1,234 terms; don't worry!",
    "  leading spaces,\ttabs\nand newlines\n\n  ",
    "Ünïcödé — ✓ 日本語 🚀 are not in the corpus (byte tokens)",
];
const input = texts.map((t) => Buffer.from(t).toString("hex")).join("\n") + "\n";
const lines = execFileSync(tokcli, [modelPath], { input }).toString().trimEnd().split("\n");
texts.forEach((t, i) => {
    const ours = lines[i].split("\t")[0].split(",").filter((x) => x !== "").map(Number);
    const theirs = Array.from(model.tokenize(t));
    if (JSON.stringify(ours) !== JSON.stringify(theirs))
        fail(`tokenize ${JSON.stringify(t)}: pdserve ${ours} llama.cpp ${theirs}`);
});

const prompts = [
    "This program is free software; you can",
    "The licensor grants you",
    "You may convey verbatim copies of the Program's source code",
    "If you distribute",
];
const MAX = 24;
// Greedy continuations: pd-run's ids (with its top-2 log-probabilities per
// step) against llama.cpp's. The built-in model is an n-gram model whose
// logits tie exactly where two continuations have equal counts, so either
// engine's float rounding may break a tie its own way (and llama.cpp's
// depends on the CPU variant it loads). So:
//  - teacher-forced: llama.cpp evaluates pd-run's tokens as history; at
//    every step its log-probabilities of pd-run's top-2 tokens are within
//    TOL of pd-run's (D = the largest difference seen), and pd-run's token
//    is llama.cpp's argmax or within 2 D of it;
//  - free-running: llama.cpp's own greedy ids equal pd-run's up to the
//    first near-tie (pd-run's top-2 margin < 2 D), compared no further.
const TOL = 2e-3;
const ctx = await model.createContext({ contextSize: 256, threads: 1 });
const seq = ctx.getSequence();
const logSoftmax = (lg) => { // Map token -> logit  ->  Map token -> log-probability
    let mx = -Infinity, sum = 0;
    for (const v of lg.values()) mx = Math.max(mx, v);
    for (const v of lg.values()) sum += Math.exp(v - mx);
    const lse = mx + Math.log(sum), out = new Map();
    for (const [t, v] of lg) out.set(t, v - lse);
    return out;
};
for (const p of prompts) {
    const lines = execFileSync(pdrun, ["--model", modelPath, "--prompt", p, "--max-tokens",
        String(MAX), "--tokens-out", "--logprobs-out", "2", "--threads", "1"],
        { stdio: ["ignore", "pipe", "ignore"] }).toString().trim().split("\n");
    const ours = lines[0].trim().split(/\s+/).map(Number);
    const lps = lines.slice(1).map((l) => l.split(" ").slice(3).map((x) => x.split(":").map(Number)));
    const prompt = [model.tokens.bos, ...model.tokenize(p)];
    // teacher-forced: one batch, logits after the prompt and after each of ours but the last
    await seq.clearHistory();
    const want = { generateNext: { logits: true } };
    const items = prompt.slice(0, -1).concat([[prompt[prompt.length - 1], want]],
                                              ours.slice(0, -1).map((t) => [t, want]));
    const res = (await seq.controlledEvaluate(items)).slice(prompt.length - 1);
    let dis = 0;
    const rows = res.map((r, s) => {
        const lp = logSoftmax(r.next.logits);
        for (const [t, v] of lps[s]) dis = Math.max(dis, Math.abs(v - lp.get(t)));
        return lp;
    });
    if (dis > TOL)
        fail(`${JSON.stringify(p)}: log-probabilities differ by ${dis} (tol ${TOL})`);
    let tie = ours.length;
    rows.forEach((lp, s) => {
        const best = Math.max(...lp.values());
        if (best - lp.get(ours[s]) > 2 * dis)
            fail(`${JSON.stringify(p)} step ${s}: pd-run's ${ours[s]} is ${best - lp.get(ours[s])} below llama.cpp's best`);
        if (tie === ours.length && lps[s].length > 1 && lps[s][0][1] - lps[s][1][1] < 2 * dis)
            tie = s;
    });
    // free-running
    await seq.clearHistory();
    const theirs = [];
    for await (const t of seq.evaluate(prompt, { temperature: 0 })) {
        theirs.push(t);
        if (theirs.length >= MAX || t === model.tokens.eos)
            break;
    }
    /* node-llama-cpp ends the generator at EOS without yielding it */
    if (ours.length === theirs.length + 1 && ours[ours.length - 1] === model.tokens.eos)
        theirs.push(model.tokens.eos);
    const text = model.detokenize(theirs.filter((t) => t !== model.tokens.eos));
    const n = Math.min(tie + 1, ours.length);
    console.log(`${JSON.stringify(p)} -> ${JSON.stringify(text)} (ids compared over ${n} ` +
                `steps${tie < ours.length ? `, near-tie at ${tie}` : ""}; D ${dis.toExponential(2)})`);
    if (JSON.stringify(ours.slice(0, n)) !== JSON.stringify(theirs.slice(0, n)))
        fail(`greedy ${JSON.stringify(p)}: pdserve ${ours} llama.cpp ${theirs}`);
}
const cpu = fs.readFileSync("/proc/self/maps", "utf8").match(/libggml-cpu-([\w-]+)\.so/);
console.log(`llama.cpp cpu: ${cpu ? cpu[1] : "?"}`);
console.log(failures ? `${failures} mismatches` : "llama.cpp agrees with pdserve");
process.exit(failures ? 1 : 0);
