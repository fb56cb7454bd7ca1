"""Everything a benchmark measured, as one JSON-able dict, and its Markdown tables and PNG plot."""

from __future__ import annotations

from specdec.bench import stats
from specdec.bench.runner import Round

OVERALL = "overall"


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


def _aggregate(group, base, preds, out: dict) -> None:
    base_tps = [base[s.qid].tokens_per_s for s in group]
    measured = out["speedup"]
    for src, key in (("profile", "predicted_speedup"), ("rounds", "predicted_speedup_rounds")):
        if all(src in p for p in preds):
            out[key] = stats.ratio_of_means([p[src]["tokens_per_s"] for p in preds], base_tps)
            out[key + "_iid"] = stats.ratio_of_means([p[src]["tokens_per_s_iid"] for p in preds], base_tps)
            out[key + "_error"] = out[key] / measured - 1.0 if measured else None
            out[key + "_iid_error"] = out[key + "_iid"] / measured - 1.0 if measured else None


def method_results(samples, method, by_key, cats, profile) -> tuple[dict, dict]:
    """(per-category and overall summaries of one method, its per-sample predictions by qid)"""
    mine = [s for s in samples if s.method == method.name]
    base = {s.qid: by_key[(s.qid, method.baseline)] for s in mine} if method.baseline else None
    res = {"categories": {}}
    preds_by_qid = {}
    for cat in cats:
        group = [s for s in mine if s.category == cat]
        if not group:
            continue
        summ = stats.summarize(group, base)
        if base and any(s.turns[0].rounds is not None for s in group):
            preds = _predict(group, base, summ["acceptance_by_position"], summ["alpha"], profile)
            preds_by_qid.update({s.qid: p for s, p in zip(group, preds)})
            _aggregate(group, base, preds, summ)
        res["categories"][cat] = summ
    res[OVERALL] = stats.summarize(mine, base)
    if preds_by_qid:  # overall: each prompt predicted with its own category's acceptance statistics
        _aggregate(mine, base, [preds_by_qid[s.qid] for s in mine], res[OVERALL])
    return res, preds_by_qid


def sample_json(s, pred) -> dict:
    return {
        "qid": s.qid, "category": s.category, "method": s.method, "tokens": s.tokens, "seconds": s.seconds,
        "tokens_per_s": s.tokens_per_s, "identical": s.identical, "mismatch": s.mismatch, "prediction": pred,
        "turns": [{"prompt_tokens": len(t.prompt_ids), "token_ids": t.token_ids, "text": t.text,
                   "finish": t.finish, "seconds": t.seconds, "ttft_s": t.ttft_s,
                   "rounds": None if t.rounds is None else {
                       field: [getattr(r, field) for r in t.rounds] for field in Round._fields}} for t in s.turns],
    }


def build_report(samples, methods, config: dict, profile: dict | None, profile_source: str | None,
                 drift_margin: float = 0.10) -> dict:
    cats = list(dict.fromkeys(s.category for s in samples))
    by_key = {(s.qid, s.method): s for s in samples}
    results, preds = {}, {}
    for m in methods:
        results[m.name], p = method_results(samples, m, by_key, cats, profile)
        preds.update({(q, m.name): v for q, v in p.items()})
    report = {
        "config": config,
        "profile": None if profile is None else {
            "source": profile_source, "model": profile.get("model"), "precision": profile.get("precision"),
            "verify_cost": profile["verify_cost"], "draft_cost": profile.get("draft_cost"),
            "typical_context": profile.get("typical_context"), "contexts": profile.get("contexts")},
        "prediction_costs": ("profile (verify curve at the nearest context + draft cost, with the engine's "
                             "per-round overhead measured from plain decoding)" if profile else
                             "this run's rounds (per-round draft + verify times relative to the plain step)"),
        "categories": cats,
        "methods": [{"name": m.name, "family": m.family, "k": m.k, "baseline": m.baseline} for m in methods],
        "results": results,
        "timing": {m.name: stats.timing_outliers([s for s in samples if s.method == m.name])
                   for m in methods if not m.baseline},
        "drift": {}, "meters": {},
        "samples": [sample_json(s, preds.get((s.qid, s.method))) for s in samples],
    }
    for m in methods:
        r = results[m.name]
        if m.meter is not None:
            report["meters"][m.name] = {"alpha": m.meter.alpha, "ema": m.meter.ema,
                                        "drafted": m.meter.drafted, "accepted": m.meter.accepted,
                                        "trace": [{"qid": q, "alpha": a, "ema": e} for q, a, e in m.meter_trace]}
        if r[OVERALL].get("alpha") is not None:
            by_cat = {c: v["alpha"] for c, v in r["categories"].items()}
            report["drift"][m.name] = {"margin": drift_margin, "overall_alpha": r[OVERALL]["alpha"],
                                       "by_category": by_cat,
                                       "flagged": stats.drift(by_cat, r[OVERALL]["alpha"], drift_margin)}
    auto = next((m for m in methods if m.k == "auto"), None)
    if auto:
        fixed = {m.name: m.k for m in methods if m.family == "specdec" and isinstance(m.k, int)}
        default = next((n for n, k in fixed.items() if k == config.get("default_k")), None)
        report["auto_k"] = {g: stats.auto_gains({n: _speedup(results[n], g) for n in results}, auto.name, fixed,
                                                default) for g in cats + [OVERALL]}
    if any(m.family == "hf" for m in methods):
        report["hf"] = hf_ratios(samples, methods, cats, config.get("default_k"))
    return report


