"""What a target pass over n token-rows costs here: the one curve every planner reads (`--k auto` in generate and
demo, serve's auto policy, bench's predictions, `specdec expect`), measured once per model file, CPU, kernel build,
path, KV cache type and thread team, and kept in the cache (pass-costs.json) for every later command.
`--profile FILE` (a `specdec profile` measurement) overrides it.

The measurement (`measure_target`): batch-1 passes of 1..13 rows (then about 50% apart, up to the widest a caller
plans) after 128, 512 and 2048 cached tokens (those the model's positions allow), three reps each with the widths
alternated, the fastest kept (other load only ever adds time). The curve at 512 is the typical one (`verify_cost`,
`step_s`: the knee, bench's predictions, `specdec expect`); `auto` reads every context's (engine/policy.py
PassCost) and prices a row's pass at its own sequence's length, since attention makes a wide pass dearer against a
narrow one as the context grows. An entry measured before 2048 was (128 and 512 only) stays valid: it plans without
the long point. A later caller that plans wider passes than the entry holds measures again, to its width. A torn
or foreign entry is measured again; an unwritable cache keeps it in this process's memory (atomic.KeyedStore).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from specdec.atomic import KeyedStore
from specdec.errors import SpecdecError
from specdec.models.target import TargetTraits
from specdec.models.timing import Tick, time_passes
from specdec.paths import cache_root
from specdec.provenance import provenance
from specdec.theory.economics import CostCurve, first_exceeding, fit_knee
from specdec.theory.profile import Profile

STORE = "pass-costs.json"
PROFILE_FORMAT, PROFILE_VERSION = "specdec-profile", 1
CONTEXTS, TYPICAL, REPS, MIN_ROWS = (128, 512, 2048), 512, 3, 13
KNEE_THRESHOLD = 1.5
KNEE_RULE = (f"threshold: the first n whose pass costs more than {KNEE_THRESHOLD} 1-row passes; "
             "roofline: the knee of max(1, n / knee) fitted to T(n)/T(1) by least squares")


def context_entry(context: int, times: dict[int, list], pick=statistics.median) -> dict:
    """A profile's entry for one context: each width's pass (`pick` of its reps: the median, or the fastest where
    only other load could have added time), and the curve relative to one row."""
    med = {n: pick(v) for n, v in times.items()}
    curve = {str(n): med[n] / med[1] for n in sorted(med)}
    cc = CostCurve.from_mapping(curve)
    return {"context": context, "step_s": med[1], "times_s": {str(n): med[n] for n in sorted(med)},
            "verify_cost": curve,
            "knee_threshold_rows": first_exceeding(cc, cc.max_rows, KNEE_THRESHOLD),
            "knee_roofline_rows": fit_knee(cc.points)}


def measure_target(loaded, contexts: Sequence[int], rows: Sequence[int], reps: int, tick: Tick = lambda: None,
                   pick=statistics.median, typical: int | None = None) -> dict:
    """The target's part of a profile: a curve per context, `typical`'s (default: the middle context's) as the
    typical one, its knee, and what it was measured on."""
    import torch

    contexts = sorted(set(contexts))
    typical = typical if typical in contexts else contexts[len(contexts) // 2]
    entries = [context_entry(ctx, time_passes(loaded.model, ctx, rows, reps, tick), pick) for ctx in contexts]
    mid = next(e for e in entries if e["context"] == typical)
    traits = TargetTraits.of(loaded.model)
    return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "machine": provenance(), "model": loaded.name,
            "backend": loaded.backend, "precision": traits.precision, "kv_cache": traits.kv_cache,
            "threads": torch.get_num_threads(), "reps": reps, "typical_context": typical,
            "verify_cost": mid["verify_cost"], "step_s": mid["step_s"], "draft_cost": None, "contexts": entries,
            "knee": {"rule": KNEE_RULE, "context": typical, "threshold": KNEE_THRESHOLD,
                     "threshold_rows": mid["knee_threshold_rows"], "roofline_rows": mid["knee_roofline_rows"]}}


def widths(rows: int) -> list[int]:
    """1..MIN_ROWS one by one, then about 50% apart up to `rows`."""
    out = list(range(1, MIN_ROWS + 1))
    while out[-1] < rows:
        out.append(min(rows, int(out[-1] * 1.5)))
    return out


def key(loaded) -> str:
    """The model's files (its folder: a GGUF's converted folder is named for the file's path, size and time), the
    path it runs on, its KV cache type, this CPU, the kernels' build and the thread team. The type is named where
    it is not f16 (models/kv_cache.py), so that f16's keys stay those of the entries cached before there were types,
    and a q8_0 cache never plans with an f16 curve."""
    from specdec.kernels import kernels_dir
    from specdec.provenance import cpu_name, isa

    traits = TargetTraits.of(loaded.model)
    folder = Path(loaded.path).resolve()
    stamp = max((f.stat().st_mtime_ns for f in folder.iterdir() if f.is_file()), default=0)
    kv = "" if traits.kv_cache == "f16" else f"|kv {traits.kv_cache}"
    return (f"{folder}:{stamp}|{traits.precision}{kv}|{cpu_name()}|{','.join(isa())}|"
            f"{kernels_dir().name}|threads {team()}")


def team() -> int:
    """The thread team passes start with (the key's: a team shrunk for a while by other load is the same team)."""
    from specdec.kernels.cores import sharing

    return sharing().budget.threads


def store() -> KeyedStore:
    return KeyedStore(cache_root() / STORE, "pass costs")


def cached(loaded, rows: int = MIN_ROWS) -> Profile | None:
    """The cached profile of this model here, if one covers passes of `rows` rows (a torn or foreign entry: None)."""
    entry = store().get(key(loaded))
    if not isinstance(entry, dict) or not isinstance(entry.get("rows"), int) or entry["rows"] < min(rows, _most(
            loaded)):
        return None
    try:
        return Profile.from_json(entry, "the cached pass costs")
    except SpecdecError:
        return None


def target_profile(loaded, rows: int = MIN_ROWS, file: str | None = None, quiet: bool = False) -> Profile:
    """What the planners read: `file` (a `specdec profile` measurement) where given, else the cached curve, else one
    measured now (seconds, once) and cached. `rows`: the widest pass the caller plans."""
    if file:
        return Profile.load(file)
    got = cached(loaded, rows)
    if got is not None:
        return got
    most = _most(loaded)
    rows = min(max(rows, MIN_ROWS), most)
    limit = loaded.model.cfg.max_position_embeddings
    contexts = [c for c in CONTEXTS if c + rows < limit] or [max(1, limit - rows - 1)]
    if not quiet:
        print(f"specdec: measuring this model's pass costs here, once (passes of 1..{rows} rows after "
              f"{', '.join(map(str, contexts))} cached tokens; kept in "
              f"{cache_root() / STORE}; --profile FILE overrides)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    data = measure_target(loaded, contexts, widths(rows), REPS, pick=min, typical=TYPICAL)
    data["measure_s"] = round(time.perf_counter() - t0, 2)
    return keep(loaded, data, rows)[0]


def keep(loaded, data: dict, rows: int) -> tuple[Profile, bool]:
    """A measurement of the target's passes up to `rows` rows (measure_target's, or a whole `specdec profile`) as
    this model's pass costs here, for every later command: (the profile, whether the cache holds it now). A
    drafter's cost is not kept: it is the drafter's, measured by whoever plans with one."""
    prof = Profile.from_json({**data, "rows": rows, "team": team(), "draft_cost": None}, "the measured pass costs")
    return prof, store().put(key(loaded), prof.to_json())


def _most(loaded) -> int:
    """The widest pass the model's positions allow after the shortest context."""
    return max(1, min(4096, loaded.model.cfg.max_position_embeddings - 2))


def learned_key(model: str, engine: str) -> str:
    """Another engine's steps (vLLM's), learned as they run: keyed by its model, the engine and version, this CPU
    and the thread team."""
    from specdec.provenance import cpu_name

    return f"{engine}|{model}|{cpu_name()}|threads {team()}"


def seed_learned(cost, key_: str) -> int:
    """Start a LearnedPassCost from what the last run learned for `key_` (each width trusted as seen min_seen times,
    and learned on from there); the number of widths seeded (0: nothing cached, or a torn or foreign entry)."""
    entry = store().get(key_)
    points = entry.get("points") if isinstance(entry, dict) else None
    if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
                                               and isinstance(p[1], (int, float)) and p[0] >= 1 and p[1] > 0
                                               for p in points):
        return 0
    cost.seed([(n, float(seconds)) for n, seconds in points])
    return len(points)


def keep_learned(cost, key_: str) -> None:
    """Cache what a LearnedPassCost has learned so far, for the next run."""
    points = [[n, s] for n, s in cost.curve()]
    if points:
        store().put(key_, {"points": points, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
