/* The economics of speculation, as in specdec/theory/economics.py (kept equal by vectors.json).
 *
 *   a  acceptance rate: the probability that a drafted position survives verification
 *   k  draft depth: tokens proposed per round
 *   c  draft cost: one drafted token, in units of one target forward pass
 *
 *   E[tokens/round] = (1 - a^(k+1)) / (1 - a)      (k + 1 at a = 1)
 *   speedup(k)      = E / (1 + k c)
 */
(function () {
  "use strict";

  function expectedTokens(a, k) {
    if (a >= 1) return k + 1;
    return (1 - Math.pow(a, k + 1)) / (1 - a);
  }

  /** Tokens per unit of target-pass time, relative to plain decoding (verifying k + 1 rows costs one pass). */
  function speedup(a, k, c) {
    return expectedTokens(a, k) / (1 + k * c);
  }

  /** c* = -a ln a / (1 - a): above it speedup falls from k = 0 on. */
  function maxUsefulDraftCost(a) {
    if (a <= 0) return 0;
    if (a >= 1) return 1;
    return (-a * Math.log(a)) / (1 - a);
  }

  /** Evaluate k = 1..maxK and pick the best depth (the first one on ties, like Python's max). */
  function plan(a, c, maxK) {
    maxK = maxK || 20;
    const curve = [];
    let best = null;
    for (let k = 1; k <= maxK; k++) {
      const row = { k: k, expected_tokens: expectedTokens(a, k), speedup: speedup(a, k, c) };
      curve.push(row);
      if (best === null || row.speedup > best.speedup) best = row;
    }
    return {
      alpha: a, draft_cost: c, max_k: maxK, curve: curve,
      best_k: best.k, best_speedup: best.speedup, beats_plain: best.speedup > 1,
      max_useful_draft_cost: maxUsefulDraftCost(a),
    };
  }

  /** One target pass over `rows` token-rows, in 1-row passes: flat up to the knee, linear above it. */
  function passCost(rows, kneeRows) {
    return Math.max(1, rows / kneeRows);
  }

  /** Throughput with speculation relative to without, for `batch` sequences decoding together. */
  function batchRatio(a, k, c, batch, kneeRows) {
    const plain = passCost(batch, kneeRows);
    const specRound = passCost(batch * (k + 1), kneeRows) + k * c * plain;
    return (expectedTokens(a, k) * plain) / specRound;
  }

  function batchModel(a, k, c, kneeRows, maxBatch) {
    maxBatch = maxBatch || 256;
    const curve = [];
    let crossover = null;
    for (let b = 1; b <= maxBatch; b++) {
      const ratio = batchRatio(a, k, c, b, kneeRows);
      curve.push({ batch: b, ratio: ratio });
      if (crossover === null && ratio < 1) crossover = b;
    }
    return {
      alpha: a, k: k, draft_cost: c, knee_rows: kneeRows, curve: curve,
      ratio_at_batch_1: curve[0].ratio, ratio_at_max_batch: curve[curve.length - 1].ratio,
      crossover_batch: crossover,
    };
  }

  /** P(round yields j tokens), j = 1..k+1: j - 1 accepted then a rejection, or all k accepted plus a bonus. */
  function yieldDistribution(a, k) {
    const p = [];
    for (let j = 1; j <= k; j++) p.push(Math.pow(a, j - 1) * (1 - a));
    p.push(Math.pow(a, k));
    return p;
  }

  function describeSpeedup(s) {
    return s >= 1 ? s.toFixed(2) + "x faster" : s.toFixed(2) + "x: slower than plain decoding";
  }

  window.specdecTheory = {
    expectedTokens: expectedTokens, speedup: speedup, maxUsefulDraftCost: maxUsefulDraftCost, plan: plan,
    passCost: passCost, batchRatio: batchRatio, batchModel: batchModel,
    yieldDistribution: yieldDistribution, describeSpeedup: describeSpeedup,
  };
})();
