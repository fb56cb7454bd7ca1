// llamacpp_worker.mjs: llama.cpp (through node-llama-cpp) as a long-lived worker for `specdec bench --compare
// llama.cpp`, and as the reference that specdec's logits and tokenizer are checked against (llamacpp_oracle.py).
// Loads one GGUF once, then answers one JSON line on stdout for each JSON line on stdin.
//
//   node llamacpp_worker.mjs --model PATH.gguf [--threads 2] [--flash-attn]
//
// node-llama-cpp is NOT a dependency of specdec: it is loaded from $NODE_LLAMA_DIR (default /tmp/llamacpp),
// installed there with
//   mkdir -p /tmp/llamacpp && cd /tmp/llamacpp && npm init -y &&
//   NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund node-llama-cpp@3.22.1
// Only its prebuilt CPU binary is used (gpu: false, build: "never", skipDownload): it never compiles, downloads
// or contacts any network address.
//
// Protocol (UTF-8, one JSON object per line; stdout carries nothing else, llama.cpp's logs go to stderr):
//   worker -> {"ready": true, "model", "gguf", "type", "threads", "context_size", "load_s", "node_llama_cpp",
//              "llama_cpp"}                                  once, after loading (a 1-token warm-up included)
//          or {"ready": false, "error": "..."}               and exits 1
//   request  {"id": 1, "max_tokens": 64, "lookup": false, "k": 5, "ngram_min": 1, "ngram_max": 4,
//             "tokens": [ids] | "messages": [{"role", "content"}] | "text": "..."}
//            tokens are used as they are; messages go through the GGUF's own chat template (generation prompt
//            added); text is tokenized raw (BOS only if the GGUF asks for it)
//   reply    {"id": 1, "ok": true, "prompt_tokens": n, "tokens": [ids], "text": "...", "finish": "eos"|"length",
//             "ttft_s", "seconds", "last_token_s", "token_times": [s, ...], "drafted": n, "accepted": n}
//          or {"id": 1, "ok": false, "error": "..."}
//   {"op": "quit"} or the end of stdin: the worker frees the model and exits 0.
//
// Greedy decoding (temperature 0). Times are seconds since evaluate() was called, on the worker's clock (the
// pipe is not timed): ttft_s = the first generated token (prefill + 1 token); seconds = the last token, or the
// end-of-generation token when there is one (it is not returned or counted); last_token_s = when the last returned
// token arrived (null without one): (tokens - 1) / (last_token_s - ttft_s) is the decode rate; token_times = per
// returned token.
// A token that lookup drafted and the target validated in an earlier pass gets that pass's time, so tokens that
// one pass produced share a time (as a Hugging Face streamer sees them). drafted / accepted: prompt-lookup tokens
// verified / confirmed during this request (node-llama-cpp's validated + refuted / validated counters).
// Every request starts from an empty KV cache (no prefix reuse). Lookup drafts up to k tokens, copied from the
// request's own prompt tokens after the longest match (ngram_min..ngram_max tokens; 0 = no limit) of the
// generated tail. Without k, ngram_min and ngram_max lookup drafts as node-llama-cpp's InputLookupTokenPredictor
// does by default (k 3, patterns of 1.. tokens).
//
// Two more requests, with an "op" (a request without one generates, as above):
//   request  {"id": 2, "op": "logits", "tokens": [ids], "out": "/path/file", "context": n (optional)}
//            the tokens as one sequence from an empty KV cache (positions 0..n-1), fed in chunks of CHUNK; every
//            position's full logits vector (row i: the raw scores for the token after tokens[i], before any
//            sampling) written to `out` as float32 in native byte order (little-endian here), row-major [n, vocab];
//            `context`: a context of at least n positions (what LongRoPE's factors are chosen by)
//   reply    {"id": 2, "ok": true, "n": n, "vocab": v, "out": "/path/file"}
//   request  {"id": 3, "op": "tokenize", "texts": ["...", ...], "special": true}
//            llama.cpp's own tokenizer (common_tokenize) on each text, no BOS or EOS added; special: control
//            tokens written in the text (<|im_start|>) become one token each, else they are spelled as text
//   reply    {"id": 3, "ok": true, "tokens": [[ids], ...]}
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
    const a = { threads: 2, flash: false };
    for (let i = 0; i < argv.length; i++) {
        const k = argv[i], v = () => argv[++i];
        if (k === "--model") a.model = v();
        else if (k === "--threads") a.threads = parseInt(v(), 10);
        else if (k === "--flash-attn") a.flash = true;
        else throw new Error(`unknown argument: ${k}`);
    }
    if (!a.model || !(a.threads > 0)) throw new Error("usage: --model PATH.gguf [--threads N] [--flash-attn]");
    return a;
}

const send = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
// Anything node-llama-cpp prints goes to stderr: stdout is the protocol.
for (const name of ["log", "info", "warn", "debug"]) console[name] = (...a) => console.error(...a);
const now = () => Number(process.hrtime.bigint()) / 1e9;

