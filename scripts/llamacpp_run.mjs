// llamacpp_run.mjs: time a llama.cpp baseline (via node-llama-cpp) on one GGUF model and one prompt.
//
// Usage:
//   node scripts/llamacpp_run.mjs --model PATH.gguf --prompt-file FILE --max-tokens N
//        [--threads 2] [--chat] [--lookup] [--ctx N]
//
//   --chat     wrap the prompt text as a single user message in the model's own chat template
//   --lookup   use node-llama-cpp's InputLookupTokenPredictor (prompt-lookup speculation)
//   --ctx N    context size (default: prompt tokens + max tokens + 16)
//   --flash-attn  enable llama.cpp flash attention (off by default)
//
// node-llama-cpp is NOT a dependency of this repo: it is loaded from $NODE_LLAMA_DIR
// (default /tmp/llamacpp), installed there with
//   mkdir -p /tmp/llamacpp && cd /tmp/llamacpp && npm init -y &&
//   NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install node-llama-cpp@3.22.1
// Only its prebuilt CPU binary is used (gpu: false, build: "never", skipDownload): it never
// compiles, downloads or contacts any network address.
//
// Decoding is greedy (temperature 0) through a LlamaContextSequence's evaluate() generator:
//   ttft_s       = time from evaluate() until the first generated token (prefill + 1 token)
//   decode_tok_s = (new_tokens - 1) / time from the first to the last generated token
// Model load, context creation and a 1-token warm-up are timed apart (load_s), excluded from both.
// Prints one JSON line on stdout; llama.cpp's own logs are kept quiet.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
    const a = { threads: 2, chat: false, lookup: false, flash: false, maxTokens: 64, ctx: 0 };
    for (let i = 0; i < argv.length; i++) {
        const k = argv[i], v = () => argv[++i];
        if (k === "--model") a.model = v();
        else if (k === "--prompt-file") a.promptFile = v();
        else if (k === "--max-tokens") a.maxTokens = parseInt(v(), 10);
        else if (k === "--threads") a.threads = parseInt(v(), 10);
        else if (k === "--ctx") a.ctx = parseInt(v(), 10);
        else if (k === "--chat") a.chat = true;
        else if (k === "--lookup") a.lookup = true;
        else if (k === "--flash-attn") a.flash = true;
        else throw new Error(`unknown argument: ${k}`);
    }
    if (!a.model || !a.promptFile || !(a.maxTokens > 0))
        throw new Error("usage: --model PATH.gguf --prompt-file FILE --max-tokens N [--threads 2] [--chat] [--lookup]");
    return a;
}

const args = parseArgs(process.argv.slice(2));
// No prebuilt-binary download, no source build, no model hub: keep node-llama-cpp offline.
process.env.NODE_LLAMA_CPP_SKIP_DOWNLOAD = "true";
const dir = process.env.NODE_LLAMA_DIR || "/tmp/llamacpp";
const require = createRequire(join(dir, "package.json"));
const nlc = await import(pathToFileURL(require.resolve("node-llama-cpp")).href);
const { getLlama, LlamaLogLevel, resolveChatWrapper, JinjaTemplateChatWrapper, InputLookupTokenPredictor } = nlc;

const now = () => Number(process.hrtime.bigint()) / 1e9;
const t0 = now();
const llama = await getLlama({
    gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
    maxThreads: args.threads, logLevel: LlamaLogLevel.error, progressLogs: false,
});
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });

const text = readFileSync(args.promptFile, "utf8");
let tokens;
if (args.chat) {
    // The GGUF's own Jinja template renders exactly as HF apply_chat_template would (e.g. SmolLM2's
    // default system prompt, no extra BOS); the built-in ChatML guess would prepend a second <|im_start|>.
    const template = model.fileInfo.metadata?.tokenizer?.chat_template;
    const wrapper = template ? new JinjaTemplateChatWrapper({ template, tokenizer: model.tokenizer })
        : resolveChatWrapper(model);
    const { contextText } = wrapper.generateContextState({
        chatHistory: [{ type: "user", text }, { type: "model", response: [] }],
    });
    tokens = contextText.tokenize(model.tokenizer);
} else {
    const bos = model.tokens.shouldPrependBosToken && model.tokens.bos != null ? [model.tokens.bos] : [];
    tokens = [...bos, ...model.tokenize(text)]; // raw text; BOS only if the GGUF asks for it
}

const ctx = await model.createContext({
    contextSize: args.ctx || tokens.length + args.maxTokens + 16,
    batchSize: Math.min(512, tokens.length + args.maxTokens + 16),
    threads: args.threads, sequences: 1, flashAttention: args.flash,
});
const predictor = args.lookup ? new InputLookupTokenPredictor() : undefined;
const sequence = ctx.getSequence({ tokenPredictor: predictor });
// Warm-up (as llama-cli does): one throwaway token, so ttft excludes first-call graph allocation.
for await (const _ of sequence.evaluate(tokens.slice(0, 1), { temperature: 0 })) break;
await sequence.clearHistory();
predictor?.updateInputTokens(tokens.slice()); // the tokens that lookup drafts are copied from
const loadS = now() - t0;

const out = [];
let tStart = now(), tFirst = null, tLast = null;
for await (const tok of sequence.evaluate(tokens, { temperature: 0, yieldEogToken: true })) {
    const t = now();
    if (tFirst === null) tFirst = t;
    if (model.isEogToken(tok)) break; // an EOG token still ends ttft, but is not counted or timed
    tLast = t;
    out.push(tok);
    if (out.length >= args.maxTokens) break;
}
const ttft = tFirst === null ? null : tFirst - tStart;
const decodeS = out.length > 1 ? tLast - tFirst : 0;
const result = {
    prompt_tokens: tokens.length,
    ttft_s: ttft === null ? null : +ttft.toFixed(4),
    decode_tok_s: decodeS > 0 ? +((out.length - 1) / decodeS).toFixed(2) : null,
    new_tokens: out.length,
    wall_s: tFirst === null ? null : +((tLast ?? tFirst) - tStart).toFixed(4),
    load_s: +loadS.toFixed(4),
    threads: ctx.currentThreads ?? args.threads,
    chat: args.chat,
    lookup: args.lookup,
    stopped_on_eog: out.length < args.maxTokens,
    text: model.detokenize(out),
};
if (args.lookup) result.predictions = sequence.tokenPredictions;
process.stdout.write(JSON.stringify(result) + "\n");
await ctx.dispose();
await model.dispose();
await llama.dispose();
