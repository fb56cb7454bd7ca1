"""Everything a benchmark measured, as typed records (specdec.bench.records): built here from the samples of
the local runner or of the endpoint runner; rendered by specdec.bench.render."""

from __future__ import annotations

from dataclasses import asdict

from specdec.bench import stats
from specdec.bench.records import OVERALL, BenchReport, MethodResult, Prediction
from specdec.provenance import provenance
from specdec.theory.profile import Profile

PROFILE_FIELDS = ("model", "precision", "verify_cost", "draft_cost", "typical_context", "contexts")  # in the report


def _context(sample) -> float:
    """Mean context length over the sample's decode steps: prompt plus half the answer, per turn."""
    return stats.mean([len(t.prompt_ids) + len(t.token_ids) / 2 for t in sample.turns]) or 0.0


def _predict(group, base, a_pos, alpha, profile) -> list[dict]:
    """Per-sample predictions with this group's acceptance statistics: from the profile's costs when there is
    a profile, and always from the costs measured in this run's rounds."""
    out = []
    for s in group:
        b = base[s.qid]
        pred = {"rounds": stats.predict_sample(s, b, a_pos, alpha, stats.cost_from_rounds(s, b))}
        if profile:
            cost, h = stats.cost_from_profile(profile, _context(s), stats.plain_step(b)[0])
            pred["profile"] = {**stats.predict_sample(s, b, a_pos, alpha, cost), "overhead_share": h}
        out.append(pred)
    return out


def _aggregate(group, base, preds, out) -> None:
    """Set out.predictions (a GroupResult's) from the per-sample predictions of each source of costs."""
    base_tps = [base[s.qid].tokens_per_s for s in group]
    measured = out.speedup
    for src in ("profile", "rounds"):
        if all(src in p for p in preds):
            speedup = stats.ratio_of_means([p[src]["tokens_per_s"] for p in preds], base_tps)
            iid = stats.ratio_of_means([p[src]["tokens_per_s_iid"] for p in preds], base_tps)
            err = lambda v: v / measured - 1.0 if measured and v is not None else None
            out.predictions[src] = Prediction(speedup, iid, err(speedup), err(iid))


def method_results(samples, method, by_key, cats, profile) -> tuple[MethodResult, dict]:
    """(per-category and overall results of one method, its per-sample predictions by qid)"""
    mine = [s for s in samples if s.method == method.name]
    base = {s.qid: by_key[(s.qid, method.baseline)] for s in mine} if method.baseline else None
    categories, preds_by_qid = {}, {}
    for cat in cats:
        group = [s for s in mine if s.category == cat]
        if not group:
            continue
        summ = stats.summarize(group, base)
        if base and any(s.turns[0].rounds is not None for s in group):
            preds = _predict(group, base, summ.acceptance_by_position, summ.alpha, profile)
            preds_by_qid.update({s.qid: p for s, p in zip(group, preds)})
            _aggregate(group, base, preds, summ)
        categories[cat] = summ
    res = MethodResult(categories, stats.summarize(mine, base))
    if preds_by_qid:  # overall: each prompt predicted with its own category's acceptance statistics
        _aggregate(mine, base, [preds_by_qid[s.qid] for s in mine], res.overall)
    return res, preds_by_qid


def sample_json(s, pred) -> dict:
    return {
        "qid": s.qid, "category": s.category, "method": s.method, "tokens": s.tokens, "seconds": s.seconds,
        "tokens_per_s": s.tokens_per_s, "identical": s.identical, "mismatch": s.mismatch, "prediction": pred,
        "turns": [{"prompt_tokens": t.prompt_tokens if t.prompt_tokens is not None else len(t.prompt_ids),
                   "tokens": t.tokens, "token_ids": t.token_ids, "text": t.text, "finish": t.finish,
                   "seconds": t.seconds, "ttft_s": t.ttft_s, "drafted": t.drafted, "accepted": t.accepted,
                   "rounds": None if t.rounds is None else {
                       name: [len(v) if name == "drafted" else v for v in (asdict(r)[name] for r in t.rounds)]
                       for name in ("drafted", "accepted", "emitted", "draft_s", "verify_s", "t")}}
                  for t in s.turns],
    }


