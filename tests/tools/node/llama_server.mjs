// llama_server.mjs - test-only: llama.cpp (node-llama-cpp's prebuilt CPU
// binary, never compiled here) behind a small OpenAI-style server on
// 127.0.0.1, so pd-bench --compare can put pdserve and llama.cpp side by
// side on the same model, the same cores and the same token ids.
//
//   node llama_server.mjs MODEL.gguf [--port 0] [--threads 2] [--parallel 4]
//        [--ctx 4096] [--no-cache] [--keep-alive-ms 5000] [--max-seconds 3600]
//
// Prints its URL on stdout once the model is loaded; stops on SIGTERM/SIGINT
// or after --max-seconds. Serves GET /v1/models, GET /health and POST
// /v1/chat/completions, /v1/completions (streaming with
// stream_options.include_usage, or not; max_tokens / max_completion_tokens,
// temperature, ignore_eos). Like llama-server: --parallel sequences batched
// together; each request takes the free sequence whose cached tokens share
// the longest prefix with its prompt (if at least half of that cache, else
// the least recently used sequence) and reuses that prefix (reported as
// usage.prompt_tokens_details.cached_tokens; --no-cache: never); idle
// kept-alive connections are closed after --keep-alive-ms (Node's 5 s).
//
// Tokens: pdserve's built-in models use a byte tokenizer ("pdbyte": ids
// 0-255 = bytes, 256 <s>, 257 <|im_start|>, 258 <|im_end|> = EOS) that
// llama.cpp does not know by name. The script loads a temporary copy of the
// GGUF whose tokenizer.ggml.model says "llama" (nothing else changes) and
// tokenizes itself exactly as pdbyte + the model's ChatML template do (BOS
// before a completions prompt string, none in ChatML), so
// both servers evaluate the same token ids with the same weights. Prompts
// as token-id arrays (completions) are taken as they are.
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import {getLlama} from "node-llama-cpp";

const BOS = 256, IM_START = 257, IM_END = 258, VOCAB = 260;
const BODY_MAX = 8 << 20, MAX_TOKENS_CAP = 4096;

function arg(name, def) {
    const i = process.argv.indexOf(name);
    return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}
const modelPath = process.argv[2];
if (!modelPath || modelPath.startsWith("--")) {
    console.error("usage: node llama_server.mjs MODEL.gguf [--port P] [--threads N] " +
                  "[--parallel N] [--ctx N] [--no-cache] [--max-seconds S]");
    process.exit(2);
}
const port = Number(arg("--port", "0"));
const threads = Number(arg("--threads", "2"));
const parallel = Number(arg("--parallel", "4"));
const ctxSize = Number(arg("--ctx", "4096"));
const useCache = !process.argv.includes("--no-cache");
const maxSeconds = Number(arg("--max-seconds", "3600"));
const keepAliveMs = Number(arg("--keep-alive-ms", "5000"));

// ---- a copy of the GGUF with tokenizer.ggml.model = "llama" -------------
function ggufWithTokenizerName(src, name) {
    const b = fs.readFileSync(src);
    const size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8};
    let o = 0, align = 32, valStart = -1, valEnd = -1;
    const u32 = () => { const v = b.readUInt32LE(o); o += 4; return v; };
    const u64 = () => { const v = Number(b.readBigUInt64LE(o)); o += 8; return v; };
    const str = () => { const n = u64(); const s = b.toString("utf8", o, o + n); o += n; return s; };
    const skip = (t) => {
        if (t === 8) { str(); return; }
        if (t === 9) { const at = u32(), n = u64(); for (let i = 0; i < n; i++) skip(at); return; }
        if (!(t in size)) throw new Error(`GGUF: unknown value type ${t}`);
        o += size[t];
    };
    if (b.toString("latin1", 0, 4) !== "GGUF") throw new Error(`${src}: not a GGUF file`);
    o = 4;
    if (u32() !== 3) throw new Error(`${src}: GGUF version 3 expected`);
    const nTensors = u64(), nKv = u64();
    for (let i = 0; i < nKv; i++) {
        const key = str(), t = u32();
        if (key === "tokenizer.ggml.model" && t === 8) {
            valStart = o; skip(t); valEnd = o;
        } else if (key === "general.alignment" && t === 4) {
            align = u32();
        } else {
            skip(t);
        }
    }
    for (let i = 0; i < nTensors; i++) {
        str(); const nd = u32(); o += 8 * nd + 4 + 8;
    }
    if (valStart < 0) throw new Error(`${src}: no tokenizer.ggml.model`);
    const dataStart = Math.ceil(o / align) * align;
    const nameBuf = Buffer.from(name, "utf8"), len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(nameBuf.length));
    const head = Buffer.concat([b.subarray(0, valStart), len, nameBuf, b.subarray(valEnd, o)]);
    const pad = Buffer.alloc(Math.ceil(head.length / align) * align - head.length);
    const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "pd-llamacpp-")), "model.gguf");
    fs.writeFileSync(out, Buffer.concat([head, pad, b.subarray(dataStart)]));
    return out;
}