def _speedup(res: dict, group: str):
    return (res[OVERALL] if group == OVERALL else res["categories"].get(group, {})).get("speedup")


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


# --- rendering ---------------------------------------------------------------------------------------------


def _x(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}x"


def _f(v, digits: int = 2, scale: float = 1.0, suffix: str = "") -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}{suffix}"


def _pct(v) -> str:
    return "-" if v is None else f"{v * 100:+.0f}%"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def leaderboard(report: dict) -> str:
    """Spec-Bench's leaderboard: a row per speculative method, speedup per category, overall, and the mean
    accepted tokens per target pass."""
    cats = report["categories"]
    rows = []
    for m in report["methods"]:
        if not m["baseline"]:
            continue
        r = report["results"][m["name"]]
        rows.append([m["name"]] + [_x(r["categories"][c].get("speedup")) for c in cats]
                    + [_x(r[OVERALL].get("speedup")), _f(r[OVERALL]["tokens_per_pass"])])
    return _table(["Method"] + cats + ["Overall", "Mean accepted tokens"], rows)


def details(report: dict) -> str:
    header = ["Method", "Category", "plain tok/s", "tok/s", "speedup", "decode speedup", "robust", "predicted", "error",
              "iid-a predicted", "tokens/pass", "a", "a_i (i=1..4)", "TTFT ms", "ITL p50 ms", "ITL p99 ms", "burst",
              "identical"]
    rows = []
    key = "predicted_speedup" if report["profile"] else "predicted_speedup_rounds"
    for m in report["methods"]:
        r = report["results"][m["name"]]
        for g, v in list(r["categories"].items()) + [(OVERALL, r[OVERALL])]:
            a_pos = ", ".join(_f(a) for a in v["acceptance_by_position"][:4]) or "-"
            rows.append([m["name"], g, _f(v.get("baseline_tokens_per_s"), 1), _f(v["tokens_per_s"], 1),
                         _x(v.get("speedup")), _x(v.get("decode_speedup")), _x(v.get("robust_speedup")),
                         _x(v.get(key)), _pct(v.get(key + "_error")),
                         _x(v.get(key + "_iid")), _f(v["tokens_per_pass"]), _f(v["alpha"]), a_pos,
                         _f(v["ttft_s"], 0, 1000), _f(v["itl_p50_s"], 1, 1000), _f(v["itl_p99_s"], 1, 1000),
                         _f(v["burst_share"], 0, 100, "%"), _f(v.get("identical_rate"), 0, 100, "%")])
    return _table(header, rows)


def _auto_section(report: dict) -> list[str]:
    rows = [[g, _x(v.get("auto")), f"k={v.get('best_fixed_k')}: {_x(v.get('best_fixed'))}",
             _pct(v.get("gain_vs_best")), _x(v.get("default")), _pct(v.get("gain_vs_default"))]
            for g, v in report["auto_k"].items() if v]
    header = ["Category", "auto", "best fixed k", "auto vs best", f"default k={report['config'].get('default_k')}",
              "auto vs default"]
    return ["", "## Auto k", "", "k chosen each round from the request's running a (Beta prior) and the "
            "profile's cost curve, against fixed k on the same prompts.", "", _table(header, rows)]


def _hf_section(report: dict) -> list[str]:
    hf = report["hf"]
    cols = list(hf[OVERALL])
    rows = [[g] + [_x(hf[g][c]) for c in cols] for g in report["categories"] + [OVERALL]]
    return ["", "## Against Hugging Face transformers generate (fp32, same weights)", "",
            "Ratios of mean tokens/s on the same prompts.", "", _table(["Category"] + cols, rows), "",
            "Hugging Face plain greedy output identical to ours: "
            f"{_f(hf['hf_plain_identical_to_ours'], 0, 100, '%')} of prompts "
            f"(ours runs {report['config']['precision']} weights)."]


