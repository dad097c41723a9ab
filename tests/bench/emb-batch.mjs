// emb-batch.mjs URL_OFF URL_ON N WORDS REPS - one /v1/embeddings request of N
// inputs of WORDS words, alternating the two deployments; best of REPS each.
const [off, on, N, W, reps] = [process.argv[2], process.argv[3], ...process.argv.slice(4).map(Number)];
const words = 'the quick brown fox jumps over a lazy dog while seven wizards quietly hex'.split(' ');
const input = Array.from({ length: N }, (_, i) =>
  Array.from({ length: W }, (_, w) => words[(i * 3 + w) % words.length]).join(' '));
const best = { off: Infinity, on: Infinity };
let tokens = 0;
for (let r = 0; r < reps; r++)
  for (const [k, u] of [['off', off], ['on', on]]) {
    const t0 = performance.now();
    const res = await fetch(u + '/v1/embeddings', { method: 'POST',
      headers: { 'content-type': 'application/json' }, body: JSON.stringify({ input }) });
    const j = await res.json();
    if (!j.data || j.data.length !== N) throw new Error(JSON.stringify(j).slice(0, 300));
    best[k] = Math.min(best[k], performance.now() - t0);
    tokens = j.usage.prompt_tokens;
  }
const rate = (ms) => (N * 1000 / ms).toFixed(1);
console.log(`${N} inputs x ${W} words (${tokens} tokens): off ${best.off.toFixed(0)} ms ` +
  `(${rate(best.off)} inputs/s), on ${best.on.toFixed(0)} ms (${rate(best.on)} inputs/s), ` +
  `${(best.off / best.on).toFixed(2)}x`);