// ---- tokens exactly as pdserve's byte tokenizer + ChatML template -------
const bytes = (s) => [...Buffer.from(s, "utf8")];
// ChatML has no BOS (as Qwen2's template; pdserve adds none for it).
function chatTokens(messages) {
    const t = [];
    for (const m of messages)
        t.push(IM_START, ...bytes(`${m.role}\n${m.content}`), IM_END, ...bytes("\n"));
    t.push(IM_START, ...bytes("assistant\n"));
    return t;
}

// ---- the model and a pool of sequences -----------------------------------
const tmpModel = ggufWithTokenizerName(modelPath, "llama");
const cleanup = () => { try { fs.rmSync(path.dirname(tmpModel), {recursive: true}); } catch {} };
const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath: tmpModel});
const context = await model.createContext({contextSize: ctxSize, sequences: parallel,
                                          threads, batchSize: 512});
const free = [];
for (let i = 0; i < parallel; i++) free.push(context.getSequence());
const waiting = [];

// llama-server's slot choice: the free sequence whose cached tokens the
// prompt reuses most, if that is at least half of its cache; otherwise the
// least recently used one (so a new conversation does not evict a history
// that its own next turn would reuse).
const lastUsed = new Map();
let useClock = 0;
async function acquire(prompt) {
    while (free.length === 0)
        await new Promise((r) => waiting.push(r));
    let best = -1, bestLen = 0, lru = 0;
    for (let i = 0; i < free.length; i++) {
        const s = free[i];
        const n = useCache ? s.compareContextTokens(prompt).firstDifferentIndex : 0;
        if (n > bestLen && n >= 0.5 * s.nextTokenIndex) { best = i; bestLen = n; }
        if ((lastUsed.get(s) ?? -1) < (lastUsed.get(free[lru]) ?? -1)) lru = i;
    }
    const seq = free.splice(best >= 0 ? best : lru, 1)[0];
    lastUsed.set(seq, ++useClock);
    return seq;
}
function release(seq) {
    free.push(seq);
    const w = waiting.shift();
    if (w) w();
}

// ---- HTTP ------------------------------------------------------------------
const modelId = path.basename(modelPath);
function sendJson(res, code, obj) {
    const s = JSON.stringify(obj);
    res.writeHead(code, {"Content-Type": "application/json", "Content-Length": Buffer.byteLength(s)});
    res.end(s);
}
function sendError(res, code, msg) {
    sendJson(res, code, {error: {message: msg, type: code < 500 ? "invalid_request_error" : "server_error",
                                 param: null, code: null}});
}
function parsePrompt(chat, body) {
    if (chat) {
        const m = body.messages;
        if (!Array.isArray(m) || m.length === 0 ||
            !m.every((x) => x && typeof x.role === "string" && typeof x.content === "string"))
            return "messages must be a non-empty array of {role, content} strings";
        return chatTokens(m);
    }
    const p = body.prompt;
    if (typeof p === "string") return [BOS, ...bytes(p)];
    if (Array.isArray(p) && p.length > 0 && p.every((x) => Number.isInteger(x) && x >= 0 && x < VOCAB))
        return p;
    return `prompt must be a string or an array of token ids in [0, ${VOCAB})`;
}