def _checks_section(report: dict) -> list[str]:
    out = ["", "## Checks", ""]
    for name, tm in report["timing"].items():
        if tm:
            slow = tm["slow_qids"]
            out.append(f"- timing, {name}: decode step median {tm['median_step_s'] * 1e3:.1f} ms; {len(slow)} of "
                       f"{tm['prompts']} prompts ran more than {tm['factor']}x slower" + (
                           f" (questions {', '.join(slow)}: was the machine busy? their speedups are suspect)"
                           if slow else ""))
    for name, r in report["results"].items():
        if r[OVERALL].get("timing_suspect"):
            out.append(f"- timing, {name}: on questions {', '.join(r[OVERALL]['timing_suspect'])} it or its "
                       f"baseline took more than {stats.DISTURBED}x its robust decode time (something else ran); "
                       "their measured speedups are suspect, see the robust column")
    for name, d in report["drift"].items():
        flagged = ", ".join(f"{f['category']} ({f['alpha']:.2f}, {f['delta']:+.2f})" for f in d["flagged"])
        meter = report["meters"].get(name, {})
        out.append(f"- acceptance drift, {name}: overall a = {d['overall_alpha']:.3f} (the engine's meter, "
                   f"warm-up included: a = {_f(meter.get('alpha'), 3)}, EMA {_f(meter.get('ema'), 3)}); "
                   f"categories beyond +/-{d['margin']:.2f}: {flagged or 'none'}")
    for n, r in report["results"].items():
        for x in r[OVERALL].get("mismatches", []):
            gap = f", target logit gap top1 - top2 = {x['logit_gap']:.4f}" if "logit_gap" in x else ""
            out.append(f"- output differs, {n}: question {x['qid']}, turn {x['turn'] + 1}, token {x['position']}: "
                       f"{x['token']} instead of {x['baseline_token']}{gap}")
    return out


def prediction_errors(report: dict) -> list[str]:
    """One line per method: the prediction's error overall and its mean absolute error over categories."""
    key = "predicted_speedup" if report["profile"] else "predicted_speedup_rounds"
    out = []
    for name, r in report["results"].items():
        if r[OVERALL].get(key + "_error") is None:
            continue
        parts = []
        for label, k in (("conditional a_i", key + "_error"), ("iid a", key + "_iid_error")):
            errs = [abs(v[k]) for v in r["categories"].values() if v.get(k) is not None]
            parts.append(f"{label}: overall {_pct(r[OVERALL][k])}, mean |error| over categories "
                         f"{_f(stats.mean(errs), 1, 100, '%')}")
        robust = r[OVERALL].get("robust_speedup")
        vs_robust = f"; against the robust speedup: {_pct(r[OVERALL][key] / robust - 1)}" if robust else ""
        out.append(f"- prediction error, {name}: " + "; ".join(parts) + vs_robust)
    return out


def markdown(report: dict) -> str:
    cfg = report["config"]
    out = [f"# specdec bench: {cfg['model']} ({cfg['precision']}), drafter {cfg['drafter']}, "
           f"{cfg['max_new_tokens']} new tokens, greedy, batch 1",
           "", f"{cfg['prompts']} prompts from {cfg['prompt_file']}; plain and speculative decoding alternate "
           "on each prompt. Speedup = mean tokens/s over mean plain tokens/s on the same prompts (prefill "
           "included).", "", "## Speedup (Spec-Bench layout)", "", leaderboard(report), "",
           "## Details", "", f"Predicted: from {report['prediction_costs']}, the category's measured conditional "
           "acceptance a_i = P(accept i | accepted < i) and draft-length distribution. iid-a: the same costs "
           "with one acceptance rate a. Robust: the same speedup with every round's duration replaced by the median "
           "of its turn's rounds of the same draft length (insensitive to bursts of load from other processes). "
           "ITL: gaps between consecutive tokens (0 inside a burst); burst: share of tokens that arrived with others "
           "in one round.", "", details(report), ""] + prediction_errors(report)
    if "auto_k" in report:
        out += _auto_section(report)
    if "hf" in report:
        out += _hf_section(report)
    return "\n".join(out + _checks_section(report)) + "\n"


