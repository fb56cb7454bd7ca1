"""Verification: the exact rejection sampler, its greedy fast path, logit warping, and the lossy rule."""
