"""The release service's start (issue 22; docs/services.md §The start): chosen once at the
warm-up close from public configuration and released values only, persisted with the subspace,
checked against the configuration at a restart, reported in every snapshot, and the fold-in
models it implies (epochs 1…L are folded into the public start when it was chosen).

Pure: :class:`~streamdp.services.release.ReleaseService` passes what each rule reads."""
from __future__ import annotations

from dataclasses import replace

from streamdp.refinement import FoldInModels, public_start_models
from streamdp.errors import ConfigError
from streamdp.start import choose_service_start, warmup_noised_count, warmup_subspace_nts

#: the layout of the start persisted in ``release/subspace``'s meta, its ``v`` (docs/schemas.md):
#: v1 = ``start`` always present (the choice below). Records written before it carry no ``v``;
#: theirs may lack ``start`` (written before issue 22: the tensor start).
SUBSPACE_META_VERSION = 1


def subspace_meta(choice: dict) -> dict:
    """The fields of ``release/subspace``'s meta that persist the start ``choice``."""
    return {"v": SUBSPACE_META_VERSION, "start": choice}


def recorded_start(meta: dict) -> dict | None:
    """The start choice persisted in ``release/subspace``'s ``meta`` (None: none was recorded,
    the tensor start of a deployment begun before issue 22). A version this build does not
    know is refused: its start could mean something this build would misread."""
    v = meta.get("v")
    if v is None:                       # written before the meta was versioned
        return meta.get("start")
    if type(v) is not int or not 1 <= v <= SUBSPACE_META_VERSION or "start" not in meta:
        raise ConfigError(
            f"state record 'release/subspace': its meta has version {v!r}"
            + ("" if "start" in meta else " without the start choice")
            + f"; this build reads v{SUBSPACE_META_VERSION} and unversioned records. "
            + ("It was written by a newer streamdp: run that version (or newer) on this state"
               if type(v) is int and v > SUBSPACE_META_VERSION else
               "The record is not one streamdp wrote: restore the state topic from a backup")
            + ", or start a new deployment (new topic_prefix and ledger)")
    return meta["start"]


def is_public(choice: dict | None) -> bool:
    """Whether the recorded choice (None: not chosen yet) is the public start."""
    return bool(choice) and choice.get("start") == "public"


def fold_in_models(refinement, public_start, public: bool) -> FoldInModels:
    """The fold-in models with the start's: epochs 1…L are folded into the public start
    (model epoch 0, streamdp.refinement.model_epoch_for) when it was chosen."""
    if public:
        return public_start_models(refinement, public_start)
    return FoldInModels(refinement.model_lag, public_start=False)


def node_refinement(cfg, choice: dict | None):
    """The refinement plan every tree node is noised with under the start ``choice``: the
    share persisted with the choice (``refinement_share_public`` for a public start,
    ``refinement_share`` otherwise: docs/privacy.md "The public start's node plan"); before the
    choice, or for a choice persisted before the share was, ``refinement_share`` (the plan
    such a deployment's tree was begun with)."""
    ref = cfg.refinement_config()
    if ref is None or not choice or "refinement_share" not in choice:
        return ref
    return replace(ref, share=float(choice["refinement_share"]))


def choose_start(cfg, public_start, refinement, warmup_hist, stream_rho: float | None,
                 k_prime: int, warmup_range=None, warmup_sigma: float | None = None) -> dict:
    """:func:`start_rule`, with the public start's content id and the node plan's refinement
    share it implies (persisted with the choice, never re-decided: the first epochs are folded
    into the start and every tree node is noised with the share)."""
    choice = start_rule(cfg, public_start, refinement, warmup_hist, stream_rho, k_prime,
                        warmup_range, warmup_sigma)
    if is_public(choice):
        choice["start_id"] = public_start.start_id
    if refinement is not None:
        choice["refinement_share"] = cfg.refinement_config(is_public(choice)).share
    return choice


def start_rule(cfg, public_start, refinement, warmup_hist, stream_rho: float | None,
               k_prime: int, warmup_range=None, warmup_sigma: float | None = None) -> dict:
    """THE start rule of the services (streamdp.start.choose_service_start) at the warm-up
    close, from public configuration and released values only: start: public / tensor as
    configured; auto from the warm-up's noised count (its clip histogram) and the noise-to-signal
    of its noised range sum ``warmup_range`` (σ ``warmup_sigma``), both already released. A
    configured start records what the rule would have chosen (``auto_rule``), for the operator."""
    public_available = public_start is not None and refinement is not None
    rule = None
    if warmup_hist is not None and warmup_range is not None:
        rule = choose_service_start(
            warmup_noised_count(warmup_hist), stream_rho, cfg.n_topics, k_prime,
            public_available=public_available,
            warmup_nts=warmup_subspace_nts(warmup_range, warmup_sigma, cfg.n_topics))
    if cfg.start == "public":
        got = {"start": "public", "rule": "configured (start: public)"}
    elif cfg.start == "tensor" or not public_available:
        got = {"start": "tensor", "rule": f"configured (start: {cfg.start}"
               + ("" if cfg.start == "tensor" else ", no public start") + ")"}
    elif rule is not None:
        return rule
    else:
        n = None if warmup_hist is None else warmup_noised_count(warmup_hist)
        return choose_service_start(n, stream_rho, cfg.n_topics, k_prime, public_available=True)
    return got if rule is None else {**got, "auto_rule": rule}


def restored_start(recorded: dict | None, cfg, public_start) -> dict:
    """The choice persisted with the subspace (:func:`recorded_start`; none before issue 22:
    tensor). A configuration that contradicts it is refused: epochs 1…L were folded by it."""
    start_choice = dict(recorded) if recorded else {"start": "tensor",
                                                    "rule": "before the start choice"}
    chosen = start_choice["start"]
    if (cfg.start in ("public", "tensor") and chosen != cfg.start) or (
            chosen == "public" and public_start is None):
        raise ConfigError(
            f"configuration fields 'start'/'public_start_file': this deployment's start is "
            f"{chosen!r} (chosen at its warm-up close, {start_choice.get('rule')}), the "
            f"configuration says start {cfg.start!r}"
            + ("" if public_start is not None else " without a public start file")
            + ": the first epochs were folded into that start, so it cannot change; restore "
              "the original setting, or start a new deployment")
    recorded_share = start_choice.get("refinement_share")
    configured = cfg.refinement_config(chosen == "public")
    if recorded_share is not None and configured is not None and \
            float(recorded_share) != configured.share:
        field = "refinement_share_public" if chosen == "public" else "refinement_share"
        raise ConfigError(
            f"configuration field {field!r}: this deployment's {chosen} start was chosen with "
            f"refinement share {recorded_share:g} (every tree node is noised with it), the "
            f"configuration says {configured.share:g}: restore the original setting, or start "
            "a new deployment")
    if chosen == "public" and start_choice.get("start_id") != public_start.start_id:
        raise ConfigError(
            f"configuration field 'public_start_file': this deployment started from public "
            f"start {start_choice.get('start_id')}, the file holds "
            f"{public_start.start_id}: restore the original file, or start a new deployment")
    return start_choice


def start_report(choice: dict | None, public_start) -> dict:
    """What every snapshot's privacy report says about the start: the public input (no
    budget) or the tensor start, and the rule that chose it."""
    if is_public(choice):
        return {"kind": "public", **public_start.report(), "choice": choice}
    return {"kind": "tensor", "choice": choice}
