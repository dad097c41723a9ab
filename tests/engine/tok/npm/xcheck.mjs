// xcheck.mjs - cross-check our tokenizers against independent npm reference
// tokenizers on REAL vocabularies.
//
//   node xcheck.mjs TOK_CLI WORKDIR
//
// For each reference (llama-tokenizer-js: Llama-2 SentencePiece vocab;
// llama3-tokenizer-js: Llama-3 byte-level BPE vocab + merges) it writes a
// small GGUF holding only tokenizer.* metadata (our own minimal GGUF v3
// writer below, independent of engine/gguf), runs TOK_CLI (our C tokenizer)
// on a set of texts and compares ids with the reference, then checks that
// our decode of our ids gives the input text back. Exit 0 = all equal.
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import llama2 from 'llama-tokenizer-js';
import llama3 from 'llama3-tokenizer-js';

const [tool, work] = process.argv.slice(2);
if (!tool || !work) {
  console.error('usage: node xcheck.mjs TOK_CLI WORKDIR');
  process.exit(2);
}
fs.mkdirSync(work, { recursive: true });

// ---- minimal GGUF v3 writer (metadata only, no tensors) ----
const T = { U32: 4, I32: 5, F32: 6, BOOL: 7, STR: 8, ARR: 9 };
class Out {
  constructor() { this.chunks = []; }
  u32(v) { const b = Buffer.alloc(4); b.writeUInt32LE(v); this.chunks.push(b); }
  u64(v) { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); this.chunks.push(b); }
  str(s) { const b = Buffer.from(s, 'utf8'); this.u64(b.length); this.chunks.push(b); }
  raw(b) { this.chunks.push(b); }
  buf() { return Buffer.concat(this.chunks); }
}
function writeGguf(file, kvs) {
  const o = new Out();
  o.u32(0x46554747); o.u32(3); o.u64(0); o.u64(kvs.length);
  for (const [key, type, val, elem] of kvs) {
    o.str(key); o.u32(type);
    if (type === T.STR) o.str(val);
    else if (type === T.U32) o.u32(val);
    else if (type === T.BOOL) o.raw(Buffer.from([val ? 1 : 0]));
    else if (type === T.ARR) {
      o.u32(elem); o.u64(val.length);
      if (elem === T.STR) for (const s of val) o.str(s);
      else if (elem === T.I32) { const b = Buffer.alloc(4 * val.length); val.forEach((v, i) => b.writeInt32LE(v, 4 * i)); o.raw(b); }
      else if (elem === T.F32) { const b = Buffer.alloc(4 * val.length); val.forEach((v, i) => b.writeFloatLE(v, 4 * i)); o.raw(b); }
    }
  }
  let b = o.buf();
  const pad = (32 - (b.length % 32)) % 32;
  b = Buffer.concat([b, Buffer.alloc(pad)]);
  fs.writeFileSync(file, b);
}

// ---- test texts (strings; Buffers carry invalid UTF-8) ----
const texts = [
  'Hello world', ' leading space', 'trailing space ', '  two  spaces  between  ', '', 'a', ' ',
  '12345678901234567890', '3.14159 + 2,718 = ? 1,000,000', "Hello, world! How's it going? I'M fine; you'd've",
  'naïve café résumé Ñandú façade', 'Crème brûlée über straße', '你好，世界！这是一个测试。',
  'こんにちは世界、カタカナ', '한국어 텍스트 입니다', 'emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇮',
  'line1\nline2\r\n\n\ttabbed\n', '   \n\n   ', '\n', '<html><body class="x">code()</body></html>',
  'def f(x):\n    return x**2  # comment\n', 'Ελληνικά кириллица עברית العربية हिन्दी',
  'mixed123abc456def', 'nul\u0000and \u001b[31mescape\u0007', 'ﬁ ligature ＦＵＬＬＷＩＤＴＨ ①②③',
  'tab\tand\u00a0nbsp\u2009thin', 'The quick brown fox jumps over the lazy dog. '.repeat(8),
  'URL https://example.com/a?b=c&d=e#f and email a.b@c.de', '$$$ %%% ^^^ ~~~ ```js\nx\n```',
  "don't won't can't it's we're they've I'd I'll", 'ALL CAPS SHOUTING TEXT', '\u200b\u200dzero width',
  Buffer.from([0x61, 0x80, 0x62, 0xe2, 0x82, 0x63, 0xff, 0x64]),
  Buffer.from([0xf0, 0x9f, 0x98]), Buffer.from([0xc3, 0x28, 0xed, 0xa0, 0x80]),
];
// plus seeded random strings mixing scripts, digits, punctuation, spaces
{
  const pools = ['abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ', '0123456789', ' ', '  \t\n\r',
    '.,;:!?\'"()[]{}<>-_=+*/\\|@#$%^&~`', 'àéîõüçñßøåÆŒ', 'αβγδεжзийкл', '的一是不了人我在有他这为之大来以个中上们',
    'あいうえおカキクケコ', '한국어문장', '😀🎉👍🏽❤️🚀', '\u00a0\u2009\u3000', 'أبتثجح', 'अआइईउ'];
  let seed = 12345;
  const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  for (let i = 0; i < 300; i++) {
    let s = '';
    const n = 1 + Math.floor(rnd() * 40);
    for (let j = 0; j < n; j++) {
      const p = Array.from(pools[Math.floor(rnd() * pools.length)]);
      const run = 1 + Math.floor(rnd() * 6);
      for (let k = 0; k < run; k++) s += p[Math.floor(rnd() * p.length)];
    }
    texts.push(s);
  }
}
const asBuf = (t) => (Buffer.isBuffer(t) ? t : Buffer.from(t, 'utf8'));
// What the reference sees: invalid bytes replaced per WHATWG (= our rule).
const asStr = (t) => (Buffer.isBuffer(t) ? new TextDecoder('utf-8').decode(t) : t);

