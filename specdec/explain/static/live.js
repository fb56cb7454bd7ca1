/* The live view: when `specdec serve` serves this page, its own measurements (GET /live, specdec/serve/live.py),
 * read about once a second, beside what the theory predicts from them.
 *
 * Opened as a file, or from `specdec explain` (Python's http.server), there is no /live: the section stays hidden
 * and nothing is asked (a 404 would be logged in the console). A server with --api-key answers 401: the page then
 * asks for the key, keeps it in sessionStorage (this tab only) and sends it as a Bearer header.
 *
 * Every number is written as text (textContent): counts as plain integers, rates with 3 decimals, the two ratios
 * with 3 significant digits; "-" where the server has no value yet.
 */
(function () {
  "use strict";
  const T = window.specdecTheory;
  const C = window.specdecCharts;
  const $ = (id) => document.getElementById(id);
  const PERIOD_MS = 1000; // between polls while the server answers
  const RETRY_MS = 5000; // after a poll that failed (server restarting, network down)
  const KEY_STORE = "specdec-live-key";

  const section = $("live");
  let state = "probing"; // probing | off (no /live here) | key (waiting for a key) | on | lost (stopped answering)
  let timer = null;
  let inFlight = false;
  let polls = 0;

  function setState(s) {
    state = s;
    section.dataset.state = s;
  }

  // --- Formatting: one function per kind of number --------------------------------------------------------

  const known = (x) => typeof x === "number" && isFinite(x);
  const int = (x) => (known(x) ? String(Math.round(x)) : "-");
  const rate = (x) => (known(x) ? x.toFixed(3) : "-");
  const sig3 = (x) => (known(x) ? x.toPrecision(3) : "-");
  const fixed = (x, digits) => (known(x) ? x.toFixed(digits) : "-");
  const ms = (seconds) => (known(seconds) ? (seconds * 1000).toFixed(2) : "-");

  function put(id, text) {
    $(id).textContent = text;
  }

  /** obj.a.b.c, or null where any step is missing: an older server may not send every field. */
  function get(obj, path) {
    let v = obj;
    for (const key of path.split(".")) {
      if (v === null || typeof v !== "object" || !(key in v)) return null;
      v = v[key];
    }
    return v;
  }

  // --- The API key ----------------------------------------------------------------------------------------

  /** The key this tab was given, kept in sessionStorage across reloads where the browser allows it. */
  let apiKey = (() => {
    try {
      return sessionStorage.getItem(KEY_STORE) || "";
    } catch (e) {
      return ""; // storage refused (privacy settings): the key lives in this variable only
    }
  })();

  function setKey(key) {
    apiKey = key;
    try {
      if (key) sessionStorage.setItem(KEY_STORE, key);
      else sessionStorage.removeItem(KEY_STORE);
    } catch (e) { /* see above */ }
  }

  function askForKey(message) {
    setState("key");
    section.hidden = false;
    $("live-body").hidden = true;
    $("live-key-form").hidden = false;
    $("live-key-error").textContent = message;
    $("live-key-error").hidden = !message;
    put("live-status", "waiting for the API key");
  }

  $("live-key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("live-key").value.trim();
    if (!/^[\x21-\x7e]+$/.test(key)) { // an HTTP header carries visible ASCII only
      $("live-key-error").textContent = "An API key is one word of visible ASCII characters.";
      $("live-key-error").hidden = false;
      return;
    }
    setKey(key);
    $("live-key").value = "";
    $("live-key-error").hidden = true;
    poll();
  });

  // --- Polling --------------------------------------------------------------------------------------------

  /** Whether the server that sent this page keeps live measurements: `specdec serve` says so in a header on
   * the page itself (a file, `specdec explain`'s static server or any other host does not). */
  function mayHaveLive() {
    if (location.protocol !== "http:" && location.protocol !== "https:") return Promise.resolve(false);
    return fetch(location.href, { cache: "no-store" }).then(
      (r) => r.headers.get("x-specdec-live") === "live",
      () => false);
  }

  function schedule(delay) {
    clearTimeout(timer);
    timer = document.hidden ? null : setTimeout(poll, delay); // a hidden tab polls again when shown
  }

  function poll() {
    timer = null;
    if (inFlight) return;
    inFlight = true;
    const key = apiKey;
    fetch("live", { cache: "no-store", headers: key ? { Authorization: "Bearer " + key } : {} })
      .then((r) => answered(r, key), failed)
      .finally(() => { inFlight = false; });
  }

  function answered(r, key) {
    if (r.status === 401) {
      setKey("");
      return askForKey(key ? "The server refused this key." : "");
    }
    if (r.status === 404) return off(); // this server keeps no live measurements
    if (!r.ok) return failed();
    return r.json().then(show, () => failed());
  }

  function off() {
    clearTimeout(timer);
    timer = null;
    setState("off");
    section.hidden = true;
  }

  function failed() {
    if (state === "probing") return off(); // never answered: nothing to show
    if (state === "key") { // the key's first try: the form stays
      $("live-key-error").textContent = "The server did not answer; try again.";
      $("live-key-error").hidden = false;
      return;
    }
    setState("lost");
    put("live-status", "the server is not answering; the numbers below are from its last answer");
    schedule(RETRY_MS);
  }

  function show(d) {
    setState("on");
    section.hidden = false;
    $("live-key-form").hidden = true;
    $("live-body").hidden = false;
    render(d);
    polls++;
    section.dataset.polls = String(polls);
    put("live-status", "updated " + new Date((known(d.time) ? d.time * 1000 : Date.now())).toLocaleTimeString());
    schedule(PERIOD_MS);
  }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      clearTimeout(timer);
      timer = null;
    } else if ((state === "on" || state === "lost") && timer === null) {
      poll();
    }
  });

  // --- Rendering ------------------------------------------------------------------------------------------

  function render(d) {
    put("live-model", get(d, "server.model") || "-");
    put("live-drafter", get(d, "server.drafter") || "-");
    put("live-policy", get(d, "server.policy") || "-");
    put("live-max-k", int(get(d, "server.max_k")));
    put("live-uptime", int(get(d, "uptime_s")));
    renderTotals(d);
    renderTheory(get(d, "recent") || {});
    drawCost(get(d, "cost") || {});
    renderAcceptance(get(d, "acceptance") || {});
    renderPolicy(get(d, "rounds") || {});
    for (const name of ["ttft", "itl"]) {
      const p = get(d, "latency." + name + "_s") || {};
      for (const q of ["p50", "p90", "p99"]) put("live-" + name + "-" + q, ms(p[q]));
      put("live-" + name + "-count", int(p.count));
    }
  }

  function renderTotals(d) {
    put("live-generated", int(get(d, "tokens.generated")));
    put("live-drafted", int(get(d, "acceptance.drafted")));
    put("live-accepted", int(get(d, "acceptance.accepted")));
    put("live-rate", rate(get(d, "acceptance.rate")));
    put("live-throughput", fixed(get(d, "recent.throughput_tok_s"), 1));
    put("live-running", int(get(d, "requests.running")));
    put("live-waiting", int(get(d, "requests.waiting")));
    for (const reason of ["stop", "length", "abort"]) {
      put("live-finished-" + reason, int(get(d, "requests.finished." + reason)));
    }
  }

  /** The theory's throughput ratio at the measured a, k, c, batch and knee; null while any of them is unknown. */
  function predicted(r) {
    const args = [r.a, r.k_theory, r.c, r.batch_theory, r.knee_rows];
    return args.every(known) ? T.batchRatio(...args) : null;
  }

  function renderTheory(r) {
    const x = known(r.paying) ? r.paying : null;
    put("live-paying", sig3(x));
    put("live-predicted", sig3(predicted(r)));
    put("live-a", rate(r.a));
    put("live-k-theory", int(r.k_theory));
    put("live-c", rate(r.c));
    put("live-batch-theory", int(r.batch_theory));
    put("live-knee", fixed(r.knee_rows, 2));
    $("live-verdict").className = "verdict" + (x === null ? "" : x >= 1 ? " good" : " bad");
  }

  function renderAcceptance(a) {
    const positions = Array.isArray(a.per_position) ? a.per_position : [];
    const body = $("live-positions");
    if (body.rows.length !== positions.length) buildPositionRows(body, positions.length);
    positions.forEach((p, i) => {
      put("live-pos-" + i + "-rate", rate(p.rate));
      put("live-pos-" + i + "-recent", rate(p.recent_rate));
      put("live-pos-" + i + "-judged", int(p.judged));
      put("live-pos-" + i + "-accepted", int(p.accepted));
      $("live-pos-" + i + "-bar").style.width = (known(p.rate) ? Math.round(p.rate * 100) : 0) + "%";
    });
    put("live-rate-ema", rate(a.rate_ema));
    put("live-drift", known(a.drift) ? (a.drift >= 0 ? "+" : "") + a.drift.toFixed(3) : "-");
  }

  /** One row per draft position: its number, rate since start (and a bar of it), last minute, judged, accepted. */
  function buildPositionRows(body, n) {
    while (body.firstChild) body.removeChild(body.firstChild);
    for (let i = 0; i < n; i++) {
      const tr = body.insertRow();
      const cell = (name) => { tr.insertCell().id = "live-pos-" + i + "-" + name; };
      tr.insertCell().textContent = String(i + 1);
      cell("rate");
      const barCell = tr.insertCell();
      barCell.className = "bar-cell";
      const track = barCell.appendChild(document.createElement("span"));
      track.className = "live-bar";
      track.appendChild(document.createElement("span")).id = "live-pos-" + i + "-bar";
      cell("recent");
      cell("judged");
      cell("accepted");
    }
  }

  function renderPolicy(r) {
    const last = r.last || {};
    put("live-last-k", Array.isArray(last.k) && last.k.length ? last.k.map(int).join(" ") : "-");
    put("live-last-speculating", int(last.speculating));
    put("live-last-plain", int(last.plain));
    put("live-expected-tok-s", fixed(last.expected_tok_s, 1));
    put("live-measured-tok-s", fixed(last.measured_tok_s, 1));
    put("live-tokens-per-round", rate(r.tokens_per_round));
    put("live-rounds", int(r.count));
  }

  /** Seconds of a target pass by its token-rows: measured dots, the theory's line, the policy's dashed curve. */
  function drawCost(cost) {
    const svg = $("live-cost");
    const usable = (list) => (Array.isArray(list) ? list : []).filter((p) => known(p.rows) && known(p.seconds));
    const measured = usable(cost.measured);
    const policy = usable(cost.policy);
    const maxRows = Math.max(2, ...measured.map((p) => p.rows), ...policy.map((p) => p.rows));
    const theory = [];
    if (known(cost.one_row_s) && known(cost.knee_rows)) {
      for (let n = 1; n <= maxRows; n++) {
        theory.push({ rows: n, seconds: T.passCost(n, cost.knee_rows) * cost.one_row_s });
      }
    }
    const top = Math.max(0, ...[measured, policy, theory].flat().map((p) => p.seconds));
    const unit = top >= 1e-3 || top === 0 ? { scale: 1e3, name: "ms" } : { scale: 1e6, name: "µs" };
    const xTicks = C.niceTicks(maxRows, 6);
    const f = C.frame(svg, { width: 560, height: 300, margin: { l: 56, r: 16, t: 16, b: 46 },
      x: { min: 0, max: xTicks[xTicks.length - 1], ticks: xTicks, label: "token-rows in the pass" },
      y: { max: top > 0 ? top * unit.scale * 1.1 : 1, label: "time per pass (" + unit.name + ")" } });
    const pts = (list) => list.map((p) => [p.rows, p.seconds * unit.scale]);
    if (policy.length > 1) C.polyline(f, pts(policy), "ref-curve");
    if (theory.length > 1) C.polyline(f, pts(theory), "main-curve");
    for (const [x, y] of pts(measured)) C.el("circle", { cx: f.sx(x), cy: f.sy(y), r: 4, class: "live-dot" }, f.plot);
    if (!measured.length) {
      C.el("text", { x: (f.box.l + f.box.r) / 2, y: (f.box.t + f.box.b) / 2, class: "ref-label",
        "text-anchor": "middle" }, f.plot, "no target pass measured yet");
    }
    svg.dataset.points = String(measured.length);
    svg.dataset.theoryPoints = String(theory.length);
    svg.dataset.policyPoints = String(policy.length);
  }

  // --- Start ----------------------------------------------------------------------------------------------

  mayHaveLive().then((yes) => {
    if (yes) poll();
    else setState("off");
  });
})();
