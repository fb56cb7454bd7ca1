"""`specdec demo`: plain and speculative greedy decoding of one copy-heavy prompt, side by side."""

from __future__ import annotations

import statistics
import sys
from collections import Counter

from specdec.theory.economics import conditional_acceptance, expected_tokens, predict_from_positional

DEMO_CODE = '''import json
from dataclasses import dataclass


@dataclass
class Order:
    order_id: int
    customer: str
    items: list[str]
    total: float


def load_orders(path):
    with open(path) as f:
        rows = json.load(f)
    return [Order(r["order_id"], r["customer"], r["items"], r["total"]) for r in rows]


def big_orders(orders, threshold):
    return [o for o in orders if o.total > threshold]


def report(orders):
    for o in orders:
        print(f"{o.order_id}: {o.customer} spent {o.total:.2f} on {len(o.items)} items")
'''
DEMO_PROMPT = ("Rename the class Order to Purchase everywhere in this code (keep everything else the same) "
               "and return the complete updated code:\n\n```python\n" + DEMO_CODE + "```")


RUNS = 2  # alternated runs of each method; the faster of each is shown
NOISY = 0.2  # runs of one method further apart than this in speed: the machine was busy, and the demo says so


def run_spread(results) -> float:
    """How far apart in speed runs of one method were: 1 - slowest / fastest."""
    rates = [r.stats.tokens_per_s for r in results]
    return 1.0 - min(rates) / max(rates) if max(rates) > 0 else 0.0


COLORS = {"accepted": "\033[32m", "recovered": "\033[33m", "bonus": "\033[35m", "prefill": "\033[36m"}
RESET = "\033[0m"


def colour(tokenizer, ids: list[int], origins: list[str], on: bool) -> str:
    if not on:
        return tokenizer.decode(ids)
    out, start = [], 0
    for i in range(1, len(ids) + 1):  # group runs of one origin so multi-byte characters decode whole
        if i == len(ids) or origins[i] != origins[start]:
            out.append(COLORS[origins[start]] + tokenizer.decode(ids[start:i]) + RESET)
            start = i
    return "".join(out)


def measured_costs(plain, spec) -> tuple[float, dict[int, float]]:
    """Draft cost per token c, and verify cost per pass size, both in plain decode steps."""
    step = statistics.median(r.verify_s for r in plain.stats.rounds)
    drafted = spec.stats.drafted
    c = spec.stats.draft_s / drafted / step if drafted else 0.0
    by_rows: dict[int, list[float]] = {}
    for r in spec.stats.rounds:
        by_rows.setdefault(len(r.drafted) + 1, []).append(r.verify_s)
    return c, {n: statistics.median(v) / step for n, v in by_rows.items()}