async function complete(req, res, chat, body) {
    const prompt = parsePrompt(chat, body);
    if (typeof prompt === "string") return sendError(res, 400, prompt);
    const maxTokens = Number(body.max_completion_tokens ?? body.max_tokens ?? 16);
    if (!Number.isInteger(maxTokens) || maxTokens < 1 || maxTokens > MAX_TOKENS_CAP)
        return sendError(res, 400, `max_tokens must be an integer in [1, ${MAX_TOKENS_CAP}]`);
    if (prompt.length + maxTokens > ctxSize)
        return sendError(res, 400, `prompt (${prompt.length}) + max_tokens exceeds the context (${ctxSize})`);
    const temperature = Number(body.temperature ?? 1);
    const stream = body.stream === true;
    const usage = stream ? body.stream_options?.include_usage === true : true;
    let gone = false;
    res.on("close", () => { gone = !res.writableFinished; });

    const seq = await acquire(prompt);
    try {
        let cached = useCache ? seq.compareContextTokens(prompt).firstDifferentIndex : 0;
        cached = Math.min(cached, prompt.length - 1);   // evaluate at least one token
        if (cached < seq.nextTokenIndex)
            await seq.eraseContextTokenRanges([{start: cached, end: seq.nextTokenIndex}]);
        const id = `cmpl-${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
        const created = Math.floor(Date.now() / 1000);
        const chunk = (text, finish) => chat
            ? {id, object: "chat.completion.chunk", created, model: modelId,
               choices: [{index: 0, delta: text === null ? {} : {content: text}, finish_reason: finish}]}
            : {id, object: "text_completion", created, model: modelId,
               choices: [{index: 0, text: text ?? "", finish_reason: finish}]};
        const write = (obj) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
        if (stream)
            res.writeHead(200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"});
        const dec = new TextDecoder("utf-8");
        let n = 0, all = "", finish = "length";
        for await (const tok of seq.evaluate(prompt.slice(cached), {temperature})) {
            if (tok === IM_END && !body.ignore_eos) { finish = "stop"; break; }
            n++;
            const text = tok < 256 ? dec.decode(Uint8Array.of(tok), {stream: true}) : "";
            if (text !== "") {
                if (stream) write(chunk(text, null)); else all += text;
            }
            if (n >= maxTokens || gone) break;
        }
        const u = {prompt_tokens: prompt.length, completion_tokens: n,
                   total_tokens: prompt.length + n, prompt_tokens_details: {cached_tokens: cached}};
        if (!stream) {
            const choice = chat ? {index: 0, message: {role: "assistant", content: all}, finish_reason: finish}
                                : {index: 0, text: all, finish_reason: finish};
            return sendJson(res, 200, {id, object: chat ? "chat.completion" : "text_completion",
                                       created, model: modelId, choices: [choice], usage: u});
        }
        write(chunk(null, finish));
        if (usage) write({id, object: chat ? "chat.completion.chunk" : "text_completion", created,
                          model: modelId, choices: [], usage: u});
        res.end("data: [DONE]\n\n");
    } catch (e) {
        if (!res.headersSent) sendError(res, 500, String(e?.message ?? e));
        else res.end(`data: ${JSON.stringify({error: {message: String(e?.message ?? e)}})}\n\n`);
    } finally {
        release(seq);
    }
}

const server = http.createServer((req, res) => {
    if (req.method === "GET" && (req.url === "/v1/models" || req.url === "/models"))
        return sendJson(res, 200, {object: "list", data: [{id: modelId, object: "model",
                                                         created: 0, owned_by: "node-llama-cpp"}]});
    if (req.method === "GET" && req.url === "/health") return sendJson(res, 200, {status: "ok"});
    const chat = req.url === "/v1/chat/completions";
    if (req.method !== "POST" || !(chat || req.url === "/v1/completions"))
        return sendError(res, 404, "not found");
    const parts = [];
    let len = 0;
    req.on("data", (d) => {
        len += d.length;
        if (len > BODY_MAX) { sendError(res, 413, "body too large"); req.destroy(); return; }
        parts.push(d);
    });
    req.on("end", () => {
        if (len > BODY_MAX) return;
        let body;
        try { body = JSON.parse(Buffer.concat(parts).toString("utf8")); } catch {
            return sendError(res, 400, "body is not JSON");
        }
        if (body === null || typeof body !== "object") return sendError(res, 400, "body must be an object");
        complete(req, res, chat, body).catch((e) => {
            if (!res.headersSent) sendError(res, 500, String(e?.message ?? e));
            else res.destroy();
        });
    });
});
server.requestTimeout = 0;
// Idle kept-alive connections are closed after keepAliveMs, as cpp-httplib
// (llama-server) does after its keep-alive timeout: the socket's
// inactivity timer, ignored while a request is in progress.
server.keepAliveTimeout = 0;
const busy = new WeakSet();
server.on("connection", (sock) => sock.setTimeout(keepAliveMs));
// (A "timeout" listener on the server replaces Node's default, which would
// destroy the socket even mid-request.)
server.on("timeout", (sock) => { if (!busy.has(sock)) sock.destroy(); });
server.on("request", (req, res) => {
    busy.add(req.socket);
    res.on("finish", () => busy.delete(req.socket));
    res.on("close", () => busy.delete(req.socket));
});
server.listen(port, "127.0.0.1", () => {
    console.log(`http://127.0.0.1:${server.address().port}`);
});
const stop = async () => {
    server.close();
    server.closeAllConnections();
    cleanup();
    process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
setTimeout(stop, maxSeconds * 1000).unref();
