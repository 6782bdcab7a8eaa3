"""What a release service's snapshot says about its privacy beyond the release's own report
(docs/consumers.md): the budget context (ε, δ, ρ, the warm-up's events and premise check, the
ledger), the vocabulary, the refinement model, the start. Public facts only: configuration,
released values and the ledger — never an exact count.

Pure: :class:`~streamdp.services.release.ReleaseService` passes what the report reads."""
from __future__ import annotations

from streamdp.privacy.report import add_budget_context
from streamdp.services import release_start


def vocabulary_report(vocabulary_mode: str, vocabulary, vocabulary_meta: dict) -> dict:
    """What every snapshot's privacy report says about the vocabulary (public facts only:
    never the exact number of selection documents)."""
    out = {"vocabulary_id": None if vocabulary is None else vocabulary.id,
           "mode": vocabulary_mode}
    for k in ("selection", "source", "source_version", "lang", "size", "candidates",
              "candidates_id", "max_words_per_document", "selection_end", "events", "rho",
              "delta_approximate", "n_candidates_above_cut", "n_new_words",
              "min_noisy_count", "public_by_assumption", "privacy_cost", "sigma"):
        if k in vocabulary_meta:
            out[k] = vocabulary_meta[k]
    if vocabulary_mode == "private":
        out["composition"] = ("parallel: the selection window (ts < selection_end) is its own "
                              "atom, disjoint from the warm-up and the stream")
    return out


def snapshot_privacy(privacy: dict, cfg, *, rho, subspace, accountant, own_pending: int,
                     vocabulary, vocabulary_meta: dict, refinement, model_epoch: int | None,
                     start_choice: dict | None, public_start) -> dict:
    """The privacy section of an epoch's snapshot: the continual release's ``privacy`` with
    the service's context. ``own_pending``: this release's reservations, committed right after
    its state is persisted (not counted as uncommitted)."""
    privacy = add_budget_context(
        privacy, epsilon=cfg.epsilon, delta=cfg.delta, rho_budget=rho,
        warmup_events=subspace.provenance.get("events", []), accountant=accountant,
        warmup_premise_check=subspace.provenance.get("premise_check"),
        vocabulary_id=vocabulary.id,
        vocabulary=vocabulary_report(cfg.vocabulary_mode, vocabulary, vocabulary_meta),
        privacy_unit=cfg.privacy_unit, user_bounding=cfg.user_bounding_report(),
        **cfg.privacy_fields())
    if accountant is not None:
        # this release's own reservation is committed right after the state is persisted
        report = privacy["accountant"]
        report["uncommitted"] = max(0, report["uncommitted"] - own_pending)
    if refinement is not None:
        privacy["refinement"] = {**(privacy.get("refinement") or {}), "model_epoch": model_epoch,
                                 "model_lag": refinement.model_lag,
                                 "refined": model_epoch is not None}
    privacy["start"] = release_start.start_report(start_choice, public_start)
    if release_start.is_public(start_choice):   # public input, no budget (PublicStart.report)
        privacy["public_start"] = public_start.report()
    return privacy
