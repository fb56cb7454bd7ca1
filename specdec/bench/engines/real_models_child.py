"""One model, measured by specdec in a process of its own (so that its resident memory is its own): load time and
memory, plain greedy decoding (and n-gram decoding on request), the verify-cost curve, time to first token on a
long prompt. `specdec real-models` runs it once per file and reads the JSON it writes.

    python -m specdec.bench.engines.real_models_child --model FILE.gguf --new-tokens 64 --json OUT.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from specdec.bench.engines.model_runs import DecodeRun, Experts, SpecdecRun, TtftRun, VerifyCurve
from specdec.bench.engines.real_models import proc_rss
from specdec.models.target import TargetTraits


class NoEos:
    """A tokenizer that ends nothing: random weights emit their eos token by chance, and the comparison needs
    the full count of tokens on both sides."""

    def __init__(self, tok):
        self._tok = tok

    eos_token_ids: set = set()

    def __getattr__(self, name):
        return getattr(self._tok, name)


def decode_run(engine, ids: list[int], new_tokens: int, drafter=None, policy=None) -> DecodeRun:
    """One greedy generation (plain decoding without a drafter); decode rate = tokens after the first / time after
    the first."""
    from specdec.drafters.base import NoDrafter
    from specdec.engine.generate import GenerationConfig
    from specdec.engine.policy import Never

    drafter = drafter or NoDrafter()
    policy = policy or Never()
    t0 = time.perf_counter()
    r = engine.generate([ids], GenerationConfig(new_tokens), drafter, policy)[0]
    wall = time.perf_counter() - t0
    s = r.stats
    n = s.generated_tokens
    decode_s = s.total_s - s.ttft_s
    gaps = [b - a for a, b in zip(s.token_times, s.token_times[1:])]
    itl = statistics.median(gaps) if gaps else 0.0
    return DecodeRun(tokens=n, finish=r.finish_reason, ttft_s=s.ttft_s, seconds=s.total_s,
                     decode_tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else None,
                     itl_tokens_per_s=1 / itl if itl > 0 else None, token_ids=r.token_ids, wall_s=wall,
                     tokens_per_s=n / s.total_s if s.total_s > 0 else None, drafted=s.drafted, accepted=s.accepted,
                     alpha=s.alpha, tokens_per_pass=s.mean_tokens_per_round)


def experts_touched(model, layers, context: int, rows: list[int]) -> dict[str, float]:
    """Rows -> the distinct experts a verify pass of that many rows read, per layer on average: passes of random
    tokens after `context` cached ones (random weights route as random text would not: read it as the shape of the
    curve between k and the experts a layer has)."""
    from specdec.models.timing import primed, timed

    run, out = primed(model, context, rows), {}  # the context's prefill is not counted
    for n in rows:
        for layer in layers:
            layer.touched = layer.calls = 0
        timed(run[n])
        out[str(n)] = sum(layer.touched for layer in layers) / max(1, sum(layer.calls for layer in layers))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a .gguf file, or 'default' (the bundled model)")
    p.add_argument("--prompt", default="Summarize the following text in three sentences.")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--ttft-tokens", type=int, default=512, help="0: no TTFT measurement")
    p.add_argument("--context", type=int, default=256, help="cached tokens before the timed verify passes")
    p.add_argument("--rows", type=int, default=9, help="verify curve: passes of 1..rows rows")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ngram", action="store_true", help="also n-gram decoding (k auto), as `specdec generate`")
    p.add_argument("--keep-eos", action="store_true", help="stop at the eos token (default: ignore it)")
    p.add_argument("--lookup-cost", action="store_true", help="also time n-gram lookup (k=5) on the demo context")
    p.add_argument("--map-weights", action="store_true", help="load with the planes mapped from the cache")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)

    import torch

    from specdec.kernels.cores import configure

    configure(args.threads)  # a fixed team: the one llama.cpp is given
    from specdec.drafters.ngram import NgramDrafter
    from specdec.engine.calibrate import policy_for
    from specdec.engine.generate import Engine
    from specdec.engine.speculation import Speculation
    from specdec.models.loader import load_model
    from specdec.models.text.tokenizer import encode_prompt
    from specdec.models.timing import time_passes

    before = proc_rss()
    t0 = time.perf_counter()
    loaded = load_model(args.model, map_weights=args.map_weights)
    load_s = time.perf_counter() - t0
    after_load = proc_rss()
    model, tok = loaded.model, loaded.tokenizer
    traits = TargetTraits.of(model)
    engine = Engine(model, tok if args.keep_eos else NoEos(tok))
    ids = encode_prompt(tok, args.prompt, chat=True)
    out = SpecdecRun(model=args.model, name=loaded.name, precision=traits.precision,
                     threads=torch.get_num_threads(), load_s=load_s, rss_before_load=before,
                     rss_after_load=after_load, prompt_ids=ids, chat_template=bool(tok.chat_template),
                     ignore_eos=not args.keep_eos, weight_bytes_per_token=traits.weight_bytes_per_token)
    say = lambda m: print(f"[{Path(args.model).name}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"loaded in {load_s:.1f} s ({loaded.name}, {out.precision}); decoding {args.new_tokens} tokens")
    decode_run(engine, ids, 2)  # warm-up: first-call costs (kernel load, allocations)
    out.plain = decode_run(engine, ids, args.new_tokens)
    say(f"plain: {out.plain.decode_tokens_per_s:.2f} tok/s (decode)")
    if args.ngram:
        ngram = NgramDrafter(4, 1)
        out.ngram = decode_run(engine, ids, args.new_tokens, ngram, policy_for(Speculation(), loaded, ngram))
        say(f"ngram: {out.ngram.decode_tokens_per_s:.2f} tok/s, alpha {out.ngram.alpha}")
    rows = list(range(1, args.rows + 1))
    times = time_passes(model, args.context, rows, args.reps)
    # the fastest of the reps: on a machine shared with other work, contention only ever adds time
    med = {n: min(v) for n, v in times.items()}
    out.verify = VerifyCurve(context=args.context, reps=args.reps, rule="fastest of reps",
                             times_s={str(n): med[n] for n in rows}, cost={str(n): med[n] / med[1] for n in rows},
                             step_s=med[1], median_times_s={str(n): statistics.median(times[n]) for n in rows})
    say("verify curve: " + " ".join(f"{n}:{med[n] / med[1]:.2f}" for n in rows))
    layers = list(TargetTraits.of(model).expert_layers)  # the native experts count what a pass reads
    if layers:
        out.experts = Experts(model.cfg.num_experts, model.cfg.experts_per_token,
                              experts_touched(model, layers, args.context, rows))
        say("experts a pass reads per layer: " + " ".join(f"{n}:{t:.1f}" for n, t in out.experts.touched.items()))
    if args.ttft_tokens:
        long_ids = (ids * (args.ttft_tokens // len(ids) + 1))[: args.ttft_tokens]
        out.ttft_ids_len = len(long_ids)
        r = decode_run(engine, long_ids, 1)
        out.ttft = TtftRun(len(long_ids), r.ttft_s, r.wall_s)
        say(f"TTFT {len(long_ids)} tokens: {r.ttft_s:.2f} s")
    if args.lookup_cost:
        from specdec.bench.hardware.profile import demo_context, time_ngram

        out.lookup = time_ngram(NgramDrafter(4, 1), demo_context(tok, args.context * 2), 5)
    out.rss_end = proc_rss()
    out.save(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
