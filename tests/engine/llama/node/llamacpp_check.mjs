// llamacpp_check.mjs PD_RUN TOK_CLI MODEL: llama.cpp (via node-llama-cpp,
// CPU, prebuilt) loads pdserve's built-in model like any GGUF, and
//   - its tokenizer encodes texts exactly as engine/tok does (tok_cli);
//   - its greedy continuations equal pd-run's token ids.
// Exit 0 = agree, 1 = mismatch, 77 = llama.cpp unusable here (skip).
import { execFileSync } from "node:child_process";

const [pdrun, tokcli, modelPath] = process.argv.slice(2);
let getLlama;
try {
    ({ getLlama } = await import("node-llama-cpp"));
} catch (e) {
    console.log(`node-llama-cpp unavailable (${e.message}): skip`);
    process.exit(77);
}
let llama;
try {
    llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
} catch (e) {
    console.log(`no prebuilt llama.cpp for this machine (${e.message}): skip`);
    process.exit(77);
}
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
const ctx = await model.createContext({ contextSize: 256 });
const seq = ctx.getSequence();
for (const p of prompts) {
    const ours = execFileSync(pdrun, ["--model", modelPath, "--prompt", p, "--max-tokens",
        String(MAX), "--tokens-out", "--threads", "1"], { stdio: ["ignore", "pipe", "ignore"] })
        .toString().trim().split(/\s+/).map(Number);
    await seq.clearHistory();
    const theirs = [];
    for await (const t of seq.evaluate([model.tokens.bos, ...model.tokenize(p)],
                                       { temperature: 0 })) {
        theirs.push(t);
        if (theirs.length >= MAX || t === model.tokens.eos)
            break;
    }
    /* node-llama-cpp ends the generator at EOS without yielding it */
    if (ours.length === theirs.length + 1 && ours[ours.length - 1] === model.tokens.eos)
        theirs.push(model.tokens.eos);
    const text = model.detokenize(theirs.filter((t) => t !== model.tokens.eos));
    console.log(`${JSON.stringify(p)} -> ${JSON.stringify(text)}`);
    if (JSON.stringify(ours) !== JSON.stringify(theirs))
        fail(`greedy ${JSON.stringify(p)}: pdserve ${ours} llama.cpp ${theirs}`);
}
console.log(failures ? `${failures} mismatches` : "llama.cpp agrees with pdserve");
process.exit(failures ? 1 : 0);
