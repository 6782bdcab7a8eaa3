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

from streamdp.privacy.events import ROUNDING_SLACK, GaussianEvent, rho_by_partition
from streamdp.privacy.noise import (CSPRNG_NAME, GOOGLE_NAME, OPENDP_LATTICE_NAME, OPENDP_NAME,
                                    SEEDED_NAME, VETTED, sampler_status)
from streamdp.privacy.rounding import DEFAULT_MAX_DOCUMENTS_PER_SUM
from streamdp.privacy.sensitivity import BLOCK_CLIP, block_sensitivities

UNIT = "one document"
NEIGHBOURING = "add/remove one document"
#: privacy unit → (unit, neighbouring relation) as the report states them
UNIT_WORDS = {
    "document": (UNIT, NEIGHBOURING),
    "user": ("one user (every document with the same user id, as assigned by the producer)",
             "add/remove all documents of one user"),
}


def unit_fields(privacy_unit: str, user_bounding: dict | None = None) -> dict:
    """``unit``, ``neighbouring``, ``privacy_unit`` and, for users, ``user_bounding`` (m, M,
    the weight schedule and its sum, the memory cap, how the warm-up composes)."""
    if privacy_unit not in UNIT_WORDS:
        raise ValueError(f"privacy_unit must be one of {tuple(UNIT_WORDS)}, got {privacy_unit!r}")
    unit, neighbouring = UNIT_WORDS[privacy_unit]
    out = {"unit": unit, "neighbouring": neighbouring, "privacy_unit": privacy_unit}
    if privacy_unit == "user":
        if user_bounding is None:
            raise ValueError("a user-level report needs the bounding configuration")
        out["user_bounding"] = dict(user_bounding)
    return out


def rounding_report(clip, max_documents: int) -> dict:
    """The float64 premise and what it costs: N_max and Δ_b/C_b − 1 per block (docs/privacy.md)."""
    sens = block_sensitivities(clip, max_documents=max_documents)
    return {"max_documents_per_sum": int(max_documents),
            "sensitivity_inflation": {b: sens[b] / f(clip) - 1.0 for b, f in BLOCK_CLIP.items()}}


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
        # vetted / non-production (streamdp.privacy.noise.sampler_status): a snapshot drawn by
        # an unvetted sampler must not look vetted
        "sampler_status": sampler_status(sampler) if private and sampler is not None else None,
        # every event's ρ is charged at sensitivity Δ + this·σ: the samplers' lattice rounding
        # (streamdp.privacy.events.ROUNDING_SLACK, docs/privacy.md "Noise")
        "sampler_rounding_slack_sigmas": ROUNDING_SLACK if private else None,
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


NON_PRIVATE_MODE = ("NON-PRIVATE: no clipping, no noise - this snapshot is an exact function "
                    "of the documents and carries NO privacy guarantee")


def add_budget_context(report: dict, *, epsilon, delta, rho_budget, warmup_events,
                       accountant=None, privacy_unit: str = "document",
                       user_bounding: dict | None = None, **extra) -> dict:
    """A copy of ``report`` with the budget it was charged to (and the accountant's report).
    ``privacy_unit``: "document" or "user" (then ``user_bounding`` describes the bounding).
    Without ``epsilon`` the report says NON-PRIVATE and names no unit: nothing is protected."""
    out = dict(report)
    out.update(unit_fields(privacy_unit, user_bounding))
    if epsilon is None:
        out.update({"unit": "none (NON-PRIVATE)", "neighbouring": "none (NON-PRIVATE)",
                    "non_private": True, "privacy_mode": NON_PRIVATE_MODE})
    out.update({"epsilon": epsilon, "delta": delta, "rho_budget": rho_budget,
                "warmup": list(warmup_events)})
    if accountant is not None and hasattr(accountant, "report"):
        out["accountant"] = accountant.report()
    out.update(extra)
    return out


# ------------------------------------------------------------------ the report in words
_ATOMS_IN_WORDS = {"warmup": "warm-up documents", "vocabulary": "vocabulary-selection documents",
                   "stream_worst_epoch_rho": "stream documents (the worst epoch)"}
