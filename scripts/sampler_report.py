"""The evidence behind `specdec.verify`: per-position chi-square p-values for a few (p, q) configurations,
the acceptance rate at position 0 against sum(min(p, q)), and the broken samplers' rejections.

    .venv/bin/python scripts/sampler_report.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.sampler_harness

from specdec.sampling.verify import rejection_sample
from tests.sampler_harness import (
    broken_no_residual,
    broken_swapped_ratio,
    position_pvalues,
    random_config,
    run_rounds,
)
from tests.test_verify import CONFIGS, ROUNDS


def main() -> None:
    print(f"{ROUNDS} rounds per configuration; configuration = (seed, vocab, k, q far from p)")
    for cfg in CONFIGS[:6] + CONFIGS[-2:]:
        p, q = random_config(*cfg)
        out = run_rounds(rejection_sample, p, q, ROUNDS, seed=1000 + cfg[0])
        acc = (out.num_accepted >= 1).double().mean().item()
        pv = ", ".join(f"{j}:{v:.3f}" for j, _, v in position_pvalues(out, p))
        print(f"exact   {cfg}: accept@0 {acc:.4f} vs sum min(p,q) {torch.minimum(p[0], q[0]).sum():.4f}; "
              f"p-values by position {pv}")
    for broken in (broken_no_residual, broken_swapped_ratio):
        far = [c for c in CONFIGS if c[3]]
        worst = []
        for cfg in far:
            p, q = random_config(*cfg)
            worst.append(min(v for _, _, v in position_pvalues(run_rounds(broken, p, q, ROUNDS, 1000 + cfg[0]), p)))
        rejected = sum(w < 1e-6 for w in worst)
        print(f"{broken.__name__}: rejected (p < 1e-6) in {rejected}/{len(far)} far configurations; "
              f"largest of the smallest p-values {max(worst):.1e}")


if __name__ == "__main__":
    main()
