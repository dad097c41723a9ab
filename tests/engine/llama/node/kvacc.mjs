// kvacc.mjs MODEL IDS_JSON N_SCORE OUTDIR [K:V ...] - llama.cpp's side of
// tests/bench/kv-acc.sh (the KV-dtype accuracy comparison of issue 32).
//
// For each cache type pair K:V (llama.cpp names: F16, BF16, Q8_0, Q4_0; the
// default is F16:F16 Q8_0:Q8_0 Q4_0:Q4_0 BF16:BF16) it evaluates the token
// ids in IDS_JSON (a JSON list) teacher-forced through node-llama-cpp (the
// prebuilt CPU build, offline, flash attention on: llama.cpp needs it for a
// quantized V cache, so every type, F16 too, runs with it) and writes the
// raw logits of the last N_SCORE positions that have a next token (N x vocab
// f32, as pd-run --score --logits-out) to OUTDIR/llama-K-V.bin.
//
// Then it compares every OUTDIR/<engine>-<K>-<V>.bin with that engine's
// f16-f16 file (pd-run writes pd-*.bin), and pdserve's f16 with llama.cpp's,
// and prints one JSON line per pair:
// {"engine", "k", "v", "nll" (mean -ln p of the scored tokens), "kl" (mean
// KL(f16 || this) in nats), "max_dlogit", "rms_dlogit", "top1" (argmax agreement)}.
// Never run by a test.
import fs from "node:fs";
import path from "node:path";
import { getLlama } from "node-llama-cpp";

const [model, idsPath, nScoreS, outDir, ...typeArgs] = process.argv.slice(2);
const ids = JSON.parse(fs.readFileSync(idsPath, "utf8"));
const nScore = Number(nScoreS);
const L = ids.length, nPre = L - nScore;
if (!(nScore > 0 && nScore < L))
    throw new Error(`need 0 < N_SCORE < ${L}`);
const types = (typeArgs.length ? typeArgs : ["F16:F16", "Q8_0:Q8_0", "Q4_0:Q4_0", "BF16:BF16"])
    .map((s) => s.split(":"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const m = await llama.loadModel({ modelPath: model, gpuLayers: 0, useMmap: true });
for (const [k, v] of types) {
    const t0 = Date.now();
    const ctx = await m.createContext({
        contextSize: L + 16, batchSize: 512, sequences: 1,
        threads: Number(process.env.KVACC_THREADS || 2), flashAttention: true,
        experimentalKvCacheKeyType: k, experimentalKvCacheValueType: v,
    });
    const seq = ctx.getSequence();
    // items 0 .. L-2; the ones at nPre-1 .. L-2 return logits predicting ids[i + 1]
    const items = ids.slice(0, L - 1).map((id, i) =>
        i >= nPre - 1 ? [id, { generateNext: { logits: true } }] : id);
    const res = await seq.controlledEvaluate(items);
    let vocab = 0;
    const rows = [];
    for (let i = nPre - 1; i < L - 1; i++) {
        const lg = res[i].next.logits;
        const arr = new Float32Array(lg.size);
        for (const [t, x] of lg)
            arr[t] = x;
        vocab = Math.max(vocab, lg.size);
        rows.push(arr);
    }
    const out = new Float32Array(nScore * vocab);
    rows.forEach((r, i) => out.set(r.subarray(0, vocab), i * vocab));
    fs.writeFileSync(path.join(outDir, `llama-${k.toLowerCase()}-${v.toLowerCase()}.bin`),
                     Buffer.from(out.buffer));
    seq.dispose();
    await ctx.dispose();
    process.stderr.write(`llama.cpp k=${k} v=${v}: ${L} tokens in ${(Date.now() - t0) / 1000} s\n`);
}
await m.dispose();

// compare
const files = fs.readdirSync(outDir).filter((f) => /^[a-z]+-[a-z0-9_]+-[a-z0-9_]+\.bin$/.test(f)).sort();
const load = (f) => new Float32Array(fs.readFileSync(path.join(outDir, f)).buffer.slice(0));
// each file against its engine's f16 run, then pdserve's f16 against llama.cpp's
const pairs = files.map((f) => [f, `${f.split("-")[0]}-f16-f16.bin`]);
if (files.includes("pd-f16-f16.bin") && files.includes("llama-f16-f16.bin"))
    pairs.push(["pd-f16-f16.bin", "llama-f16-f16.bin"]);
for (const [f, refF] of pairs) {
    const [eng, k, v] = f.replace(/\.bin$/, "").split("-");
    if (!fs.existsSync(path.join(outDir, refF)))
        continue;
    const a = load(refF), b = load(f);
    const vocab = a.length / nScore;
    if (b.length !== a.length)
        throw new Error(`${f}: ${b.length} floats, ${refF} has ${a.length}`);
    let nll = 0, kl = 0, maxd = 0, sq = 0, top1 = 0;
    for (let i = 0; i < nScore; i++) {
        const ra = a.subarray(i * vocab, (i + 1) * vocab), rb = b.subarray(i * vocab, (i + 1) * vocab);
        let ma = -Infinity, mb = -Infinity, ia = 0, ib = 0;
        for (let j = 0; j < vocab; j++) {
            if (ra[j] > ma) { ma = ra[j]; ia = j; }
            if (rb[j] > mb) { mb = rb[j]; ib = j; }
            const d = Math.abs(ra[j] - rb[j]);
            if (d > maxd) maxd = d;
            sq += d * d;
        }
        let sa = 0, sb = 0;
        for (let j = 0; j < vocab; j++) { sa += Math.exp(ra[j] - ma); sb += Math.exp(rb[j] - mb); }
        const la = Math.log(sa) + ma, lb = Math.log(sb) + mb; // log-sum-exp
        for (let j = 0; j < vocab; j++) {
            const pa = Math.exp(ra[j] - la);
            kl += pa * ((ra[j] - la) - (rb[j] - lb));
        }
        nll -= rb[ids[nPre + i]] - lb;
        if (ia === ib) top1++;
    }
    console.log(JSON.stringify({ engine: eng === "pd" ? "pdserve" : "llama.cpp", k, v,
        vs: refF.startsWith("llama") ? "llama.cpp f16" : refF.startsWith("pd") ? "pdserve f16" : refF,
        nll: nll / nScore, kl: kl / nScore, max_dlogit: maxd,
        rms_dlogit: Math.sqrt(sq / (nScore * vocab)), top1: top1 / nScore }));
}