def build_report(samples, methods, config: dict, profile: Profile | None, profile_source: str | None,
                 drift_margin: float = 0.10, endpoint: dict | None = None) -> BenchReport:
    cats = list(dict.fromkeys(s.category for s in samples))
    by_key = {(s.qid, s.method): s for s in samples}
    results, preds = {}, {}
    for m in methods:
        results[m.name], p = method_results(samples, m, by_key, cats, profile)
        preds.update({(q, m.name): v for q, v in p.items()})
    has_rounds = any(t.rounds is not None for s in samples for t in s.turns)
    report = BenchReport(
        config=config, categories=cats,
        methods=[{"name": m.name, "family": m.family, "k": m.k, "baseline": m.baseline} for m in methods],
        results=results,
        prediction_source=None if not has_rounds else "profile" if profile else "rounds",
        prediction_costs=("profile (verify curve at the nearest context + draft cost, with the engine's "
                          "per-round overhead measured from plain decoding)" if profile else
                          "this run's rounds (per-round draft + verify times relative to the plain step)"),
        profile=None if profile is None else {
            "source": profile_source, **{k: v for k, v in profile.to_json().items() if k in PROFILE_FIELDS}},
        timing={m.name: stats.timing_outliers([s for s in samples if s.method == m.name])
                for m in methods if not m.baseline},
        endpoint=endpoint,
        samples=[sample_json(s, preds.get((s.qid, s.method))) for s in samples],
        # the machine that decoded: against an endpoint, this client's memory bandwidth says nothing of the server's
        machine=provenance(bandwidth=not endpoint),
    )
    for m in methods:
        r = results[m.name]
        if m.meter is not None:
            report.meters[m.name] = {"alpha": m.meter.alpha, "ema": m.meter.ema,
                                     "drafted": m.meter.drafted, "accepted": m.meter.accepted,
                                     "trace": [{"qid": q, "alpha": a, "ema": e} for q, a, e in m.meter_trace]}
        if r.overall.alpha is not None:
            by_cat = {c: v.alpha for c, v in r.categories.items()}
            report.drift[m.name] = {"margin": drift_margin, "overall_alpha": r.overall.alpha, "by_category": by_cat,
                                    "flagged": stats.drift(by_cat, r.overall.alpha, drift_margin)}
    auto = next((m for m in methods if m.k == "auto"), None)
    if auto:
        fixed = {m.name: m.k for m in methods if m.family == "specdec" and isinstance(m.k, int)}
        default = next((n for n, k in fixed.items() if k == config.get("default_k")), None)
        report.auto_k = {g: stats.auto_gains({n: _speedup(results[n], g) for n in results}, auto.name, fixed,
                                             default) for g in cats + [OVERALL]}
    if any(m.family == "hf" for m in methods):
        report.hf = hf_ratios(samples, methods, cats, config.get("default_k"))
    if any(m.family == "llama.cpp" for m in methods):
        report.llamacpp = llamacpp_summary(samples, methods, cats, config.get("default_k"))
    return report


def _speedup(res: MethodResult, group: str) -> float | None:
    g = res.group(group)
    return g.speedup if g else None


def _ours(methods, default_k) -> list[str]:
    """Our methods that comparisons with other implementations show: plain, the chosen speculative method (auto
    k, else the first), and the default k's."""
    spec = [m for m in methods if m.family == "specdec" and m.baseline]
    main = next((m for m in spec if m.k == "auto"), spec[0] if spec else None)
    return list(dict.fromkeys(["plain"] + [m.name for m in spec if m is main or m.k == default_k]))


def _same_output(samples, a: str, b: str) -> float | None:
    """Share of the prompts run by both methods on which every turn's token ids are equal."""
    turns = {s.qid: s.turns for s in samples if s.method == b}
    same = [all(x.token_ids == y.token_ids for x, y in zip(s.turns, turns[s.qid]))
            for s in samples if s.method == a and s.qid in turns]
    return sum(same) / len(same) if same else None


def hf_ratios(samples, methods, cats, default_k=None) -> dict:
    """Tokens/s of ours (plain, the chosen speculative method, and the default k's) over Hugging Face's, per
    category (ratio of means over the same prompts)."""
    ours = _ours(methods, default_k)
    hf = [m.name for m in methods if m.family == "hf"]
    out = {}
    for g in cats + [OVERALL]:
        tps = {n: [s.tokens_per_s for s in samples if s.method == n and g in (OVERALL, s.category)]
               for n in ours + hf}
        out[g] = {f"{a} / {b}": stats.ratio_of_means(tps[a], tps[b]) for a in ours for b in hf}
    out["hf_plain_identical_to_ours"] = _same_output(samples, "hf plain", "plain")
    return out


def llamacpp_summary(samples, methods, cats, default_k=None) -> dict:
    """Ours (plain, the chosen speculative method, the default k's) and llama.cpp's methods over all prompts: mean
    tokens/s, mean decode tokens/s, mean TTFT, and speedups over our plain (ratios of means, same prompts);
    llama.cpp's lookup over llama.cpp plain per category; how often outputs are equal (informative only:
    llama.cpp computes with its own kernels, on the GGUF's weights as stored)."""
    mine = lambda n, g=OVERALL: [s for s in samples if s.method == n and g in (OVERALL, s.category)]
    tps = lambda n, g=OVERALL: [s.tokens_per_s for s in mine(n, g)]
    dec = lambda n: [s.decode_tokens_per_s for s in mine(n)]
    rows = {}
    for n in _ours(methods, default_k) + [m.name for m in methods if m.family == "llama.cpp"]:
        d, d0 = dec(n), dec("plain")
        rows[n] = {"tokens_per_s": stats.mean(tps(n)),
                   "decode_tokens_per_s": stats.mean([x for x in d if x is not None]),
                   "ttft_s": stats.mean([t.ttft_s for s in mine(n) for t in s.turns if t.ttft_s is not None]),
                   "speedup": stats.ratio_of_means(tps(n), tps("plain")),
                   "decode_speedup": None if None in d + d0 else stats.ratio_of_means(d, d0)}
    lc_plain = "llama.cpp plain"
    lookups = [m.name for m in methods if m.family == "llama.cpp" and m.k is not None]
    own = {n: {g: stats.ratio_of_means(tps(n, g), tps(lc_plain, g)) for g in cats + [OVERALL]} for n in lookups}
    return {"methods": rows, "lookup_over_llamacpp_plain": own,
            "plain_identical_to_ours": _same_output(samples, lc_plain, "plain"),
            "lookup_identical_to_llamacpp_plain": {n: _same_output(samples, n, lc_plain) for n in lookups}}
