"""`specdec generate` and `specdec demo`."""

from __future__ import annotations

import argparse
import sys

from specdec.engine.speculation import add_speculation_args
from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1, NON_NEGATIVE, SEED, TOP_P, read_text
from specdec.models.config import PRECISIONS
from specdec.outputs import add_json_arg, check_json_file, emit_json, json_on_stdout
from specdec.runtime import DRAFTERS


def add_model_args(p, drafter_default: str = "ngram") -> None:
    p.add_argument("--model", default="default", help="'default' (bundled SmolLM2-135M), a HF folder or a .gguf")
    p.add_argument("--drafter", default=drafter_default, metavar="NAME[,NAME...]",
                   help=f"one of {', '.join(DRAFTERS)}, or a cascade tried in order (ngram,eagle: prompt lookup "
                        "where it matches, else the trained head)")
    p.add_argument("--draft-model", metavar="PATH", help="folder or .gguf of a draft model (same tokenizer)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="weights: for a GGUF on CPU, left out: gguf-q16 or gguf-q8, whichever runs faster here "
                        "(measured at its first load, then remembered); gguf-q16 (a GGUF's own blocks against 15-bit "
                        "activation blocks, integer dot products), gguf (the same blocks in fp32 arithmetic: "
                        "exact, slower), gguf-q8 (8-bit activation blocks: changes the model), fp16 (default for "
                        "other models on CPU), bf16 (default on CUDA), fp32, int8 (changes the model)")
    p.add_argument("--draft-precision", choices=PRECISIONS, default=None,
                   help="the draft model's weights (default: the target's --precision where that is not a gguf "
                        "path, else the draft's own: a GGUF draft takes the path its own file defaults to)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    add_kv_cache_arg(p)
    p.add_argument("--map-weights", action="store_true",
                   help="a GGUF's repacked weights written once to the cache (the file's size again on disk) and "
                        "mapped, as llama.cpp maps its file: not this process's memory, shared by processes serving "
                        "one model, and later loads read no matrix (docs/results/map-weights.md)")
    p.add_argument("--ngram-max", type=int, default=4, action=AT_LEAST_1, help="longest n-gram the lookup matches")
    p.add_argument("--ngram-min", type=int, default=1, action=AT_LEAST_1)
    p.add_argument("--draft-head", metavar="DIR",
                   help="--drafter eagle: a head from `specdec train-draft` (default: the one shipped for the bundled "
                        "model)")


def add_kv_cache_arg(p, default=None) -> None:
    """--kv-cache, the target's KV cache type (models/kv_cache.py), named as llama.cpp's --cache-type-k/-v (None:
    f16)."""
    from specdec.models.kv_cache import DEFAULT_KV, KV_TYPES

    p.add_argument("--kv-cache", choices=tuple(KV_TYPES), default=default,
                   help=f"the target's KV cache, named as llama.cpp's --cache-type-k/-v: {DEFAULT_KV} (the default: "
                        "exact), q8_0 or q4_0 (keys and values quantized in blocks of 32 as llama.cpp's types of "
                        "those names: about half or a quarter of f16's bytes a position, so longer contexts and more "
                        "slots fit; a slightly different model, and speculation stays exact for the type chosen). "
                        "q8_0 and q4_0 need the native kernels; a --draft-model's cache stays f16")


def add_chat_template_arg(p) -> None:
    """--chat-template, on the commands that turn a chat into a prompt (generate, serve, bench)."""
    from specdec.models.text.chat_templates import builtin_names

    p.add_argument("--chat-template", metavar="NAME|FILE",
                   help=f"the chat template chats go through: a built-in ({builtin_names()}) or a Jinja file; "
                        "it wins over the model's own, which is the default (docs/serving.md)")


def register(sub) -> None:
    g = sub.add_parser("generate", help="generate text with speculative decoding")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a file")
    add_model_args(g)
    add_chat_template_arg(g)
    add_speculation_args(g)
    g.add_argument("--temperature", type=float, default=0.0, action=NON_NEGATIVE, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0, action=TOP_P)
    g.add_argument("--top-k", type=int, default=0, action=NON_NEGATIVE, help="0 = off")
    g.add_argument("--seed", type=int, default=None, action=SEED)
    g.add_argument("--max-new-tokens", type=int, default=256)  # GenerationConfig checks it, before the model loads
    g.add_argument("--context", type=int, default=None, action=AT_LEAST_1,
                   help="positions the sequence may use (default: the model's own; a LongRoPE model, Phi-3.5 or "
                        "Phi-3 128k, runs its long factors past its original context, as llama.cpp does)")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the model's chat template (default on)")
    g.add_argument("--lossy-typical-acceptance", action="store_true",
                   help="LOSSY: Medusa-style typical acceptance; the output is no longer the target model's")
    add_json_arg(g, "the text, its token ids and the run's figures")
    g.add_argument("--trace", metavar="FILE", help="write every round as JSON (for `specdec explain`)")
    g.set_defaults(func=run_generate)

    d = sub.add_parser("demo", help="plain vs speculative greedy decoding side by side on the bundled model")
    add_model_args(d)
    add_speculation_args(d)
    d.add_argument("--max-new-tokens", type=int, default=400, action=AT_LEAST_1)
    d.add_argument("--no-color", action="store_true")
    d.set_defaults(func=run_demo)


def read_prompt(args) -> str:
    where = "--prompt"
    if args.prompt is not None:
        text = args.prompt
    elif args.prompt_file:
        text, where = read_text(args.prompt_file), args.prompt_file
    elif sys.stdin is not None and not sys.stdin.closed and not sys.stdin.isatty():  # None: stdin closed
        where = "stdin (give --prompt TEXT or --prompt-file FILE, or pipe text in)"
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as e:
            raise SpecdecError(f"the prompt on stdin is not UTF-8 text (byte {e.start}: {e.reason})") from None
    else:
        raise SpecdecError("no prompt: give --prompt TEXT, --prompt-file FILE, or pipe text on stdin")
    if not text.strip():
        raise SpecdecError(f"the prompt is empty: {where}")
    try:  # undecodable bytes in argv or stdin arrive as lone surrogates
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SpecdecError(f"the prompt is not UTF-8 text (character {e.start} cannot be encoded)") from None
    return text


def run_generate(args) -> int:
    from specdec.atomic import check_writable
    from specdec.engine.calibrate import policy_for
    from specdec.engine.generate import Engine, GenerationConfig
    from specdec.engine.speculation import from_args
    from specdec.engine.trace import build_trace, write_trace
    from specdec.models.text.tokenizer import IncrementalDecoder, encode_prompt
    from specdec.sampling.warp import SamplingConfig

    text = read_prompt(args)
    check_writable(args.trace)
    check_json_file(args)
    spec = from_args(args)  # checked before the model loads
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    cfg = GenerationConfig(args.max_new_tokens, sampling, tuple(args.stop), args.lossy_typical_acceptance)
    if args.lossy_typical_acceptance:
        print("specdec: warning: --lossy-typical-acceptance is LOSSY: the output is not the model's own",
              file=sys.stderr)
    target, drafter = build_with_chat_template(args, "the prompt goes to the model as raw text")
    ids = encode_prompt(target.tokenizer, text, args.chat)
    engine = Engine(target.model, target.tokenizer, args.device)
    engine.check_prompts([ids])  # before --k auto reads (or measures) pass costs
    stream = None
    if not json_on_stdout(args):
        dec = IncrementalDecoder(target.tokenizer, skip_special_tokens=True)
        seen: list[int] = []

        def stream(row, token_ids, origins):
            seen.extend(token_ids)
            sys.stdout.write(dec.step(seen))
            sys.stdout.flush()

    result = engine.generate([ids], cfg, drafter, policy_for(spec, target, drafter), on_tokens=stream)[0]
    summary = result.stats.summary()
    if args.trace:
        trace = build_trace(result, target.tokenizer, model=target.name, drafter=drafter.name, k=spec.k,
                            temperature=args.temperature, prompt=text, k_policy=spec.policy)
        write_trace(trace, args.trace)
    emit_json(args, {"text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
                     "model": target.name, "drafter": drafter.name, "policy": spec.policy, "k": spec.k, **summary})
    if json_on_stdout(args):
        return 0
    sys.stdout.write(dec.flush(seen) + "\n")
    a = summary["alpha"]
    print(f"[{summary['generated_tokens']} tokens, {summary['tokens_per_s']:.1f} tok/s, "
          f"{summary['mean_tokens_per_round']:.2f} tokens/round, "
          f"a = {'n/a' if a is None else f'{a:.2f}'}, ttft {summary['ttft_s'] * 1000:.0f} ms, "
          f"finish: {result.finish_reason}]", file=sys.stderr)
    return 0


def chat_template_for(args):
    """The --chat-template given, read and checked before the model loads (None: the model's own, if any)."""
    from specdec.models.text.chat_templates import read_chat_template

    if args.chat_template and getattr(args, "chat", True) is False:
        raise SpecdecError("--chat-template and --no-chat contradict each other: --no-chat sends the prompt raw")
    return read_chat_template(args.chat_template)


def build_with_chat_template(args, raw: str):
    """runtime.build for generate and bench: --chat-template read and checked before the model loads, put in force
    after it, and said in one line on stderr (`raw`: what happens without any template; nothing with --no-chat)."""
    from specdec.runtime import ModelSpec, build

    chosen = chat_template_for(args)
    target, drafter = build(ModelSpec.from_args(args))
    if getattr(args, "chat", True):
        say_chat_template(target.tokenizer, chosen, raw)
    return target, drafter


def say_chat_template(tokenizer, chosen, raw: str) -> str:
    """Put the chosen template in force and say on stderr, in one line, which one is (or that `raw` happens)."""
    from specdec.models.text.chat_templates import no_template_line, use_chat_template

    label = use_chat_template(tokenizer, chosen)
    line = f"chat template: {label}" if label != "none" else no_template_line(tokenizer, raw)
    print(f"specdec: {line}", file=sys.stderr, flush=True)
    return label


def run_demo(args) -> int:
    from specdec.engine.demo import demo

    return demo(args)
