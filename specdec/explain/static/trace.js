/* Real rounds: read a trace written by `specdec generate --trace`, check it, and replay it.
 *
 * A round drafts tokens, the target accepts a prefix of `accepted` of them, then adds one token of its own:
 * "recovered" replaces the drafted token at index `accepted` (the rest of the draft is discarded);
 * "bonus" follows a fully accepted draft (an empty draft is a bonus round: the target alone).
 */
(function () {
  "use strict";

  function fail(message) {
    throw new Error(message);
  }

  const isInt = (v) => typeof v === "number" && Number.isInteger(v);
  const describe = (v) => (Array.isArray(v) ? "a list" : v === null ? "null" : typeof v === "string"
    ? JSON.stringify(v.length > 40 ? v.slice(0, 40) + "…" : v) : typeof v === "object" ? "an object" : String(v));

  function checkRound(r, i, k) {
    const where = "round " + (i + 1);
    if (r === null || typeof r !== "object" || Array.isArray(r)) fail(where + ": expected an object, got " + describe(r));
    if (!Array.isArray(r.drafted)) fail(where + ': "drafted" must be a list of token ids, got ' + describe(r.drafted));
    if (!r.drafted.every((t) => isInt(t) && t >= 0)) fail(where + ': "drafted" must hold integer token ids');
    if (r.drafted.length > k) fail(where + ": drafted " + r.drafted.length + " tokens but the trace says k = " + k);
    if (r.drafted_text !== undefined) {
      if (!Array.isArray(r.drafted_text) || !r.drafted_text.every((t) => typeof t === "string")) {
        fail(where + ': "drafted_text" must be a list of strings');
      }
      if (r.drafted_text.length !== r.drafted.length) {
        fail(where + ': "drafted_text" has ' + r.drafted_text.length + " entries for " + r.drafted.length + " drafted tokens");
      }
    }
    if (!isInt(r.accepted) || r.accepted < 0) fail(where + ': "accepted" must be an integer >= 0, got ' + describe(r.accepted));
    if (r.accepted > r.drafted.length) {
      fail(where + ": accepted = " + r.accepted + " but only " + r.drafted.length + " tokens were drafted");
    }
    if (r.kind !== "recovered" && r.kind !== "bonus") fail(where + ': "kind" must be "recovered" or "bonus", got ' + describe(r.kind));
    if (r.kind === "bonus" && r.accepted !== r.drafted.length) {
      fail(where + ': a "bonus" round must accept every drafted token (accepted ' + r.accepted + " of " + r.drafted.length + ")");
    }
    if (r.kind === "recovered" && r.accepted === r.drafted.length) {
      fail(where + ': a "recovered" round needs a rejected token, but all ' + r.drafted.length + " were accepted");
    }
    if (!isInt(r.token) || r.token < 0) fail(where + ': "token" must be an integer token id, got ' + describe(r.token));
    if (r.token_text !== undefined && typeof r.token_text !== "string") fail(where + ': "token_text" must be a string');
    for (const key of ["draft_s", "verify_s"]) {
      if (r[key] !== undefined && !(typeof r[key] === "number" && isFinite(r[key]) && r[key] >= 0)) {
        fail(where + ': "' + key + '" must be a number of seconds >= 0');
      }
    }
  }

  /** Parse and check a trace; throws an Error whose message is meant for the reader of the page. */
  function parseTrace(text) {
    let data;
    try {
      data = JSON.parse(text);
    } catch (e) {
      fail("not valid JSON (" + e.message + ")");
    }
    if (data === null || typeof data !== "object" || Array.isArray(data) || data.format !== "specdec-trace") {
      const found = data && typeof data === "object" && "format" in data ? " (its format is " + describe(data.format) + ")" : "";
      fail('not a specdec trace: expected a JSON object with "format": "specdec-trace"' + found);
    }
    if (data.version !== 1) fail("unsupported trace version " + describe(data.version) + ": this page reads version 1");
    if (!isInt(data.k) || data.k < 0) fail('"k" must be the draft depth, an integer >= 0, got ' + describe(data.k));
    if (!Array.isArray(data.rounds)) fail('"rounds" must be a list, got ' + describe(data.rounds));
    if (data.rounds.length === 0) fail("the trace has no rounds to replay");
    data.rounds.forEach((r, i) => checkRound(r, i, data.k));
    return data;
  }

  /** Counts over a checked trace: acceptance = accepted / drafted, tokens per round = (accepted + 1) per round. */
  function traceStats(trace) {
    const s = { rounds: trace.rounds.length, drafted: 0, accepted: 0, recovered: 0, bonus: 0 };
    for (const r of trace.rounds) {
      s.drafted += r.drafted.length;
      s.accepted += r.accepted;
      if (r.kind === "recovered") s.recovered += 1;
      else s.bonus += 1;
    }
    s.tokens = s.accepted + s.rounds;
    s.alpha = s.drafted > 0 ? s.accepted / s.drafted : null;
    s.meanTokens = s.tokens / s.rounds;
    s.shortRounds = trace.rounds.filter((r) => r.drafted.length < trace.k).length;
    return s;
  }

  function tokenText(text, id) {
    if (typeof text !== "string") return "#" + id;
    return text.replace(/\n/g, "↵\n").replace(/\t/g, "→") || "∅";
  }

  function span(parent, cls, text, title) {
    const node = document.createElement("span");
    node.className = "tok " + cls;
    node.textContent = text;
    if (title) node.title = title;
    parent.appendChild(node);
    return node;
  }

  /** One round as token spans: accepted drafts, then the rejected one + recovered token + discarded rest, or a bonus. */
  function renderRound(r, i) {
    const wrap = document.createElement("span");
    wrap.className = "trace-round";
    wrap.title = "round " + (i + 1) + ": " + r.accepted + " of " + r.drafted.length + " drafted accepted, " + r.kind;
    const texts = r.drafted_text || [];
    for (let j = 0; j < r.drafted.length; j++) {
      const t = tokenText(texts[j], r.drafted[j]);
      if (j < r.accepted) span(wrap, "accepted", t);
      else if (j === r.accepted) {
        span(wrap, "rejected", t, "rejected draft");
        span(wrap, "recovered", tokenText(r.token_text, r.token), "recovered: the target's token");
      } else span(wrap, "discarded", t, "discarded draft");
    }
    if (r.kind === "bonus") span(wrap, "bonus", tokenText(r.token_text, r.token), "bonus token");
    return wrap;
  }

  /** Replay state for one trace: `shown` rounds are visible; play animates, step adds one round. */
  function TraceView(container, progress, playButton) {
    this.container = container;
    this.progress = progress;
    this.playButton = playButton;
    this.nodes = [];
    this.shown = 0;
    this.timer = null;
  }

  TraceView.prototype.load = function (trace) {
    this.stop();
    this.container.textContent = "";
    this.nodes = trace.rounds.map((r, i) => this.container.appendChild(renderRound(r, i)));
    this.show(this.nodes.length);
  };

  TraceView.prototype.show = function (n) {
    this.shown = Math.max(0, Math.min(n, this.nodes.length));
    this.nodes.forEach((node, i) => { node.hidden = i >= this.shown; });
    this.progress.textContent = "round " + this.shown + " of " + this.nodes.length;
  };

  TraceView.prototype.step = function () {
    this.stop();
    this.show(this.shown >= this.nodes.length ? 1 : this.shown + 1);
  };

  TraceView.prototype.stop = function () {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.playButton.textContent = "Play";
  };

  TraceView.prototype.togglePlay = function () {
    if (this.timer !== null) return this.stop();
    if (this.shown >= this.nodes.length) this.show(0);
    const delay = Math.max(15, Math.min(250, 6000 / Math.max(1, this.nodes.length)));
    this.playButton.textContent = "Pause";
    this.timer = setInterval(() => {
      this.show(this.shown + 1);
      if (this.shown >= this.nodes.length) this.stop();
    }, delay);
  };

  window.specdecTrace = { parseTrace: parseTrace, traceStats: traceStats, TraceView: TraceView };
})();