let args, nlc, llama, model, ctx, sequence, predictor, seqKey = null, version = null, cold = false;
try {
    args = parseArgs(process.argv.slice(2));
    process.env.NODE_LLAMA_CPP_SKIP_DOWNLOAD = "true";
    const dir = process.env.NODE_LLAMA_DIR || "/tmp/llamacpp";
    const require = createRequire(join(dir, "package.json"));
    let entry;
    try {
        entry = require.resolve("node-llama-cpp");
    } catch {
        throw new Error(`node-llama-cpp is not installed in ${dir} ($NODE_LLAMA_DIR)`);
    }
    try {
        const pkg = join(dir, "node_modules", "node-llama-cpp", "package.json");
        version = JSON.parse(readFileSync(pkg, "utf8")).version;
    } catch { /* the version is informative only */ }
    nlc = await import(pathToFileURL(entry).href);
    const t0 = now();
    llama = await nlc.getLlama({
        gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true, progressLogs: false,
        maxThreads: args.threads, logLevel: nlc.LlamaLogLevel.error,
        logger: (level, message) => process.stderr.write(`llama.cpp: ${message}\n`),
    });
    model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });
    await ensureContext(2048);
    await ensureSequence(false, 0, 0, 0);
    await warmUp();
    const meta = model.fileInfo.metadata?.general ?? {};
    send({
        ready: true, model: meta.name ?? null, gguf: args.model, type: describeType(), threads: args.threads,
        context_size: ctx.contextSize, train_context_size: model.trainContextSize, load_s: now() - t0,
        node_llama_cpp: version, llama_cpp: llama.llamaCppRelease?.release ?? null, flash_attention: args.flash,
    });
} catch (e) {
    send({ ready: false, error: String(e?.message ?? e) });
    process.exit(1);
}

// One throwaway token on a new context (as llama-cli does), so that no timed request pays for allocating its graph.
async function warmUp() {
    const token = model.tokens.bos ?? model.tokenize("a")[0];
    for await (const _ of sequence.evaluate([token], { temperature: 0 })) break;
    await sequence.clearHistory();
    cold = false;
}

function describeType() {
    try {
        const t = model.typeDescription;
        return typeof t === "string" ? t : JSON.stringify(t);
    } catch {
        return null;
    }
}

async function ensureContext(needed) {
    if (ctx && ctx.contextSize >= needed) return;
    const limit = model.trainContextSize || needed;
    if (needed > limit) throw new Error(`${needed} tokens do not fit the model's context of ${limit}`);
    let size = 2048;
    while (size < needed) size *= 2;
    size = Math.min(size, limit);
    if (sequence) { await sequence.dispose(); sequence = null; seqKey = null; }
    if (ctx) await ctx.dispose();
    ctx = await model.createContext({
        contextSize: size, batchSize: Math.min(512, size), threads: args.threads, sequences: 1,
        flashAttention: args.flash,
    });
    cold = true;
}

// One sequence at a time; a different lookup setting gets a fresh sequence (the predictor is fixed per sequence).
async function ensureSequence(lookup, k, ngramMin, ngramMax) {
    const key = lookup ? `lookup:${k}:${ngramMin}:${ngramMax}` : "plain";
    if (sequence && seqKey === key) return;
    if (sequence) await sequence.dispose();
    predictor = lookup ? new nlc.InputLookupTokenPredictor({
        patternLength: { min: ngramMin, max: ngramMax }, predictionLength: { min: 1, max: k },
    }) : undefined;
    sequence = ctx.getSequence({ tokenPredictor: predictor });
    seqKey = key;
}

function promptTokens(req) {
    if (Array.isArray(req.tokens)) {
        if (!req.tokens.every((t) => Number.isInteger(t) && t >= 0)) throw new Error("tokens: expected integer ids");
        return req.tokens.slice();
    }
    if (Array.isArray(req.messages)) {
        // The GGUF's own Jinja template renders as HF apply_chat_template would (SmolLM2's default system
        // prompt, no extra BOS); node-llama-cpp's built-in guess is the fallback.
        const template = model.fileInfo.metadata?.tokenizer?.chat_template;
        const wrapper = template ? new nlc.JinjaTemplateChatWrapper({ template, tokenizer: model.tokenizer })
            : nlc.resolveChatWrapper(model);
        const chatHistory = req.messages.map((m) => m.role === "assistant" ? { type: "model", response: [m.content] }
            : m.role === "system" ? { type: "system", text: m.content } : { type: "user", text: m.content });
        chatHistory.push({ type: "model", response: [] });
        return wrapper.generateContextState({ chatHistory }).contextText.tokenize(model.tokenizer);
    }
    if (typeof req.text === "string") {
        const bos = model.tokens.shouldPrependBosToken && model.tokens.bos != null ? [model.tokens.bos] : [];
        return [...bos, ...model.tokenize(req.text)];
    }
    throw new Error("a request needs tokens, messages or text");
}