def demo(args) -> int:
    from specdec.drafters.base import NoDrafter
    from specdec.engine.calibrate import policy_for
    from specdec.engine.generate import Engine, GenerationConfig
    from specdec.engine.speculation import from_args
    from specdec.models.text.tokenizer import encode_prompt
    from specdec.runtime import ModelSpec, build

    use_colour = not args.no_color and sys.stdout.isatty()
    how = from_args(args)
    target, drafter = build(ModelSpec.from_args(args))
    tok = target.tokenizer
    ids = encode_prompt(tok, DEMO_PROMPT, chat=True)
    engine = Engine(target.model, tok, args.device)
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    label = {"auto": f"auto (0 to {how.k} a round, from this machine's pass costs)",
             "fixed": str(how.k)}.get(how.policy, "0 (plain decoding)")
    print(f"model: {target.name} ({target.backend}, {target.model.precision}), drafter: {drafter.name}, "
          f"k = {label}, greedy, {len(ids)} prompt tokens")
    print("task: rename a class in a code snippet that is in the prompt (the answer copies most of it; a model "
          "this small may get the edit wrong: what the demo shows is the speed, and that both outputs are the "
          "same)\n")
    engine.generate([ids], GenerationConfig(max_new_tokens=8), drafter, 2)  # warm-up
    policy = policy_for(how, target, drafter)
    runs = [(engine.generate([ids], cfg, NoDrafter())[0], engine.generate([ids], cfg, drafter, policy)[0])
            for _ in range(RUNS)]  # alternated, so a burst of other load meets both methods
    plain = max((p for p, _ in runs), key=lambda r: r.stats.tokens_per_s)
    spec = max((s for _, s in runs), key=lambda r: r.stats.tokens_per_s)

    print(colour(tok, spec.token_ids, spec.origins, use_colour))
    if use_colour:
        print("\n" + "  ".join(f"{COLORS[o]}{o}{RESET}" for o in ("prefill", "accepted", "recovered", "bonus")))
    st = spec.stats
    speedup = st.tokens_per_s / plain.stats.tokens_per_s
    print(f"\nthe faster of {RUNS} alternated runs of each:")
    print(f"plain decoding:        {plain.stats.generated_tokens} tokens, {plain.stats.tokens_per_s:6.1f} tok/s")
    print(f"speculative decoding:  {st.generated_tokens} tokens, {st.tokens_per_s:6.1f} tok/s "
          f"({len(st.rounds)} target passes for {sum(r.emitted for r in st.rounds)} tokens)")
    alpha = st.alpha or 0.0
    drafted = [len(r.drafted) for r in st.rounds]
    counts = Counter(drafted)
    common = counts.most_common(1)[0][0] if drafted else 0  # the usual draft length (auto varies it)
    kk = how.k if how.policy == "fixed" else max(common, 1)
    if how.policy == "auto":
        lengths = ", ".join(f"{n}: {c}" for n, c in sorted(counts.items()))
        print(f"auto chose these draft lengths (k: rounds): {lengths}")
    print(f"acceptance rate a = {alpha:.3f}; mean tokens per round = {st.mean_tokens_per_round:.2f} "
          f"(formula at k = {kk}: {expected_tokens(alpha, kk):.2f})")
    c, verify = measured_costs(plain, spec)
    a_pos = conditional_acceptance(drafted, [r.accepted for r in st.rounds])
    predicted = predict_from_positional(a_pos, drafted, c, lambda n: verify.get(n, 1.0))
    ideal = predict_from_positional(a_pos, drafted, c)
    decode = st.decode_tokens_per_s / plain.stats.decode_tokens_per_s
    shown = [f"{a:.2f}" for a in a_pos[:max(drafted, default=0)] if a is not None]
    print(f"per-position acceptance a_i = {', '.join(shown)}")
    rows_cost = verify.get(kk + 1, float("nan"))
    print(f"speedup: measured {speedup:.2f}x end to end, {decode:.2f}x in the decode phase; theory from the "
          f"measured a_i and costs {predicted:.2f}x for the decode phase (c = {c:.4f}, verify pass of "
          f"{kk + 1} rows = {rows_cost:.2f} steps; if verification were free: {ideal:.2f}x)")
    if speedup < 1.0:
        if ideal > 1.0 and rows_cost > st.mean_tokens_per_round:
            print(f"speculation made this SLOWER than plain decoding: a verify pass of {kk + 1} rows costs "
                  f"{rows_cost:.2f} one-row passes on this path, more than the {st.mean_tokens_per_round:.2f} tokens "
                  "a round yields (compute binds at several rows here); try "
                  + ("a precision" if how.policy == "auto" else "--k auto, a smaller --k, or a precision")
                  + " whose passes stay memory-bound (--precision gguf or fp16)")
        else:
            print("speculation made this SLOWER than plain decoding: the drafter's acceptance is too low here")
    spread = max(run_spread([p for p, _ in runs]), run_spread([s for _, s in runs]))
    if spread > NOISY:
        print(f"the machine was busy: runs of the same method differed by {spread:.0%} in speed, so these figures "
              "are unsteady; run the demo again when the machine is idle")
    differ = [(p, s) for p, s in [(plain, spec), *runs] if s.token_ids != p.token_ids]  # greedy: all the same
    print("outputs identical: " + ("NO" if differ else "yes, token for token"))
    if differ:
        a, b = differ[0][0].token_ids, differ[0][1].token_ids
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"first difference at generated token {n}", file=sys.stderr)
        return 1
    return 0
