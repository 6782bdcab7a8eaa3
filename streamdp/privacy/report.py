"""The privacy report every snapshot carries — built here and nowhere else.

A report has two parts, added at the two places that know them:

* :func:`release_report` — what one release noised and how (mechanism, every Gaussian event
  with its sensitivity, σ and ρ, the noise on each released block, clip bounds, budget split,
  sampler), built by the release paths (one-shot, tree, refinement);
* :func:`add_budget_context` — the budget it was charged to (ε, δ, ρ budget, the warm-up's
  events, the accountant's report and deployment fields), added by whoever owns the accountant
  (the estimator, the release service).

Keys are documented in docs/privacy.md ("The privacy report on every snapshot").
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Iterable

from streamdp.privacy.events import GaussianEvent, rho_by_partition
from streamdp.privacy.rounding import DEFAULT_MAX_DOCUMENTS_PER_SUM

UNIT = "one document"
NEIGHBOURING = "add/remove one document"


def rounding_report(clip, max_documents: int) -> dict:
    """The float64 premise and what it costs: N_max and Δ_b/C_b − 1 per block (docs/privacy.md)."""
    from streamdp.release import block_sensitivities, _BLOCK_CLIP
    sens = block_sensitivities(clip, max_documents=max_documents)
    return {"max_documents_per_sum": int(max_documents),
            "sensitivity_inflation": {b: sens[b] / f(clip) - 1.0 for b, f in _BLOCK_CLIP.items()}}


def release_report(*, mechanism: str, events: Iterable[GaussianEvent], noise_sd: dict | None,
                   clip, split, sampler, power, denoise_threshold: float,
                   max_documents: int = DEFAULT_MAX_DOCUMENTS_PER_SUM, **extra) -> dict:
    """The per-release part. ``events`` are the draws this release made (for a tree release, the
    events of one node; the tree's own fields go in ``extra``). Non-private: ``events`` empty.
    ``max_documents``: the premise N_max the sensitivities were computed for."""
    events = list(events)
    aggregated = mechanism in ("tree", "blt")     # continual: the aggregator's events in ``extra``
    private = bool(events) or aggregated
    report = {
        "unit": UNIT,
        "neighbouring": NEIGHBOURING,
        "mechanism": mechanism if private else "none",
        "rho_by_partition": rho_by_partition(events),
        "rho": float(sum(e.rho for e in events)),
        "events": [e.to_dict() for e in events],
        "noise_sd": dict(noise_sd or {}),
        "clip_bounds": clip.to_dict(),
        "budget_split": split.as_dict() if private and split is not None else None,
        "sampler": getattr(sampler, "name", None) if private else None,
        "power_method": asdict(power),
        "denoise_threshold": float(denoise_threshold) if private else 0.0,
        "rounding": rounding_report(clip, max_documents) if private else None,
    }
    if aggregated:
        # a continual release draws nothing itself: the tree's node events / the BLT's
        # per-epoch events are in ``extra``
        for key in ("rho_by_partition", "rho", "events"):
            del report[key]
    report.update(extra)
    return report


def add_budget_context(report: dict, *, epsilon, delta, rho_budget, warmup_events,
                       accountant=None, **extra) -> dict:
    """A copy of ``report`` with the budget it was charged to (and the accountant's report)."""
    out = dict(report)
    out.update({"epsilon": epsilon, "delta": delta, "rho_budget": rho_budget,
                "warmup": list(warmup_events)})
    if accountant is not None and hasattr(accountant, "report"):
        out["accountant"] = accountant.report()
    out.update(extra)
    return out
