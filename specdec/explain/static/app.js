/* The explainer page: sliders -> readout, maths, curve, batch panel; simulated rounds; trace replay. */
(function () {
  "use strict";
  const T = window.specdecTheory;
  const C = window.specdecCharts;
  const TR = window.specdecTrace;
  const $ = (id) => document.getElementById(id);
  const MAX_K = 20;
  const MAX_BATCH = 256;
  const REFERENCE = [0.9, 0.8, 0.6]; // acceptance rates of the dashed curves, all at c = 0.1

  const sliders = { a: $("alpha"), k: $("depth"), c: $("cost") };

  function settings() {
    return { a: parseFloat(sliders.a.value), k: parseInt(sliders.k.value, 10), c: parseFloat(sliders.c.value) };
  }

  const f2 = (x) => x.toFixed(2);
  const f3 = (x) => x.toFixed(3);

  // --- Readout and maths --------------------------------------------------------------------------------

  function verdict(s, p) {
    const cStar = p.max_useful_draft_cost;
    const where = "c = " + f2(s.c) + (s.c === cStar ? " equals" : " is above") + " the threshold c* = " + f3(cStar) +
      " for a = " + f2(s.a);
    if (s.c >= cStar) {
      return { ok: false, text: "No draft depth helps: " + where + ", so the speedup falls from the first drafted " +
        "token on. Turn speculation off (or find a cheaper drafter)." };
    }
    if (!p.beats_plain) {
      return { ok: false, text: "No draft depth helps: c = " + f2(s.c) + " is below c* = " + f3(cStar) +
        ", but even the best whole depth (k = " + p.best_k + ") gives only " + f2(p.best_speedup) + "x. Turn speculation off." };
    }
    return { ok: true, text: "Speculation pays: c = " + f2(s.c) + " is below c* = " + f3(cStar) + " for a = " + f2(s.a) +
      ". The best depth is k = " + p.best_k + "." };
  }

  function updateReadout(s, p) {
    const e = T.expectedTokens(s.a, s.k);
    const cost = 1 + s.k * s.c;
    const sp = e / cost;
    $("readout-expected").textContent = f3(e) + " tokens";
    $("readout-cost").textContent = f2(cost) + " (1 + " + s.k + " × " + f2(s.c) + ")";
    $("readout-speedup").textContent = T.describeSpeedup(sp);
    $("readout-speedup").className = sp >= 1 ? "good" : "bad";
    $("readout-best").textContent = "k = " + p.best_k + ": " + T.describeSpeedup(p.best_speedup);
    const v = verdict(s, p);
    $("readout-verdict").textContent = v.text;
    $("readout-verdict").className = "verdict " + (v.ok ? "good" : "bad");

    const worked = $("maths-expected");
    worked.textContent = s.a >= 1 ? "= k + 1 = " + (s.k + 1) : "= (1 − " + f2(s.a);
    if (s.a < 1) {
      worked.appendChild(document.createElement("sup")).textContent = String(s.k + 1);
      worked.appendChild(document.createTextNode(") / (1 − " + f2(s.a) + ") = " + f3(e)));
    }
    $("maths-speedup").textContent = "= " + f3(e) + " / (1 + " + s.k + " × " + f2(s.c) + ") = " + f3(e) + " / " +
      f2(cost) + " = " + f2(sp) + "x";
    const cStar = p.max_useful_draft_cost;
    $("maths-threshold").textContent = "c* = " + f3(cStar) + " at a = " + f2(s.a) + ": c = " + f2(s.c) +
      (s.c < cStar ? " < c*, so short drafts gain" : " ≥ c*, so every draft loses");
  }

  // --- Speedup curve ------------------------------------------------------------------------------------

  function drawCurve(s, p) {
    const refs = REFERENCE.map((a) => ({ a: a, plan: T.plan(a, 0.1, MAX_K) }));
    const top = Math.max(1.2, p.best_speedup, ...refs.map((r) => r.plan.best_speedup)) * 1.08;
    const ticks = [1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20];
    const f = C.frame($("curve"), { width: 640, height: 360, margin: { l: 56, r: 70, t: 16, b: 46 },
      x: { min: 1, max: MAX_K, ticks: ticks, label: "draft depth k" },
      y: { max: top, label: "speedup (× plain decoding)" } });
    C.shadeBelowOne(f, "slower than plain decoding");
    for (const r of refs) {
      const pts = r.plan.curve.map((row) => [row.k, row.speedup]);
      C.polyline(f, pts, "ref-curve");
      C.el("text", { x: f.box.r + 6, y: f.sy(pts[pts.length - 1][1]) + 4, class: "ref-label" }, f.plot, "a = " + r.a);
      C.el("circle", { cx: f.sx(r.plan.best_k), cy: f.sy(r.plan.best_speedup), r: 3, class: "ref-peak" }, f.plot);
      const near = Math.abs(r.plan.best_k - p.best_k) < 4 && Math.abs(f.sy(r.plan.best_speedup) - f.sy(p.best_speedup)) < 24;
      if (!near && f.yMax <= 6) { // skip when the current peak's label or the other peaks would crowd it
        C.el("text", { x: f.sx(r.plan.best_k), y: f.sy(r.plan.best_speedup) - 7, class: "ref-label",
          "text-anchor": "middle" }, f.plot, f2(r.plan.best_speedup) + "x");
      }
    }
    const pts = p.curve.map((row) => [row.k, row.speedup]);
    C.el("line", { x1: f.sx(s.k), x2: f.sx(s.k), y1: f.box.t, y2: f.box.b, class: "k-marker" }, f.plot);
    C.polyline(f, pts, "main-curve");
    for (const [k, y] of pts) C.el("circle", { cx: f.sx(k), cy: f.sy(y), r: 2.5, class: "main-dot" }, f.plot);
    const now = p.curve[s.k - 1];
    C.el("circle", { cx: f.sx(s.k), cy: f.sy(now.speedup), r: 6, class: "current-dot" }, f.plot);
    const bx = f.sx(p.best_k), by = f.sy(p.best_speedup);
    C.el("circle", { cx: bx, cy: by, r: 9, class: "peak-ring" }, f.plot);
    const right = p.best_k > 14;
    C.el("text", { x: bx + (right ? -12 : 12), y: Math.max(by - 12, f.box.t + 12), class: "peak-label",
      "text-anchor": right ? "end" : "start" }, f.plot, "peak: k = " + p.best_k + ", " + f2(p.best_speedup) + "x");
    C.el("text", { x: f.sx(s.k) + 4, y: f.box.t + 12, class: "k-label" }, f.plot, "k = " + s.k);
  }

  // --- Batch panel --------------------------------------------------------------------------------------

  function updateBatch(s) {
    const knee = parseFloat($("knee").value);
    const err = $("batch-error");
    if (!(knee > 0) || !isFinite(knee)) {
      err.textContent = "The knee must be a number of token-rows above 0.";
      err.hidden = false;
      return;
    }
    err.hidden = true;
    const m = T.batchModel(s.a, s.k, s.c, knee, MAX_BATCH);
    $("batch-ratio-1").textContent = T.describeSpeedup(m.ratio_at_batch_1);
    $("batch-ratio-max").textContent = T.describeSpeedup(m.ratio_at_max_batch);
    $("batch-crossover").textContent = m.crossover_batch === null
      ? "none: speculation pays at every batch up to " + MAX_BATCH
      : "batch " + m.crossover_batch + ": from there on speculation is slower";
    const top = Math.max(1.2, ...m.curve.map((r) => r.ratio)) * 1.08;
    const f = C.frame($("batch-chart"), { width: 640, height: 320, margin: { l: 56, r: 20, t: 16, b: 46 },
      x: { min: 1, max: MAX_BATCH, log2: true, ticks: [1, 2, 4, 8, 16, 32, 64, 128, 256], label: "batch size (sequences)" },
      y: { max: top, label: "throughput, spec / plain" } });
    C.shadeBelowOne(f, "speculation slower");
    C.polyline(f, m.curve.map((r) => [r.batch, r.ratio]), "main-curve");
    if (m.crossover_batch !== null) {
      const x = f.sx(m.crossover_batch);
      C.el("line", { x1: x, x2: x, y1: f.box.t, y2: f.box.b, class: "cross-marker" }, f.plot);
      C.el("circle", { cx: x, cy: f.sy(m.curve[m.crossover_batch - 1].ratio), r: 5, class: "cross-dot" }, f.plot);
      const left = m.crossover_batch > 64;
      C.el("text", { x: x + (left ? -6 : 6), y: f.box.t + 14, class: "peak-label", "text-anchor": left ? "end" : "start" },
        f.plot, "crossover: batch " + m.crossover_batch);
    }
  }

  // --- One round, and many ------------------------------------------------------------------------------

  const DRAFT = ("the cat sat on the warm mat and then it slowly fell asleep in the late afternoon sun while rain " +
    "fell").split(" ");
  const TARGET = "a dog lay by a soft rug but soon she quickly drifted off under that early morning light as snow".split(" ");

  function mulberry32(seed) { // small seeded PRNG: the same clicks give the same rounds
    return function () {
      seed = (seed + 0x6d2b79f5) | 0;
      let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }
  const rng = mulberry32(20240611);

  /** Drafted positions survive with probability a each, until the first rejection. Returns the accepted count. */
  function simulateRound(a, k) {
    let accepted = 0;
    while (accepted < k && rng() < a) accepted++;
    return accepted;
  }

  function discardNote(n) {
    return n === 0 ? "" : n === 1 ? "; the draft after it is thrown away" : "; the " + n + " drafts after it are thrown away";
  }

  function drawRound(s, accepted) {
    const box = $("round");
    box.textContent = "";
    const add = (parent, tag, cls, text) => {
      const n = document.createElement(tag);
      n.className = cls;
      if (text !== undefined) n.textContent = text;
      parent.appendChild(n);
      return n;
    };
    for (let j = 0; j < s.k; j++) {
      const col = add(box, "div", "pos");
      add(col, "div", "pos-index", "draft " + (j + 1));
      let cls = "drafted", status = "survives w.p. " + f2(s.a);
      if (accepted !== null) {
        if (j < accepted) { cls = "accepted"; status = "✓ accepted"; }
        else if (j === accepted) { cls = "rejected"; status = "✗ rejected"; }
        else { cls = "discarded"; status = "discarded"; }
      }
      add(col, "div", "tok " + cls, DRAFT[j]);
      if (accepted !== null && j === accepted) add(col, "div", "tok recovered", TARGET[j]);
      add(col, "div", "pos-status", status);
    }
    if (accepted === s.k) {
      const col = add(box, "div", "pos");
      add(col, "div", "pos-index", "target");
      add(col, "div", "tok bonus", DRAFT[s.k]);
      add(col, "div", "pos-status", "+ bonus");
    }
    $("round-caption").textContent = accepted === null
      ? s.k + " drafted tokens wait for one verification pass. Press “Run one round”."
      : accepted === s.k
        ? "All " + s.k + " drafts survived (chance a\u1d4f = " + f3(Math.pow(s.a, s.k)) + "): " + s.k + " + 1 bonus = " +
          (s.k + 1) + " tokens for one target pass."
        : accepted + " accepted, then the target replaced draft " + (accepted + 1) + " with its own token: " +
          (accepted + 1) + " token" + (accepted ? "s" : "") + " this round" + discardNote(s.k - accepted - 1) + ".";
  }

  function runMany(s, n) {
    const counts = new Array(s.k + 2).fill(0);
    let sum = 0, sumSq = 0;
    for (let i = 0; i < n; i++) {
      const y = simulateRound(s.a, s.k) + 1;
      counts[y]++;
      sum += y;
      sumSq += y * y;
    }
    const mean = sum / n;
    const se = Math.sqrt(Math.max(0, (sumSq - n * mean * mean) / (n - 1)) / n);
    const e = T.expectedTokens(s.a, s.k);
    $("sim").hidden = false;
    $("sim-rounds").textContent = String(n);
    $("sim-mean").textContent = f3(mean);
    $("sim-expected").textContent = f3(e);
    $("sim-se").textContent = "± " + f3(se);
    $("sim-diff").textContent = (mean >= e ? "+" : "−") + f3(Math.abs(mean - e)) +
      (se > 0 ? " (" + f2(Math.abs(mean - e) / se) + " SE)" : "");
    drawHistogram(s, counts.slice(1), n);
  }

  function drawHistogram(s, counts, n) {
    const expected = T.yieldDistribution(s.a, s.k);
    const top = Math.max(0.05, ...counts.map((x) => x / n), ...expected) * 1.1;
    const step = s.k > 10 ? 2 : 1;
    const ticks = [];
    for (let j = 1; j <= s.k + 1; j += step) ticks.push(j);
    const f = C.frame($("sim-hist"), { width: 520, height: 220, margin: { l: 52, r: 12, t: 12, b: 42 },
      x: { min: 0.5, max: s.k + 1.5, ticks: ticks, label: "tokens in the round" },
      y: { max: top, count: 4, label: "share of rounds" } });
    const w = (f.sx(2) - f.sx(1)) * 0.7;
    counts.forEach((cnt, i) => {
      const y = f.sy(cnt / n);
      C.el("rect", { x: f.sx(i + 1) - w / 2, y: y, width: w, height: f.box.b - y, class: "bar" }, f.plot);
      C.el("line", { x1: f.sx(i + 1) - w / 2, x2: f.sx(i + 1) + w / 2, y1: f.sy(expected[i]), y2: f.sy(expected[i]),
        class: "expected-tick" }, f.plot);
    });
    C.el("text", { x: f.box.r - 4, y: f.box.t + 12, class: "ref-label", "text-anchor": "end" }, f.plot,
      "bars: measured · lines: formula");
  }

  // --- Trace --------------------------------------------------------------------------------------------

  const traceView = new TR.TraceView($("trace-text"), $("trace-progress"), $("trace-play"));
  let traceStats = null;

  function showTraceError(name, message) {
    traceView.stop();
    traceStats = null;
    $("trace-view").hidden = true;
    $("trace-error").textContent = "Could not load " + name + ": " + message;
    $("trace-error").hidden = false;
  }

  function showTrace(trace) {
    const st = TR.traceStats(trace);
    traceStats = { alpha: st.alpha, k: trace.k };
    $("trace-error").hidden = true;
    $("trace-view").hidden = false;
    $("trace-meta").textContent = [trace.model && "model " + trace.model, trace.drafter && "drafter " + trace.drafter,
      "k = " + trace.k, typeof trace.temperature === "number" && "temperature " + trace.temperature]
      .filter(Boolean).join(" · ");
    $("trace-rounds").textContent = String(st.rounds);
    $("trace-tokens").textContent = String(st.tokens);
    $("trace-accepted").textContent = String(st.accepted);
    $("trace-recovered").textContent = String(st.recovered);
    $("trace-bonus").textContent = String(st.bonus);
    $("trace-alpha").textContent = st.alpha === null ? "n/a (nothing drafted)"
      : f3(st.alpha) + " (" + st.accepted + " of " + st.drafted + " drafted)";
    $("trace-mean").textContent = f3(st.meanTokens);
    $("trace-formula").textContent = st.alpha === null ? "n/a"
      : f3(T.expectedTokens(st.alpha, trace.k)) + "  (E at the measured a and k = " + trace.k + ")";
    $("trace-note").textContent = st.shortRounds
      ? st.shortRounds + " of " + st.rounds + " rounds drafted fewer than k tokens, so the measured tokens per round " +
        "can fall short of the formula, which assumes k drafts every round."
      : "";
    traceView.load(trace);
  }

  $("trace-file").addEventListener("change", (ev) => {
    const file = ev.target.files && ev.target.files[0];
    if (!file) return;
    file.text().then((text) => {
      let trace;
      try {
        trace = TR.parseTrace(text);
      } catch (e) {
        return showTraceError(file.name, e.message);
      }
      showTrace(trace);
    }).catch((e) => showTraceError(file.name, "the file could not be read (" + e.message + ")"));
  });
  $("trace-play").addEventListener("click", () => traceView.togglePlay());
  $("trace-step").addEventListener("click", () => traceView.step());
  $("trace-all").addEventListener("click", () => { traceView.stop(); traceView.show(traceView.nodes.length); });
  $("trace-use").addEventListener("click", () => {
    if (!traceStats || traceStats.alpha === null) return;
    sliders.a.value = traceStats.alpha.toFixed(2);
    sliders.k.value = String(Math.min(MAX_K, Math.max(1, traceStats.k)));
    update();
  });

  // --- Wiring -------------------------------------------------------------------------------------------

  function update() {
    const s = settings();
    $("alpha-value").textContent = f2(s.a);
    $("depth-value").textContent = String(s.k);
    $("cost-value").textContent = f2(s.c);
    const p = T.plan(s.a, s.c, MAX_K);
    updateReadout(s, p);
    drawCurve(s, p);
    updateBatch(s);
    drawRound(s, null);
    $("sim").hidden = true; // results for other settings would mislead
  }

  for (const key in sliders) sliders[key].addEventListener("input", update);
  $("knee").addEventListener("input", () => updateBatch(settings()));
  $("run-one").addEventListener("click", () => {
    const s = settings();
    drawRound(s, simulateRound(s.a, s.k));
  });
  $("run-many").addEventListener("click", () => runMany(settings(), 1000));

  update();
  const s0 = settings();
  drawRound(s0, simulateRound(s0.a, s0.k));
})();
