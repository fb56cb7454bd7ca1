"""Everything a benchmark measured, as typed records (specdec.bench.records): built here from the samples of
the local runner or of the endpoint runner; rendered by specdec.bench.render."""

from __future__ import annotations

from dataclasses import asdict

from specdec.bench import stats
from specdec.bench.records import OVERALL, BenchReport, MethodResult, Prediction


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


def build_report(samples, methods, config: dict, profile: dict | None, profile_source: str | None,
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
            "source": profile_source, "model": profile.get("model"), "precision": profile.get("precision"),
            "verify_cost": profile["verify_cost"], "draft_cost": profile.get("draft_cost"),
            "typical_context": profile.get("typical_context"), "contexts": profile.get("contexts")},
        timing={m.name: stats.timing_outliers([s for s in samples if s.method == m.name])
                for m in methods if not m.baseline},
        endpoint=endpoint,
        samples=[sample_json(s, preds.get((s.qid, s.method))) for s in samples],
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
    return report


def _speedup(res: MethodResult, group: str) -> float | None:
    g = res.group(group)
    return g.speedup if g else None


def hf_ratios(samples, methods, cats, default_k=None) -> dict:
    """Tokens/s of ours (plain, the chosen speculative method, and the default k's) over Hugging Face's, per
    category (ratio of means over the same prompts)."""
    spec = [m for m in methods if m.family == "specdec" and m.baseline]
    main = next((m for m in spec if m.k == "auto"), spec[0] if spec else None)
    ours = list(dict.fromkeys(["plain"] + [m.name for m in spec if m is main or m.k == default_k]))
    hf = [m.name for m in methods if m.family == "hf"]
    out = {}
    for g in cats + [OVERALL]:
        tps = {n: [s.tokens_per_s for s in samples if s.method == n and g in (OVERALL, s.category)]
               for n in ours + hf}
        out[g] = {f"{a} / {b}": stats.ratio_of_means(tps[a], tps[b]) for a in ours for b in hf}
    plain = {s.qid: s.turns for s in samples if s.method == "plain"}
    hfp = {s.qid: s.turns for s in samples if s.method == "hf plain"}
    same = [all(a.token_ids == b.token_ids for a, b in zip(plain[q], hfp[q])) for q in hfp if q in plain]
    out["hf_plain_identical_to_ours"] = sum(same) / len(same) if same else None
    return out
