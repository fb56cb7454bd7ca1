"""The one renderer of measurements: Markdown tables and their cell formats, the PNG plots (through one pyplot
helper, specdec.theory.plots.pyplot), for the local bench, the endpoint bench, `loadtest` and `profile`."""

from __future__ import annotations

from specdec.bench import stats
from specdec.bench.records import OVERALL, BenchReport
from specdec.bench.tables import num, signed_pct, speedup, table
from specdec.theory.plots import pyplot, save


def leaderboard(report: BenchReport) -> str:
    """Spec-Bench's leaderboard: a row per speculative method, speedup per category, overall, and the mean
    accepted tokens per target pass."""
    cats = report.categories
    rows = []
    for m in report.methods:
        if not m["baseline"]:
            continue
        r = report.results[m["name"]]
        rows.append([m["name"]] + [speedup(r.categories[c].speedup if c in r.categories else None) for c in cats]
                    + [speedup(r.overall.speedup), num(r.overall.tokens_per_pass)])
    return table(["Method"] + cats + ["Overall", "Mean accepted tokens"], rows)


def foreign(report: BenchReport) -> set[str]:
    """Methods measured against a baseline of another implementation (llama.cpp against our plain): their output
    comes from other arithmetic, so its identity with the baseline's is information, not a check."""
    family = {m["name"]: m["family"] for m in report.methods}
    return {m["name"] for m in report.methods if m["baseline"] and family.get(m["baseline"]) != m["family"]}


def details(report: BenchReport) -> str:
    per = "tokens/chunk" if report.endpoint else "tokens/pass"
    other = foreign(report)
    header = ["Method", "Category", "baseline tok/s", "tok/s", "speedup", "decode speedup", "robust", "predicted",
              "error", "iid-a predicted", per, "a", "a_i (i=1..4)", "TTFT ms", "ITL p50 ms", "ITL p99 ms",
              "burst", "identical"]
    rows = []
    for m in report.methods:
        r = report.results[m["name"]]
        for g, v in list(r.categories.items()) + [(OVERALL, r.overall)]:
            p = report.prediction(v)
            a_pos = ", ".join(num(a) for a in v.acceptance_by_position[:4]) or "-"
            rows.append([m["name"], g, num(v.baseline_tokens_per_s, 1), num(v.tokens_per_s, 1), speedup(v.speedup),
                         speedup(v.decode_speedup), speedup(v.robust_speedup), speedup(p and p.speedup),
                         signed_pct(p and p.error), speedup(p and p.speedup_iid), num(v.tokens_per_pass),
                         num(v.alpha), a_pos,
                         num(v.ttft_s, 0, 1000), num(v.itl_p50_s, 1, 1000), num(v.itl_p99_s, 1, 1000),
                         num(v.burst_share, 0, 100, "%"),
                         f"({num(v.identical_rate, 0, 100, '%')})" if m["name"] in other
                         else num(v.identical_rate, 0, 100, "%")])
    return table(header, rows)


def _auto_section(report: BenchReport) -> list[str]:
    rows = [[g, speedup(v.get("auto")), f"k={v.get('best_fixed_k')}: {speedup(v.get('best_fixed'))}",
             signed_pct(v.get("gain_vs_best")), speedup(v.get("default")), signed_pct(v.get("gain_vs_default"))]
            for g, v in report.auto_k.items() if v]
    header = ["Category", "auto", "best fixed k", "auto vs best", f"default k={report.config.get('default_k')}",
              "auto vs default"]
    return ["", "## Auto k", "", "k chosen each round from the request's running a (Beta prior) and the "
            "profile's cost curve, against fixed k on the same prompts.", "", table(header, rows)]


def _hf_section(report: BenchReport) -> list[str]:
    hf = report.hf
    cols = list(hf[OVERALL])
    rows = [[g] + [speedup(hf[g][c]) for c in cols] for g in report.categories + [OVERALL]]
    return ["", "## Against Hugging Face transformers generate (fp32, same weights)", "",
            "Ratios of mean tokens/s on the same prompts.", "", table(["Category"] + cols, rows), "",
            "Hugging Face plain greedy output identical to ours: "
            f"{num(hf['hf_plain_identical_to_ours'], 0, 100, '%')} of prompts "
            f"(ours runs {report.config['precision']} weights)."]


