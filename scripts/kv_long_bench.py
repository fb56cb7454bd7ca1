"""The long-prompt goals of the KV cache types (issue 59), measured side by side in one process on the bundled model.

For each round, each cache type in turn (f16, q8_0, q4_0: alternated, so that every ratio shares the machine's
state):
- plain greedy decoding of a short prompt and of a long copy-heavy one (rename a class in specdec/engine/scheduler.py
  and output the module: bench long-context's file edit, cut to --tokens), the decode phase's tokens per second,
  and the long one's time to first token against its floor (bench/hardware/profile.py prompt_entry's rule);
- beside the speed the long prompt keeps, two ceilings: for passes at their memory floor, the ratio of the bytes a
  short and a long pass read (weights plus cached keys and values at each decode phase's middle position;
  theory/floor.py kept_ceiling); and for a long pass that adds to the short one's measured time only the reading of
  its extra cache at the round's read rate (kept_at_read_rate), the lower of the two where the short pass reads its
  weights faster than that rate, from a last-level cache that holds the model;
- speculation on the long prompt, greedy: prompt lookup (ngram) at k = 5 and `--k auto`, the suffix drafter and the
  ngram,suffix cascade at `auto`; each one's decode-phase speed over plain's, and whether its tokens are plain's.
`auto` plans with this model's pass costs for the type (engine/costs.py, measured once per type and kept).

    python scripts/kv_long_bench.py --rounds 2 --json OUT.json

Prints one table per round and the medians over rounds, with the CPU, the read bandwidth, the date and the revision.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from specdec.bench.hardware.long_context import decode_rate, file_edit_prompt
from specdec.bench.hardware.profile import prompt_entry, stream_rate
from specdec.drafters.cascade import CascadeDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.calibrate import planned_cost
from specdec.engine.generate import Engine, GenerationConfig
from specdec.engine.policy import Auto
from specdec.engine.speculation import Speculation
from specdec.models.loader import load_model
from specdec.models.text.tokenizer import encode_prompt
from specdec.theory.floor import kept_at_read_rate, kept_ceiling

TYPES = ("f16", "q8_0", "q4_0")
SEQUENCE = Path(__file__).resolve().parents[1] / "specdec/engine/sequence.py"
SHORT = ("Rename the class `Scheduler` to `StepLoop` in this Python module and output the whole module:\n\n"
         + "\n".join(SEQUENCE.read_text().splitlines()[:25]))


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    return {"cpu": cpu, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "revision": rev + (" + working tree" if dirty else "")}


def drafters():
    return {"ngram k=5": (lambda: NgramDrafter(4, 1), 5), "ngram auto": (lambda: NgramDrafter(4, 1), "auto"),
            "suffix auto": (SuffixDrafter, "auto"),
            "ngram,suffix auto": (lambda: CascadeDrafter([NgramDrafter(4, 1), SuffixDrafter()]), "auto")}


def one_round(loaded, short: list[int], long: list[int], new_tokens: int, bytes_per_s: float) -> dict:
    model, tok = loaded.model, loaded.tokenizer
    cfg = GenerationConfig(new_tokens)
    out = {}
    for kind in TYPES:
        model.use_kv_cache(kind)
        cost = planned_cost(loaded, Speculation("auto", 8), quiet=True)
        engine = Engine(model, tok)
        s = engine.generate([short], cfg, None, 1)[0]
        p = engine.generate([long], cfg, None, 1)[0]
        row = {"short_tok_s": decode_rate(s), "long_tok_s": decode_rate(p), "ttft_s": p.stats.ttft_s,
               "kept": decode_rate(p) / decode_rate(s),
               "kept_ceiling": kept_ceiling(model.weight_bytes_per_token, model.kv_bytes_per_token(),
                                            len(short) + new_tokens / 2, len(long) + new_tokens / 2),
               "kept_at_read_rate": kept_at_read_rate(1 / decode_rate(s), model.kv_bytes_per_token()
                                                      * (len(long) - len(short)), bytes_per_s)}
        for name, (make, k) in drafters().items():
            policy = Auto(cost, max_k=8) if k == "auto" else k
            r = engine.generate([long], cfg, make(), policy)[0]
            row[name] = {"speedup": decode_rate(r) / decode_rate(p), "identical": r.token_ids == p.token_ids,
                         "tokens_per_pass": (r.stats.generated_tokens - 1) / max(1, len(r.stats.rounds))}
        floor = prompt_entry(model, len(long), reps=1)
        row["ttft_floor_s"], row["ttft_over_floor"] = floor["floor_s"], p.stats.ttft_s / floor["floor_s"]
        row["prefill_over_floor"] = floor["over_floor"]
        out[kind] = row
        print(f"  {kind}: kept {row['kept']:.0%} of at most {row['kept_ceiling']:.0%} (bytes) and "
              f"{row['kept_at_read_rate']:.0%} (cache at the read rate) ({row['long_tok_s']:.0f} of "
              f"{row['short_tok_s']:.0f} tok/s), "
              f"TTFT {row['ttft_s']:.2f} s = {row['ttft_over_floor']:.2f}x its floor, "
              + ", ".join(f"{n} {row[n]['speedup']:.2f}x{'' if row[n]['identical'] else ' DIFFERS'}"
                          for n in drafters()), file=sys.stderr, flush=True)
    model.use_kv_cache("f16")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=3356, help="the long prompt's tokens, chat template applied")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    loaded = load_model("default")
    tok = loaded.tokenizer
    long = encode_prompt(tok, file_edit_prompt(tok, args.tokens), chat=True)
    short = encode_prompt(tok, SHORT, chat=True)
    info = {**machine(), "precision": loaded.model.precision, "threads": torch.get_num_threads(),
            "long_tokens": len(long), "short_tokens": len(short), "new_tokens": args.new_tokens}
    rounds = []
    for i in range(args.rounds):
        bw = stream_rate(loaded.model.kernels, 1 << 28, 3) / 1e9
        print(f"round {i + 1} (stream {bw:.1f} GB/s)", file=sys.stderr, flush=True)
        rounds.append({"stream_GBps": bw, "types": one_round(loaded, short, long, args.new_tokens, bw * 1e9)})
    med = {kind: {key: statistics.median(r["types"][kind][key] for r in rounds)
                  for key in ("kept", "kept_ceiling", "kept_at_read_rate", "ttft_s", "ttft_over_floor", "long_tok_s",
                              "short_tok_s")}
           for kind in TYPES}
    for kind in TYPES:
        for name in drafters():
            med[kind][name] = statistics.median(r["types"][kind][name]["speedup"] for r in rounds)
            med[kind][name + " identical"] = all(r["types"][kind][name]["identical"] for r in rounds)
    print(f"{info['cpu']}, {info['date']}, {info['revision']}, {info['precision']}, {info['threads']} threads; "
          f"long prompt {len(long)} tokens, short {len(short)}; medians of {args.rounds} rounds")
    head = ["type", "kept", "ceiling (bytes)", "ceiling (read rate)", "TTFT", "x floor"] + list(drafters())
    print(" | ".join(head))
    for kind, m in med.items():
        print(" | ".join([kind, f"{m['kept']:.0%}", f"{m['kept_ceiling']:.0%}", f"{m['kept_at_read_rate']:.0%}",
                          f"{m['ttft_s']:.2f} s",
                          f"{m['ttft_over_floor']:.2f}"]
                         + [f"{m[n]:.2f}x{'' if m[n + ' identical'] else ' (differs)'}" for n in drafters()]))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "rounds": rounds, "medians": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