def plot(report: dict, path) -> None:
    """Measured speedup per category (bars, one per speculative method) with the predicted speedups (markers)."""
    from specdec.theory.plots import _pyplot

    plt = _pyplot()
    groups = report["categories"] + [OVERALL]
    spec = [m["name"] for m in report["methods"] if m["baseline"]]
    base = {m["name"]: m["baseline"] for m in report["methods"]}
    key = "predicted_speedup" if report["profile"] else "predicted_speedup_rounds"
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(groups) * max(1, len(spec)) ** 0.5), 4.5), dpi=110)
    width = 0.8 / max(1, len(spec))
    for j, name in enumerate(spec):
        r = report["results"][name]
        vals = [(r[OVERALL] if g == OVERALL else r["categories"].get(g, {})) for g in groups]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
        label = name if base[name] == "plain" else f"{name} (vs {base[name]})"
        ax.bar(xs, [v.get("speedup") or 0 for v in vals], width, label=label)
        pred = [(x, v[key]) for x, v in zip(xs, vals) if v.get(key) is not None]
        if pred:
            ax.plot(*zip(*pred), "kD", ms=5, label="predicted" if j == 0 else None)
    ax.axhline(1.0, color="tab:red", lw=0.8, ls="--", label="plain decoding")
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_xlabel("category")
    ax.set_ylabel("speedup over its plain decoding (x)")
    ax.set_title(f"specdec bench: {report['config']['model']}, drafter {report['config']['drafter']}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _bytes(n) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"


def render_profile(p: dict) -> str:
    """The profile as text for people (the JSON holds the same and more)."""
    out = [f"profile: {p['model']} ({p['backend']}, {p['precision']}), drafter {p['drafter']}, "
           f"{p['threads']} threads, medians of {p['reps']} runs"]
    bw, floor = p.get("bandwidth"), p.get("floor")
    if bw:
        out.append(f"memory bandwidth: read {bw['read_GBps']:.1f} GB/s (best {bw['read_GBps_best']:.1f}; sum over "
                   f"{bw['bytes'] / 2**30:.2f} GiB), copy {bw['copy_GBps']:.1f} GB/s (read + write bytes)")
        mem = p["memory"]["target"]
        out.append(f"physical floor: {_bytes(mem['weight_bytes_read_per_token'])} of weights per token / "
                   f"{bw['read_GBps']:.1f} GB/s = {floor['seconds_per_token'] * 1e3:.1f} ms per token "
                   f"({floor['tokens_per_s']:.0f} tok/s); measured 1-row pass at context {floor['context']}: "
                   f"{floor['measured_step_s'] * 1e3:.1f} ms ({floor['measured_over_floor']:.1f}x the floor)")
    ctxs = p["contexts"]
    out.append("verify cost T(n)/T(1) (ms per pass in brackets):")
    out.append("   n  " + "".join(f"{'context ' + str(e['context']):>20}" for e in ctxs))
    for n in ctxs[0]["verify_cost"]:
        out.append(f"{n:>4}  " + "".join(f"{e['verify_cost'][n]:>11.2f} ({e['times_s'][n] * 1e3:5.1f})"
                                         for e in ctxs))
    k = p["knee"]
    out.append("knee: " + "; ".join(f"context {e['context']}: first n > {k['threshold']}x = "
                                    f"{e['knee_threshold_rows'] or 'none'}, roofline fit {e['knee_roofline_rows']:.1f}"
                                    for e in ctxs))
    out.append(f"  rule - {k['rule']}")
    d = p["draft"]
    if d["kind"] == "ngram":
        out.append(f"draft cost c = {p['draft_cost']:.5f} target passes per drafted token: n-gram lookup "
                   f"{d['seconds_per_round'] * 1e6:.0f} us per round (k = {d['k']}, context {d['context']})")
    elif d["kind"] == "draft-model":
        out.append(f"draft cost c = {p['draft_cost']:.3f}: draft model 1-token pass {d['step_s'] * 1e3:.1f} ms "
                   f"vs target {p['step_s'] * 1e3:.1f} ms at context {d['context']}")
    else:
        out.append(f"draft cost c = {p['draft_cost']:g} (drafter {d['kind']})")
    mem = p.get("memory")
    if mem:
        t, dm = mem["target"], mem["draft"]
        out.append(f"memory: target weights {_bytes(t['resident_weight_bytes'])} resident "
                   f"({_bytes(t['weight_bytes_read_per_token'])} read per token), KV {_bytes(t['kv_bytes_per_token'])}"
                   " per context token")
        if dm:
            out.append(f"        draft weights {_bytes(dm['resident_weight_bytes'])}, KV "
                       f"{_bytes(dm['kv_bytes_per_token'])} per context token")
        else:
            out.append("        drafter: no weights; its n-gram index at most "
                       f"{_bytes(mem['drafter_bytes_per_token'])} per context token")
        out.append(f"  at a {mem['budget_bytes'] / 2**30:.1f} GiB budget, sequences of {mem['context']} tokens: "
                   f"{mem['sequences_without_drafter']} without the drafter, {mem['sequences_with_drafter']} with it "
                   f"({mem['sequences_lost']} lost, {_f(mem['share_lost'], 1, 100, '%')})")
    return "\n".join(out)