def _llamacpp_section(report: BenchReport) -> list[str]:
    lc, info = report.llamacpp, report.config.get("llamacpp") or {}
    rows = [[n, num(v["tokens_per_s"], 1), num(v["decode_tokens_per_s"], 1), num(v["ttft_s"], 0, 1000),
             speedup(v["speedup"]), speedup(v["decode_speedup"])] for n, v in lc["methods"].items()]
    own = "; ".join(f"{name}: " + ", ".join(f"{g} {speedup(r)}" for g, r in by_group.items())
                    for name, by_group in lc["lookup_over_llamacpp_plain"].items())
    same = ", ".join(f"{name}'s equals llama.cpp plain's on {num(v, 0, 100, '%')}"
                     for name, v in lc["lookup_identical_to_llamacpp_plain"].items())
    return ["", f"## Against llama.cpp (node-llama-cpp {info.get('node_llama_cpp', '?')}, llama.cpp "
            f"{info.get('llama_cpp', '?')}, CPU, the same GGUF file)", "",
            f"{info.get('gguf', '?')} ({info.get('type', '?')}) on {info.get('threads', '?')} threads, given our "
            "prompt token ids, greedy, in the same run as ours (alternating per prompt), each request from an "
            f"empty KV cache. Its prompt lookup drafts up to k={info.get('k', '?')} tokens copied from the prompt "
            f"after the longest match of {info.get('ngram_min', '?')}..{info.get('ngram_max', '?')} tokens (ours "
            "also matches in the generated text). All prompts; speedups over our plain, ratios of means on the "
            "same prompts:", "",
            table(["Method", "tok/s", "decode tok/s", "TTFT ms", "speedup", "decode speedup"], rows), "",
            f"llama.cpp's prompt lookup over llama.cpp plain: {own or '-'}.", "",
            f"Identity is not a check here: llama.cpp computes with its own kernels on the GGUF's weights as "
            f"stored, ours with {report.config['precision']} weights, so equal output is not expected and a "
            "difference is no failure of either. llama.cpp plain's output equals our plain's on "
            f"{num(lc['plain_identical_to_ours'], 0, 100, '%')} of prompts" + (f"; {same}." if same else ".")]


def checks_section(report: BenchReport) -> list[str]:
    out = ["", "## Checks", ""]
    step = "time per output token" if report.endpoint else "decode step"
    for name, tm in report.timing.items():
        if tm:
            slow = tm["slow_qids"]
            out.append(f"- timing, {name}: {step} median {tm['median_step_s'] * 1e3:.1f} ms; {len(slow)} of "
                       f"{tm['prompts']} prompts ran more than {tm['factor']}x slower" + (
                           f" (questions {', '.join(slow)}: was the machine busy? their speedups are suspect)"
                           if slow else ""))
    for name, r in report.results.items():
        if r.overall.timing_suspect:
            out.append(f"- timing, {name}: on questions {', '.join(r.overall.timing_suspect)} it or its "
                       f"baseline took more than {stats.DISTURBED}x its robust decode time (something else ran); "
                       "their measured speedups are suspect, see the robust column")
    for name, d in report.drift.items():
        flagged = ", ".join(f"{g['category']} ({g['alpha']:.2f}, {g['delta']:+.2f})" for g in d["flagged"])
        meter = report.meters.get(name)
        source = (f" (the engine's meter, warm-up included: a = {num(meter['alpha'], 3)}, EMA {num(meter['ema'], 3)})"
                  if meter else "")
        out.append(f"- acceptance drift, {name}: overall a = {d['overall_alpha']:.3f}{source}; "
                   f"categories beyond +/-{d['margin']:.2f}: {flagged or 'none'}")
    other = foreign(report)  # another implementation's output: in its own section, not a failure of ours
    for n, r in report.results.items():
        if n in other:
            continue
        for m in r.overall.mismatches:
            gap = f", target logit gap top1 - top2 = {m['logit_gap']:.4f}" if "logit_gap" in m else ""
            what = "character" if report.endpoint else "token"
            out.append(f"- output differs, {n}: question {m['qid']}, turn {m['turn'] + 1}, {what} {m['position']}: "
                       f"{m['token']!r} instead of {m['baseline_token']!r}{gap}")
    return out


