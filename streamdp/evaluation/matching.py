"""Topic-recovery metrics on synthetic data (Hungarian-matched per-topic errors)."""
from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment


def match_topics(true: np.ndarray, est: np.ndarray) -> np.ndarray:
    """Permutation ``p`` minimising Σ_i ‖true_i − est_{p_i}‖₂ (both (k, d))."""
    true, est = np.asarray(true, float), np.asarray(est, float)
    if true.shape != est.shape:
        raise ValueError(f"topic matrices differ in shape: {true.shape} vs {est.shape}")
    cost = np.linalg.norm(true[:, None, :] - est[None, :, :], axis=2)
    rows, cols = linear_sum_assignment(cost)
    return cols[np.argsort(rows)]


def matched_topic_error(true: np.ndarray, est: np.ndarray) -> dict[str, float | np.ndarray]:
    """Mean and max matched L2 and L1 error per topic, and the matching."""
    p = match_topics(true, est)
    diff = np.asarray(true, float) - np.asarray(est, float)[p]
    l2 = np.linalg.norm(diff, axis=1)
    l1 = np.abs(diff).sum(axis=1)
    return {"l2_mean": float(l2.mean()), "l2_max": float(l2.max()),
            "l1_mean": float(l1.mean()), "l1_max": float(l1.max()), "permutation": p}
