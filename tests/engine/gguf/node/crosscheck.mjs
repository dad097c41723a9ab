// crosscheck.mjs FILE.gguf DUMP.json
//   Parse FILE with @huggingface/gguf and compare with pd-gguf-dump's JSON:
//   header counts, every metadata key (value and type), every tensor info,
//   the data offset and the parameter count.
// crosscheck.mjs --types TYPES.json
//   Compare pdserve's ggml type table with the package's GGML_QUANT_SIZES.
import { readFileSync, readdirSync } from "node:fs";
import { gguf, GGMLQuantizationType } from "@huggingface/gguf";

const TYPE_IDS = {
  uint8: 0, int8: 1, uint16: 2, int16: 3, uint32: 4, int32: 5, float32: 6,
  bool: 7, string: 8, array: 9, uint64: 10, int64: 11, float64: 12,
};
let failures = 0;
function fail(msg) {
  failures++;
  if (failures <= 20) console.error("MISMATCH " + msg);
}
function norm(v) {
  // ours: numbers, or decimal strings beyond 2^53; theirs: bigint for 64-bit
  if (typeof v === "bigint") return v >= -(2n ** 53n) && v <= 2n ** 53n ? Number(v) : v.toString();
  return v;
}
// f32: ours is printed with %.9g (identifies the float32 exactly), so
// compare after rounding both to float32.
function eq(a, b, f32 = false) {
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!eq(a[i], b[i], f32)) return false;
    return true;
  }
  if (f32 && typeof a === "number" && typeof b === "number") return Object.is(Math.fround(a), Math.fround(b));
  return norm(a) === norm(b);
}

if (process.argv[2] === "--types") {
  // bits per weight in the package; only compare ids both sides know
  // GGML_QUANT_SIZES is internal: load it from the bundle chunk that exports it
  let GGML_QUANT_SIZES;
  const dist = new URL("./node_modules/@huggingface/gguf/dist/", import.meta.url);
  for (const f of readdirSync(dist)) {
    if (!f.endsWith(".mjs") || !readFileSync(new URL(f, dist), "utf8").includes("GGML_QUANT_SIZES,")) continue;
    const mod = await import(new URL(f, dist).href).catch(() => ({}));
    if (mod.GGML_QUANT_SIZES) { GGML_QUANT_SIZES = mod.GGML_QUANT_SIZES; break; }
  }
  const ours = JSON.parse(readFileSync(process.argv[3], "utf8"));
  const known = Object.keys(GGMLQuantizationType).filter((k) => /^\d+$/.test(k));
  // Q8_1 (9): ggml's block is {fp16 d, fp16 s, int8 qs[32]} = 36 bytes; the
  // package still counts two f32 (40). Documented, not a pdserve bug.
  const exceptions = new Set(["9"]);
  for (const id of known) {
    if (!(id in ours)) fail(`type ${id} (${GGMLQuantizationType[id]}) unknown to pdserve`);
  }
  for (const [id, t] of Object.entries(ours)) {
    if (!known.includes(id)) fail(`type ${id} (${t.name}) unknown to the package`);
    else if (t.name.toUpperCase() !== GGMLQuantizationType[id].toUpperCase())
      fail(`type ${id}: name ${t.name} vs ${GGMLQuantizationType[id]}`);
    if (GGML_QUANT_SIZES && !exceptions.has(id)) {
      const bpw = (t.type_size * 8) / t.block_size;
      if (GGML_QUANT_SIZES[id] !== bpw) fail(`type ${id} (${t.name}): ${bpw} bpw vs ${GGML_QUANT_SIZES[id]}`);
    }
  }
  console.log(`types: ${Object.keys(ours).length} compared${GGML_QUANT_SIZES ? " (with sizes)" : " (names only)"}, ${failures} mismatches`);
  process.exit(failures ? 1 : 0);
}

const [file, dumpPath] = process.argv.slice(2);
const ours = JSON.parse(readFileSync(dumpPath, "utf8"));
const r = await gguf(file, { allowLocalFile: true, typedMetadata: true, computeParametersCount: true });
const tm = r.typedMetadata;

if (Number(r.metadata.version) !== ours.version) fail(`version ${r.metadata.version} vs ${ours.version}`);
const ourKeys = Object.keys(ours.metadata);
if (Number(r.metadata.kv_count) !== ourKeys.length) fail(`kv_count ${r.metadata.kv_count} vs ${ourKeys.length}`);
if (Number(r.metadata.tensor_count) !== ours.tensors.length) fail(`tensor_count ${r.metadata.tensor_count} vs ${ours.tensors.length}`);
for (const key of ourKeys) {
  const theirs = tm[key];
  if (theirs === undefined) { fail(`key ${key} missing in @huggingface/gguf`); continue; }
  const ot = ours.metadata_types[key];
  const m = /^array\[(\w+)\]$/.exec(ot);
  if (m) {
    if (theirs.type !== TYPE_IDS.array || theirs.subType !== TYPE_IDS[m[1]]) fail(`key ${key}: type ${ot} vs ${theirs.type}/${theirs.subType}`);
  } else if (theirs.type !== TYPE_IDS[ot]) {
    fail(`key ${key}: type ${ot} vs ${theirs.type}`);
  }
  if (!eq(theirs.value, ours.metadata[key], ot === "float32" || ot === "array[float32]")) fail(`key ${key}: value ${JSON.stringify(ours.metadata[key]).slice(0, 80)} vs ${String(theirs.value).slice(0, 80)}`);
}
if (Number(r.tensorDataOffset) !== ours.data_offset) fail(`data offset ${r.tensorDataOffset} vs ${ours.data_offset}`);
r.tensorInfos.forEach((t, i) => {
  const o = ours.tensors[i];
  if (!o) { fail(`tensor ${i} ${t.name} missing in our dump`); return; }
  if (t.name !== o.name) fail(`tensor ${i}: name ${t.name} vs ${o.name}`);
  if (t.n_dims !== o.dims.length) fail(`tensor ${t.name}: n_dims ${t.n_dims} vs ${o.dims.length}`);
  if (!eq(t.shape, o.dims)) fail(`tensor ${t.name}: shape ${t.shape} vs ${o.dims}`);
  if (t.dtype !== o.type) fail(`tensor ${t.name}: dtype ${t.dtype} vs ${o.type}`);
  if (Number(t.offset) !== o.offset) fail(`tensor ${t.name}: offset ${t.offset} vs ${o.offset}`);
});
if (r.parameterCount !== ours.n_params) fail(`parameter count ${r.parameterCount} vs ${ours.n_params}`);
console.log(`${file}: ${ourKeys.length} kvs, ${ours.tensors.length} tensors compared, ${failures} mismatches`);
process.exit(failures ? 1 : 0);