function runOurs(gguf, flags, inputs) {
  const stdin = inputs.map((t) => asBuf(t).toString('hex')).join('\n') + '\n';
  const out = execFileSync(tool, [gguf, ...flags], { input: stdin, maxBuffer: 1 << 28 }).toString();
  return out.split('\n').slice(0, inputs.length).map((l) => {
    const [ids, dec] = l.split('\t');
    return { ids: ids === '' ? [] : ids.split(',').map(Number), dec: Buffer.from(dec || '', 'hex').toString('utf8') };
  });
}

let failures = 0, checks = 0;
function compare(name, inputs, ours, refIds, wantDec) {
  inputs.forEach((t, i) => {
    checks++;
    const a = ours[i].ids.join(','), b = refIds[i].join(',');
    if (a !== b) {
      failures++;
      console.log(`FAIL ${name} ids #${i} ${JSON.stringify(asStr(t)).slice(0, 60)}\n  ours ${a.slice(0, 200)}\n  ref  ${b.slice(0, 200)}`);
    }
    if (ours[i].dec !== wantDec(t)) {
      failures++;
      console.log(`FAIL ${name} decode #${i}: ${JSON.stringify(ours[i].dec).slice(0, 80)} != ${JSON.stringify(wantDec(t)).slice(0, 80)}`);
    }
  });
  console.log(`${name}: ${inputs.length} texts compared`);
}

// ---- Llama-2 (SentencePiece BPE by scores) ----
{
  const vocab = llama2.vocabById;
  // score = -(rank of the first merge producing the piece): the HF merges the
  // reference uses were sorted by SentencePiece score, so this restores the
  // score order.
  const score = new Array(vocab.length).fill(0);
  const seen = new Set();
  for (const [k, rank] of llama2.merges) {
    const id = llama2.vocabByString.get(k.replace(' ', ''));
    if (id !== undefined && !seen.has(id)) { seen.add(id); score[id] = -rank; }
  }
  const types = vocab.map((s, i) => (i === 0 ? 2 : i <= 2 ? 3 : /^<0x[0-9A-F]{2}>$/.test(s) ? 6 : 1));
  const file = path.join(work, 'llama2-vocab.gguf');
  writeGguf(file, [
    ['general.architecture', T.STR, 'llama'],
    ['tokenizer.ggml.model', T.STR, 'llama'],
    ['tokenizer.ggml.tokens', T.ARR, vocab, T.STR],
    ['tokenizer.ggml.scores', T.ARR, score, T.F32],
    ['tokenizer.ggml.token_type', T.ARR, types, T.I32],
    ['tokenizer.ggml.bos_token_id', T.U32, 1],
    ['tokenizer.ggml.eos_token_id', T.U32, 2],
    ['tokenizer.ggml.unknown_token_id', T.U32, 0],
    ['tokenizer.ggml.add_bos_token', T.BOOL, true],
    ['tokenizer.chat_template', T.STR, "{% if messages[0]['role'] == 'system' %}...<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n'...[INST]...[/INST]"],
  ]);
  const ours = runOurs(file, ['--strip'], texts);
  const ref = texts.map((t) => (asStr(t) === '' ? [] : llama2.encode(asStr(t), false, true)));
  compare('llama2-spm', texts, ours, ref, asStr);
  // BOS on request
  const withBos = runOurs(file, ['--bos', '--strip'], ['Hello world']);
  checks++;
  if (withBos[0].ids.join(',') !== llama2.encode('Hello world', true, true).join(',')) {
    failures++; console.log('FAIL llama2 bos');
  }
}