def prediction_errors(report: BenchReport) -> list[str]:
    """One line per method: the prediction's error overall and its mean absolute error over categories."""
    out = []
    for name, r in report.results.items():
        p = report.prediction(r.overall)
        if p is None or p.error is None:
            continue
        parts = []
        for label, attr in (("conditional a_i", "error"), ("iid a", "error_iid")):
            errs = [abs(getattr(q, attr)) for q in map(report.prediction, r.categories.values())
                    if q is not None and getattr(q, attr) is not None]
            parts.append(f"{label}: overall {signed_pct(getattr(p, attr))}, mean |error| over categories "
                         f"{num(stats.mean(errs), 1, 100, '%')}")
        robust = r.overall.robust_speedup
        vs_robust = f"; against the robust speedup: {signed_pct(p.speedup / robust - 1)}" if robust else ""
        out.append(f"- prediction error, {name}: " + "; ".join(parts) + vs_robust)
    return out


def markdown(report: BenchReport) -> str:
    """The local bench's report. An endpoint report has a layout of its own: specdec.bench.serving.endpoint_report."""
    if report.endpoint:
        raise ValueError("an endpoint report: render it with specdec.bench.serving.endpoint_report.markdown")
    cfg = report.config
    out = [f"# specdec bench: {cfg['model']} ({cfg['precision']}{kv_note(cfg)}), drafter {cfg['drafter']}, "
           f"{cfg['max_new_tokens']} new tokens, greedy, batch 1",
           "", f"{cfg['prompts']} prompts from {cfg['prompt_file']}; plain and speculative decoding alternate "
           "on each prompt. Speedup = mean tokens/s over mean plain tokens/s on the same prompts (prefill "
           "included).", "", "## Speedup (Spec-Bench layout)", "", leaderboard(report), "",
           "## Details", "", f"Predicted: from {report.prediction_costs}, the category's measured conditional "
           "acceptance a_i = P(accept i | accepted < i) and draft-length distribution. iid-a: the same costs "
           "with one acceptance rate a. Robust: the same speedup with every round's duration replaced by the median "
           "of its turn's rounds of the same draft length (insensitive to bursts of load from other processes). "
           "ITL: gaps between consecutive tokens (0 inside a burst); burst: share of tokens that arrived with others "
           "in one round." + (" Identical in brackets: another implementation's output against ours, informative "
                              "only (different arithmetic)." if foreign(report) else ""),
           "", details(report), ""] + prediction_errors(report)
    if report.auto_k:
        out += _auto_section(report)
    if report.hf:
        out += _hf_section(report)
    if report.llamacpp:
        out += _llamacpp_section(report)
    return "\n".join(out + checks_section(report)) + "\n"


