// bench.mjs - tokenizer throughput: our C encoder (tok_cli --bench) side by
// side with the npm reference encoders (baseline) on the same texts and the
// same real vocabularies (GGUFs written by xcheck.mjs into WORKDIR).
// Rates are per CPU second (both sides single-threaded; the box is shared).
//   node bench.mjs TOK_CLI WORKDIR [SECONDS]
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import llama2 from 'llama-tokenizer-js';
import llama3 from 'llama3-tokenizer-js';

const [tool, work, secsArg] = process.argv.slice(2);
const secs = Number(secsArg || 2);
const words = fs.readFileSync(new URL(import.meta.url)).toString().split(/\s+/);
let seed = 7;
const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const texts = [];
for (let i = 0; i < 200; i++) {
  let s = '';
  for (let j = 0; j < 150; j++) s += words[Math.floor(rnd() * words.length)] + (j % 17 ? ' ' : '\n');
  texts.push(s + ' café 你好 😀 12345');
}
const input = texts.map((t) => Buffer.from(t).toString('hex')).join('\n') + '\n';
const bytesPerRound = texts.reduce((a, t) => a + Buffer.byteLength(t), 0);

function ours(gguf) {
  const out = execFileSync(tool, [gguf, '--bench', String(secs)], { input }).toString();
  const m = /bytes=(\d+) tokens=(\d+) seconds=([\d.]+)/.exec(out);
  return { mbs: Number(m[1]) / Number(m[3]) / 1e6, tps: Number(m[2]) / Number(m[3]) };
}
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
function ref(encode) {
  let bytes = 0, tokens = 0;
  const t0 = cpu();
  let t;
  do {
    for (const s of texts) tokens += encode(s).length;
    bytes += bytesPerRound;
    t = cpu() - t0;
  } while (t < secs);
  return { mbs: bytes / t / 1e6, tps: tokens / t };
}
const rows = [
  ['llama2-spm', path.join(work, 'llama2-vocab.gguf'), (s) => llama2.encode(s, false, true)],
  ['llama3-bpe', path.join(work, 'llama3-vocab.gguf'), (s) => llama3.encode(s, { bos: false, eos: false })],
];
console.log('vocab        ours MB/s  ours Mtok/s   npm MB/s  npm Mtok/s   ratio');
for (const [name, gguf, enc] of rows) {
  if (!fs.existsSync(gguf)) { console.log(`${name}: ${gguf} missing (run the xcheck test first)`); continue; }
  const a = ours(gguf), b = ref(enc);
  console.log(`${name.padEnd(12)} ${a.mbs.toFixed(2).padStart(9)} ${(a.tps / 1e6).toFixed(3).padStart(11)}` +
    ` ${b.mbs.toFixed(2).padStart(10)} ${(b.tps / 1e6).toFixed(3).padStart(11)} ${(a.mbs / b.mbs).toFixed(2).padStart(7)}x`);
}