// ---- Llama-3 (byte-level BPE, llama-bpe pre-tokenizer, ignore_merges) ----
{
  const vocab = llama3.vocabById;
  const types = vocab.map((s, i) => (i >= 128000 ? 3 : 1));
  const merges = [...llama3.merges.keys()];
  const file = path.join(work, 'llama3-vocab.gguf');
  writeGguf(file, [
    ['general.architecture', T.STR, 'llama'],
    ['tokenizer.ggml.model', T.STR, 'gpt2'],
    ['tokenizer.ggml.pre', T.STR, 'llama-bpe'],
    ['tokenizer.ggml.tokens', T.ARR, vocab, T.STR],
    ['tokenizer.ggml.token_type', T.ARR, types, T.I32],
    ['tokenizer.ggml.merges', T.ARR, merges, T.STR],
    ['tokenizer.ggml.bos_token_id', T.U32, 128000],
    ['tokenizer.ggml.eos_token_id', T.U32, 128001],
    ['tokenizer.chat_template', T.STR, "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"],
  ]);
  const ours = runOurs(file, ['--special'], texts);
  const ref = texts.map((t) => llama3.encode(asStr(t), { bos: false, eos: false }));
  compare('llama3-bpe', texts, ours, ref, asStr);
  // special tokens: recognized with --special, plain text without
  const sp = ['<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>'];
  const o1 = runOurs(file, ['--special'], sp);
  checks++;
  if (o1[0].ids.join(',') !== llama3.encode(sp[0], { bos: false, eos: false }).join(',')) {
    failures++; console.log('FAIL llama3 special', o1[0].ids.join(','));
  }
  const o2 = runOurs(file, [], sp);
  checks++;
  if (o2[0].ids.some((id) => id >= 128000)) { failures++; console.log('FAIL llama3 special parsed without --special'); }
}

// ---- Qwen2 pre-tokenizer (digits one by one, no ignore_merges) ----
// No npm package ships a Qwen2 vocabulary, so the reference here is a plain
// HF-style BPE written below on top of V8's own Unicode regex engine
// (independent of PCRE2), first validated against llama3-tokenizer-js with the
// Llama-3 pattern, then run with the Qwen2 pattern on the same vocabulary.
{
  const B2U = (() => {
    const bs = [];
    for (let b = 33; b <= 126; b++) bs.push(b);
    for (let b = 161; b <= 172; b++) bs.push(b);
    for (let b = 174; b <= 255; b++) bs.push(b);
    const cs = bs.slice();
    let n = 0;
    for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
    const m = new Array(256);
    bs.forEach((b, i) => { m[b] = String.fromCodePoint(cs[i]); });
    return m;
  })();
  const vocab = llama3.vocabById, byStr = llama3.vocabByString;
  const rank = new Map();
  [...llama3.merges.keys()].forEach((k, i) => rank.set(k, i));
  const RE_L3 = /(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
  const RE_Q2 = /(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
  function bpe(text, re, ignoreMerges) {
    const out = [];
    const pieces = [];
    let prev = 0;
    for (const m of text.matchAll(re)) {
      if (m.index > prev) pieces.push(text.slice(prev, m.index));
      if (m[0].length) pieces.push(m[0]);
      prev = m.index + m[0].length;
    }
    if (prev < text.length) pieces.push(text.slice(prev));
    for (const p of pieces) {
      const mapped = Array.from(Buffer.from(p, 'utf8'), (b) => B2U[b]);
      if (ignoreMerges && byStr.has(mapped.join(''))) { out.push(byStr.get(mapped.join(''))); continue; }
      let sym = mapped;
      for (;;) {
        let best = -1, bestRank = Infinity;
        for (let i = 0; i + 1 < sym.length; i++) {
          const r = rank.get(sym[i] + ' ' + sym[i + 1]);
          if (r !== undefined && r < bestRank && byStr.has(sym[i] + sym[i + 1])) { bestRank = r; best = i; }
        }
        if (best < 0) break;
        sym = [...sym.slice(0, best), sym[best] + sym[best + 1], ...sym.slice(best + 2)];
      }
      for (const s of sym) out.push(byStr.get(s));
    }
    return out;
  }
  // the JS reference itself agrees with llama3-tokenizer-js
  texts.forEach((t, i) => {
    checks++;
    const a = bpe(asStr(t), RE_L3, true).join(','), b = llama3.encode(asStr(t), { bos: false, eos: false }).join(',');
    if (a !== b) { failures++; console.log(`FAIL js-bpe self-check #${i}`); }
  });
  const types = vocab.map((s, i) => (i >= 128000 ? 3 : 1));
  const file = path.join(work, 'qwen2pre-vocab.gguf');
  writeGguf(file, [
    ['tokenizer.ggml.model', T.STR, 'gpt2'],
    ['tokenizer.ggml.pre', T.STR, 'qwen2'],
    ['tokenizer.ggml.tokens', T.ARR, vocab, T.STR],
    ['tokenizer.ggml.token_type', T.ARR, types, T.I32],
    ['tokenizer.ggml.merges', T.ARR, [...llama3.merges.keys()], T.STR],
  ]);
  const ours = runOurs(file, [], texts);
  compare('qwen2-pre-bpe', texts, ours, texts.map((t) => bpe(asStr(t), RE_Q2, false)), asStr);
}

console.log(`${checks} checks, ${failures} failures`);
process.exit(failures ? 1 : 0);