def plot(report: BenchReport, path, title: str | None = None) -> None:
    """Measured speedup per category (bars, one per speculative method) with the predicted speedups (markers)."""
    plt = pyplot()
    groups = report.categories + [OVERALL]
    spec = [m["name"] for m in report.methods if m["baseline"]]
    base = {m["name"]: m["baseline"] for m in report.methods}
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(groups) * max(1, len(spec)) ** 0.5), 4.5), dpi=110)
    width = 0.8 / max(1, len(spec))
    for j, name in enumerate(spec):
        r = report.results[name]
        vals = [r.group(g) for g in groups]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
        label = name if base[name] == "plain" else f"{name} (vs {base[name]})"
        ax.bar(xs, [(v.speedup or 0) if v else 0 for v in vals], width, label=label)
        preds = [(px, p.speedup) for px, p in zip(xs, (report.prediction(v) if v else None for v in vals))
                 if p is not None and p.speedup is not None]
        if preds:
            ax.plot(*zip(*preds), "kD", ms=5, label="predicted" if j == 0 else None)
    ax.axhline(1.0, color="tab:red", lw=0.8, ls="--", label="baseline")
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_xlabel("category")
    ax.set_ylabel("speedup over its baseline (x)")
    ax.set_title(title or f"specdec bench: {report.config['model']}, drafter {report.config['drafter']}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    save(fig, path)


def _bytes(n) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"


def kv_note(record: dict) -> str:
    """", KV cache q8_0" for a run on a KV cache type other than f16 (runs before there were types lack the field)."""
    kv = record.get("kv_cache")
    return f", KV cache {kv}" if kv not in (None, "f16") else ""


def render_profile(p: dict) -> str:
    """The profile as text for people (the JSON holds the same and more)."""
    out = [f"profile: {p['model']} ({p['backend']}, {p['precision']}{kv_note(p)}), drafter {p['drafter']}, "
           f"{p['threads']} threads, medians of {p['reps']} runs"]
    bw, floor = p.get("bandwidth"), p.get("floor")
    if bw:
        stream = (f"; the kernels' threads stream it at {bw['stream_GBps']:.1f} GB/s" if "stream_GBps" in bw
                  else "")
        out.append(f"memory bandwidth: read {bw['read_GBps']:.1f} GB/s (best {bw['read_GBps_best']:.1f}; sum over "
                   f"{bw['bytes'] / 2**30:.2f} GiB{stream}), copy {bw['copy_GBps']:.1f} GB/s (read + write bytes)")
        mem = p["memory"]["target"]
        out.append(f"physical floor: {_bytes(mem['weight_bytes_read_per_token'])} of weights per token / "
                   f"{floor.get('bandwidth_GBps', bw['read_GBps']):.1f} GB/s = "
                   f"{floor['seconds_per_token'] * 1e3:.1f} ms per token "
                   f"({floor['tokens_per_s']:.0f} tok/s); measured 1-row pass at context {floor['context']}: "
                   f"{floor['measured_step_s'] * 1e3:.1f} ms ({floor['measured_over_floor']:.1f}x the floor)")
    cf = p.get("compute_floor")
    if cf:
        out.append(f"compute floor: {cf['macs_per_token'] / 1e6:.0f} M multiply-adds per token / "
                   f"{cf['macs_per_s'] / 1e9:.0f} G per s ({cf['arithmetic']}, all threads) = "
                   f"{cf['seconds_per_token'] * 1e3:.1f} ms per token; the memory floor "
                   f"{'binds' if floor['seconds_per_token'] >= cf['seconds_per_token'] else 'does not bind'}")
    pr = p.get("prompt")
    if pr:
        out.append(f"prompt of {pr['tokens']} tokens: prefill {pr['prefill_s']:.2f} s, {pr['over_floor']:.2f}x its "
                   f"floor {pr['floor_s']:.2f} s (products {pr['products_s']:.2f} s at "
                   f"{pr['products_rate'] / 1e9:.0f} G/s, "
                   f"attention {pr['attention_s']:.2f} s at {pr['attention_rate'] / 1e9:.0f} G/s: "
                   f"{pr['attention_arithmetic']})")
        if "kept_ceiling" in pr:
            out.append(f"  at the memory floor, decoding after it keeps at most {pr['kept_ceiling']:.0%} of its speed "
                       "with nothing cached: "
                       f"a pass reads {_bytes(pr['weight_bytes'])} of weights and {_bytes(pr['kv_bytes_per_position'])}"
                       f" a position of {pr['kv_cache']} cache, {_bytes(pr['kv_bytes_per_position'] * pr['tokens'])} "
                       "here" + ("; --kv-cache q8_0 or q4_0 reads fewer" if pr["kv_cache"] == "f16" else ""))
    ctxs = p["contexts"]
    floors = all("floor_s" in e for e in ctxs)
    out.append("verify cost T(n)/T(1) (ms per pass in brackets" +
               ("; then the floor for n rows in ms, and the pass over it" if floors else "") + "):")
    width = 36 if floors else 20
    out.append("   n  " + "".join(f"{'context ' + str(e['context']):>{width}}" for e in ctxs))
    for n in ctxs[0]["verify_cost"]:
        out.append(f"{n:>4}  " + "".join(
            f"{e['verify_cost'][n]:>11.2f} ({e['times_s'][n] * 1e3:5.1f})" +
            (f"  floor {e['floor_s'][n] * 1e3:5.1f} {e['over_floor'][n]:4.2f}x" if floors else "") for e in ctxs))
    if floors:
        out.append(f"  floor - {ctxs[0]['floor_rule']}")
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
                   f"({mem['sequences_lost']} lost, {num(mem['share_lost'], 1, 100, '%')})")
    return "\n".join(out)