async function generate(req) {
    const maxTokens = req.max_tokens;
    if (!Number.isInteger(maxTokens) || maxTokens < 1) throw new Error("max_tokens: expected an integer >= 1");
    const lookup = !!req.lookup;
    const k = lookup ? req.k ?? 3 : 0, ngramMin = req.ngram_min ?? 1, ngramMax = req.ngram_max ?? 0;
    for (const [name, v, least] of [["k", k, 1], ["ngram_min", ngramMin, 1], ["ngram_max", ngramMax, 0]])
        if (lookup && !(Number.isInteger(v) && v >= least)) throw new Error(`${name}: expected an integer >= ${least}`);
    const tokens = promptTokens(req);
    if (tokens.length === 0) throw new Error("the prompt has no tokens");
    await ensureContext(tokens.length + maxTokens + (lookup ? k : 0) + 8);
    await ensureSequence(lookup, k, ngramMin, ngramMax);
    if (cold) await warmUp();
    await sequence.clearHistory();
    predictor?.updateInputTokens(tokens); // the tokens lookup copies its drafts from
    const before = sequence.tokenPredictions;

    const out = [], times = [];
    let finish = "length", tFirst = null, tEnd = null, tLast = null, used = before.used;
    const t0 = now();
    for await (const tok of sequence.evaluate(tokens, { temperature: 0, yieldEogToken: true })) {
        const t = now();
        if (tFirst === null) tFirst = t - t0;
        tEnd = t - t0;
        if (model.isEogToken(tok)) { finish = "eos"; break; }
        tLast = tEnd;
        const usedNow = sequence.tokenPredictions.used; // grew: this token was validated in an earlier pass
        times.push(usedNow > used && times.length ? times[times.length - 1] : tEnd);
        used = usedNow;
        out.push(tok);
        if (out.length >= maxTokens) break;
    }
    const after = sequence.tokenPredictions;
    const drafted = after.validated + after.refuted - before.validated - before.refuted;
    return {
        prompt_tokens: tokens.length, tokens: out, text: model.detokenize(out), finish,
        ttft_s: tFirst, seconds: tEnd ?? 0, last_token_s: tLast, token_times: times,
        drafted: lookup ? drafted : null, accepted: lookup ? after.validated - before.validated : null,
    };
}

// Chunks bound the memory of the logits maps (a position's map holds the whole vocabulary); llama.cpp gives the
// same logits fed token by token as in one batch (measured on the bundled GGUF: identical to the bit).
const CHUNK = 32;

async function logits(req) {
    const tokens = promptTokens({ tokens: req.tokens });
    if (tokens.length === 0) throw new Error("the sequence has no tokens");
    if (typeof req.out !== "string" || !req.out) throw new Error("out: expected a file path");
    const context = req.context ?? 0;
    if (!Number.isInteger(context) || context < 0) throw new Error("context: expected a whole number");
    await ensureContext(Math.max(tokens.length + 8, context));
    await ensureSequence(false, 0, 0, 0);
    await sequence.clearHistory();
    let rows = null, vocab = 0;
    for (let start = 0; start < tokens.length; start += CHUNK) {
        const chunk = tokens.slice(start, start + CHUNK).map((t) => [t, { generateNext: { logits: true } }]);
        const results = await sequence.controlledEvaluate(chunk);
        for (let i = 0; i < chunk.length; i++) {
            const map = results[i]?.next?.logits;
            if (!map) throw new Error(`llama.cpp returned no logits at position ${start + i}`);
            if (rows === null) {
                vocab = map.size;
                rows = new Float32Array(tokens.length * vocab).fill(NaN);
            }
            if (map.size !== vocab) throw new Error(`position ${start + i}: ${map.size} logits, not ${vocab}`);
            const row = rows.subarray((start + i) * vocab, (start + i + 1) * vocab);
            for (const [token, value] of map) {
                if (!(token >= 0 && token < vocab)) throw new Error(`token id ${token} is outside the vocabulary`);
                row[token] = value;
            }
        }
    }
    await sequence.clearHistory();
    writeFileSync(req.out, Buffer.from(rows.buffer, rows.byteOffset, rows.byteLength));
    return { n: tokens.length, vocab, out: req.out };
}

function tokenize(req) {
    if (!Array.isArray(req.texts) || !req.texts.every((t) => typeof t === "string"))
        throw new Error("texts: expected a list of strings");
    // model.tokenize: common_tokenize(vocab, text, add_special = false, parse_special = special)
    return { tokens: req.texts.map((t) => Array.from(model.tokenize(t, !!req.special))) };
}

const OPS = { logits, tokenize };

async function shutdown(code) {
    try {
        await sequence?.dispose();
        await ctx?.dispose();
        await model?.dispose();
        await llama?.dispose();
    } finally {
        process.exit(code);
    }
}

// Requests are answered one at a time, in order.
const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
    if (!line.trim()) continue;
    let req;
    try {
        req = JSON.parse(line);
    } catch {
        send({ id: null, ok: false, error: `not JSON: ${line.slice(0, 80)}` });
        continue;
    }
    if (req.op === "quit") break;
    try {
        if (req.op !== undefined && !Object.hasOwn(OPS, req.op)) throw new Error(`unknown op: ${req.op}`);
        send({ id: req.id ?? null, ok: true, ...(await (OPS[req.op] ?? generate)(req)) });
    } catch (e) {
        send({ id: req.id ?? null, ok: false, error: String(e?.message ?? e) });
    }
}
await shutdown(0);
