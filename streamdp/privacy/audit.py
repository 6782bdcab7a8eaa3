"""Empirical privacy auditing: an ε lower bound from a distinguisher's success counts.

Standard DP auditing (Jagielski et al. 2020; Nasr et al. 2021): release a
mechanism's output many times on neighbouring datasets D (label 0) and D'
(label 1), compute a scalar score per release (larger = "more like D'"), pick
thresholds on held-out *calibration* releases, and on fresh *test* releases
bound the false-positive and true-positive rates with Clopper–Pearson
intervals (Bonferroni over every threshold tried). For any (ε, δ)-DP mechanism,
TPR ≤ e^ε·FPR + δ, so with probability ≥ 1 − α

    ε ≥ ε_lb = log((TPR_lower − δ) / FPR_upper).

An ε_lb above the claimed ε proves the claim false (up to α); an ε_lb below it
is evidence, not proof, that the implementation keeps its promise.
"""
from __future__ import annotations

import math

import numpy as np

#: False-positive rates at which thresholds are tried (from the calibration releases).
FPR_LEVELS = (0.1, 0.03, 0.01, 0.003, 0.001)


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 − alpha) Clopper–Pearson interval of a binomial rate k/n."""
    from scipy.stats import beta
    lo = float(beta.ppf(alpha / 2, k, n - k + 1)) if k > 0 else 0.0
    hi = float(beta.ppf(1 - alpha / 2, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def epsilon_lower_bound(cal0, cal1, test0, test1, delta: float, alpha: float = 0.05,
                        fpr_levels=FPR_LEVELS) -> float:
    """Largest ε_lb over thresholds chosen on (cal0, cal1), estimated on (test0, test1).

    Scores: larger means "more like D'". Tests both "score > τ" (D' more likely)
    and "score ≤ τ" (D more likely), Bonferroni-corrected; 0 if nothing is significant.
    """
    cal0, cal1, test0, test1 = (np.asarray(a, dtype=np.float64) for a in (cal0, cal1, test0, test1))
    tests = [(">", np.quantile(cal0, 1 - q)) for q in fpr_levels]
    tests += [("<=", np.quantile(cal1, q)) for q in fpr_levels]
    a = alpha / len(tests)                       # each CP interval is two-sided at level a
    best = 0.0
    n0, n1 = len(test0), len(test1)
    for side, tau in tests:
        if side == ">":
            k_base, k_alt = int(np.sum(test0 > tau)), int(np.sum(test1 > tau))
            base_hi = clopper_pearson(k_base, n0, a)[1]
            alt_lo = clopper_pearson(k_alt, n1, a)[0]
        else:
            k_base, k_alt = int(np.sum(test1 <= tau)), int(np.sum(test0 <= tau))
            base_hi = clopper_pearson(k_base, n1, a)[1]
            alt_lo = clopper_pearson(k_alt, n0, a)[0]
        if alt_lo > delta and base_hi > 0:
            best = max(best, math.log((alt_lo - delta) / base_hi))
    return best


def gaussian_lr_scores(releases: list[np.ndarray], means0: list[np.ndarray],
                       means1: list[np.ndarray], sigmas: list[float]) -> np.ndarray:
    """The optimal (likelihood-ratio) score of releases of independent Gaussian blocks.

    ``releases[b]`` has shape (n, *block_shape): n noised releases of block b, whose
    noise-free value is ``means0[b]`` under D and ``means1[b]`` under D'. The score
    Σ_b ⟨r_b − m0_b, m1_b − m0_b⟩ / σ_b² is monotone in the likelihood ratio.
    """
    total = None
    for r, m0, m1, s in zip(releases, means0, means1, sigmas):
        diff = (np.asarray(m1) - np.asarray(m0)).ravel() / float(s) ** 2
        flat = (np.asarray(r) - np.asarray(m0)[None]).reshape(len(r), -1)
        score = flat @ diff
        total = score if total is None else total + score
    return total
