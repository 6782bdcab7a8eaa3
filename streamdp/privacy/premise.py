"""The noised, charged check of the rounding premise N_max: its one draw and its one report
(docs/privacy.md "The premise check").

Every path that noises a raw sum of documents decides the premise ``max_documents_per_sum`` with
these two functions, never on the exact count: the continual epochs (:mod:`streamdp.continual`),
the warm-up (:mod:`streamdp.whitening.warmup`) and the estimator's one-shot calls (release,
refinement passes, the clustering start: :mod:`streamdp.estimator`). The budget of a check (its
share of ρ, σ_p, z, δ) and the decision rule itself are :class:`streamdp.privacy.plan.PremiseCheck`.
"""
from __future__ import annotations

import numpy as np

from streamdp.privacy.events import BudgetSpender, EventLog
from streamdp.privacy.noise import GaussianSampler
from streamdp.privacy.plan import PremiseCheck
from streamdp.privacy.spend import spend


def draw_noisy_count(check: PremiseCheck, n: int, sampler: GaussianSampler | None,
                     spender: BudgetSpender | None, *, partition: str, label: str) -> float:
    """ñ = n + N(0, σ_p²): the check's one draw, through the spend protocol (one
    ``premise_count`` event on ``partition``, ρ_p and δ_p charged by the accountant), before the
    draw of the statistic it protects."""
    if sampler is None:
        raise ValueError("a private premise check needs a noise sampler")
    value = np.array([float(n)])
    return float(spend(spender if spender is not None else EventLog(), [check.event(partition)],
                       label=label, draw=lambda: float(np.asarray(
                           sampler.add_noise(value, check.sigma), dtype=np.float64)[0])))


def check_report(check: PremiseCheck, noisy_count: float, max_documents: int) -> dict:
    """What a snapshot reports of one check, ``passed`` included: decided by
    :meth:`PremiseCheck.passes` from the released ñ and public constants only."""
    return {**check.to_dict(), "max_documents": int(max_documents),
            "noisy_count": float(noisy_count), "threshold": check.threshold(max_documents),
            "passed": bool(check.passes(noisy_count, max_documents))}


__all__ = ["draw_noisy_count", "check_report"]