_VOCABULARY_IN_WORDS = {
    "public": "a public word list (wordfreq), chosen without looking at any document: no budget",
    "private": "selected with differential privacy from the documents of the selection window "
               "(before selection_end), which are used for nothing else: their budget is their own "
               "(parallel composition)",
    "file": "a file the operator declared public: its words are assumed not to come from the "
            "protected documents (nothing is charged for it)",
}


def is_non_private(report: dict) -> bool:
    """True when the snapshot carries no privacy guarantee: made without noise, or with noise
    drawn from a known seed."""
    return bool(report.get("non_private") or report.get("insecure_reproducible_noise")
                or "INSECURE" in str(report.get("sampler"))
                or (report.get("mechanism") == "none" and report.get("epsilon") is None))


def sampler_in_words(name: str) -> str:
    """A sampler id of a privacy report (streamdp.privacy.noise) in plain words; the id itself
    stays in the report's JSON."""
    words = {OPENDP_LATTICE_NAME: "OpenDP's vetted Gaussian sampler (on a fine lattice)",
             OPENDP_NAME: "OpenDP's vetted exact Gaussian sampler",
             GOOGLE_NAME: "Google's secure-noise Gaussian sampler (python-dp)",
             CSPRNG_NAME: "the fast sampler (numpy, seeded from the operating system's random "
                          "source)",
             SEEDED_NAME: "the fast sampler with a known seed (INSECURE: reproducible noise)"}
    for key, text in words.items():
        if str(name) == key:
            return text
    inner = next((text for key, text in words.items() if key in str(name)), None)
    return f"a custom sampler wrapping {inner}" if inner else "a custom sampler"


def describe(report: dict, *, n_docs: float | None = None) -> list[tuple[str, str]]:
    """The report in plain words: (heading, sentence) pairs for a person who does not read
    the keys (guarantee, unit, neighbouring relation, ε, δ, spent, what is public). Only
    the report's own values are used; a key it lacks is left out, never guessed."""
    out: list[tuple[str, str]] = []
    eps, delta = report.get("epsilon"), report.get("delta")
    users = report.get("privacy_unit") == "user"
    noun = "user" if users else "document"
    acc = report.get("accountant") if isinstance(report.get("accountant"), dict) else {}
    sampler = report.get("sampler")
    if report.get("non_private") or (report.get("mechanism") == "none" and eps is None):
        out.append(("Guarantee", "NONE. " + str(report.get("privacy_mode") or
                    "This snapshot was made without clipping or noise: it is an exact function "
                    "of the documents and carries no privacy guarantee.")))
    elif report.get("insecure_reproducible_noise") or "INSECURE" in str(sampler):
        out.append(("Guarantee", f"NONE in practice: the noise was drawn from a known seed "
                    f"({sampler}), so anyone who knows the seed can subtract it. For tests and "
                    "benchmarks only, never for real documents."))
    elif eps is not None:
        out.append(("Guarantee", f"({eps:g}, {delta:g})-differential privacy for every {noun}"
                    + (" (all of one user's documents together)" if users else "") + ", "
                    "for everything published under this budget taken together (every release, "
                    "whatever else an observer knows); the accountant refuses any release that "
                    "would exceed it."))
    unit = report.get("unit")
    if unit and is_non_private(report):
        pass        # nothing is protected: no unit to name (the guarantee says NONE)
    elif unit and users:
        out.append(("Unit of privacy", f"{unit}: what is hidden is whether any single user "
                    "contributed to the data at all, with every document they wrote together "
                    "(as far as the producer's user ids are right: two ids are two users)."))
    elif unit:
        out.append(("Unit of privacy", f"{unit}: what is hidden is whether any single document "
                    "was in the data. Someone who wrote many documents is protected document by "
                    "document, not as a person."))
    neighbouring = report.get("neighbouring")
    if neighbouring and not is_non_private(report):
        differ = ("all the documents of one user, added or removed together" if users
                  else "one document, added or removed")
        out.append(("Neighbouring datasets", f"{neighbouring}: two streams that differ by "
                    f"{differ}. Every published value is almost equally likely "
                    "under both (within a factor e^ε, except with probability δ)."))
    if eps is not None:
        out.append(("ε and δ", f"ε = {eps:g} bounds how much one {noun} can change what is "
                    f"published (smaller is more private); δ = {delta:g} is the probability that "
                    "this bound may fail. Accounted as zero-concentrated DP with budget "
                    f"ρ = {report.get('rho_budget', acc.get('rho_budget', float('nan'))):.4g}, "
                    "converted to (ε, δ) by the accountant."))
    if acc.get("rho_worst_case") is not None and acc.get("rho_budget"):
        share = acc["rho_worst_case"] / acc["rho_budget"]
        by_atom = acc.get("rho_by_atom") or {}
        parts = [f"{name} ρ {by_atom[key]:.4g}" for key, name in _ATOMS_IN_WORDS.items()
                 if isinstance(by_atom.get(key), (int, float)) and by_atom[key] > 0]
        text = (f"ρ {acc['rho_worst_case']:.4g} of {acc['rho_budget']:.4g} ({share:.0%}) for the "
                f"most-charged {noun}")
        if acc.get("epsilon_worst_case") is not None:
            text += f", that is ε {acc['epsilon_worst_case']:.3g} of {eps:g} at δ {delta:g}"
        if users:
            text += (". A user is charged for every group holding one of their documents: the "
                     "warm-up and the stream compose sequentially (docs/privacy.md, The "
                     "user-level unit)")
        else:
            text += (". Each document is charged only for the group it belongs to (by its "
                     "timestamp), so the groups' spends do not add up")
        text += (": " + "; ".join(parts) + "." if parts else ".")
        remaining = (acc.get("rho_remaining_by_atom") or {}).get("stream_new_epoch")
        if remaining is not None:
            text += f" Left for documents of a new epoch: ρ {remaining:.4g}."
        out.append(("Spent so far", text))
    covered = report.get("epochs_covered")
    if covered:
        mech = report.get("mechanism")
        text = (f"epochs {covered[0]}–{covered[1]}" if covered[0] != covered[1]
                else f"epoch {covered[0]}")
        if report.get("horizon") is not None:
            text += f" of a horizon of {report['horizon']} epochs"
        text += (f"; Gaussian noise through {'the binary tree' if mech == 'tree' else 'BLT matrix factorisation' if mech == 'blt' else mech}"
                 " (continual release: every release re-uses noised partial sums, nothing is "
                 "charged twice)")
        out.append(("Releases covered", text + "."))
    if sampler and not report.get("non_private"):
        clipped = ("every document, and bounding each user's documents by the weight schedule"
                   if users else "every document")
        status = report.get("sampler_status")
        vetted = ("" if status in (None, VETTED) else
                  f" NOT a vetted sampler ({status}): for tests and benchmarks, not for real "
                  "documents.")
        out.append(("Noise", f"drawn by {sampler_in_words(sampler)}; sensitivities bounded by clipping {clipped} "
                    "(the clip bounds are in the report); every draw is charged for "
                    "its sensitivity plus 2^-40·σ, the sampler's lattice rounding." + vetted))
    vocab = report.get("vocabulary") if isinstance(report.get("vocabulary"), dict) else None
    if is_non_private(report):
        out.append(("What is public", "Whatever this snapshot is published to. Without a "
                    "guarantee it is as sensitive as the documents themselves: give it the "
                    "documents' access control."))
        return out
    public = ["the topics (word probabilities), α and the eigenvalues",
              (f"the noised document count (≈ {n_docs:,.0f})" if n_docs is not None
               else "the noised document count"),
              "each topic's noise estimate and this privacy report"]
    text = ("This snapshot is computed from noised values only, so all of it is public: "
            + ", ".join(public) + ". ")
    if vocab is not None:
        text += f"The vocabulary is {_VOCABULARY_IN_WORDS.get(vocab.get('mode'), vocab.get('mode'))}. "
    else:
        text += "The vocabulary is the caller's and is assumed public. "
    text += ("Public by design: the clip bounds, the epoch schedule and when releases happen "
             "(each release is due at its epoch's scheduled close time or at an operator's "
             "order, never at a time the documents decide; created_at is that due time). Not "
             "public (operators only, in the services): exact counts in /metrics, the logs, the state "
             "topic and the privacy ledger (docs/privacy.md, Trust boundary).")
    out.append(("What is public", text))
    return out
