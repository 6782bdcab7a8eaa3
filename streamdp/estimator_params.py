"""The parameters of :class:`~streamdp.estimator.StreamingSpectralLDA`: their defaults, their
checks, and what is built from them alone (the clip bounds, the user bounders, the accountant
and the spender). Each check raises ValueError saying what to pass instead; the estimator's
``__init__`` calls them in its argument order, so the first bad argument is the one named.
"""
from __future__ import annotations

import math
import numbers
import uuid
import warnings
from dataclasses import replace

from streamdp.cluster_start import ClusterStartConfig
from streamdp.continual import AGGREGATORS
from streamdp.moments.clipping import WARMUP_NORMALISING_CLIP, ClipBounds
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.epochs import EpochClock
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.plan import WARMUP_SHARE
from streamdp.privacy.spend import SpendSession, UnitSpender, output_store_for
from streamdp.privacy.user_bounding import (SCHEDULES, UserBounder, bounding_report,
                                            check_max_users, check_positive_int)
from streamdp.refinement import PUBLIC_START_SHARE, RefinementConfig
from streamdp.start import PublicStart

DEFAULT_CLIP_QUANTILE = 0.97
DEFAULT_CLIP_BUDGET_SHARE = 0.05
# fit(warmup_docs=…): a row-count boundary charges the warm-up on the stream partition
# (sequential composition, replace sensitivity); this share of ρ goes to the warm-up.
COUNT_BOUNDARY_WARMUP_SHARE = WARMUP_SHARE
WARMUP_BOUNDARIES = ("document", "count")
PRIVACY_UNITS = ("document", "user")
#: user mode: kept documents per user per epoch when not configured (the issue's target m)
DEFAULT_MAX_DOCS_PER_USER_EPOCH = 5


def check_positive_float(name: str, v, allow_none: bool = False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0{' or None' if allow_none else ''}, got {v!r}")
    return float(v)


class NonPrivateWarning(UserWarning):
    """A model fitted without ε: no clipping, no noise, no privacy guarantee."""


def check_non_private(epsilon, non_private) -> bool:
    """Without ε the estimator is exact and protects nobody: say so (issue 23 item 8). The
    warning keeps ``fit(X, k)`` callable; ``non_private=True`` states the intent and silences it.
    Called by the estimator's ``__init__`` (stacklevel 3: the line that built the estimator)."""
    if not isinstance(non_private, bool):
        raise ValueError(f"non_private must be True or False, got {non_private!r}")
    if epsilon is not None and non_private:
        raise ValueError(f"non_private=True with epsilon={epsilon!r}: a model is either private "
                         "(epsilon=...) or non-private (non_private=True, no epsilon)")
    if epsilon is None and not non_private:
        warnings.warn("no epsilon: this model is NON-PRIVATE (no clipping, no noise); its "
                      "snapshots are an exact function of the documents. Pass epsilon=... for "
                      "privacy, or non_private=True to say you mean it", NonPrivateWarning,
                      stacklevel=3)
    return epsilon is None


def check_clip(clip, clip_length, clip_quantile, clip_budget_share,
               epsilon) -> tuple[ClipBounds, float, float, bool]:
    """(the clip bounds, the quantile, its ρ share, whether the bounds come from the warm-up)."""
    if clip is not None and not isinstance(clip, ClipBounds):
        raise ValueError("clip must be a streamdp.ClipBounds (or None to use clip_length)")
    if not 0 < clip_quantile <= 1:
        raise ValueError(f"clip_quantile must be in (0, 1], got {clip_quantile!r}")
    if not 0 < clip_budget_share < 1:
        raise ValueError(f"clip_budget_share must be in (0, 1), got {clip_budget_share!r}")
    auto_clip = False
    if clip is None and epsilon is None:
        clip = ClipBounds.unclipped()   # non-private: the exact, unweighted estimator
    elif clip is None and clip_length is not None:
        clip = ClipBounds.for_length(clip_length)
    elif clip is None:
        # placeholder stream bounds until the warm-up releases its norm quantiles
        auto_clip = True
        clip = ClipBounds(m1=1.0, z=1.0, s3=1.0, warmup=WARMUP_NORMALISING_CLIP)
    return clip, float(clip_quantile), float(clip_budget_share), auto_clip


def check_continual(epochs, horizon, mechanism: str, continual_aggregator: str) -> int | None:
    """The continual mode's arguments; returns the checked horizon."""
    if (epochs is None) != (horizon is None):
        raise ValueError("continual release needs both epochs=EpochClock(...) and horizon=T "
                         "(or neither, for one-shot releases)")
    if epochs is not None and not isinstance(epochs, EpochClock):
        raise ValueError(f"epochs must be a streamdp EpochClock, got {type(epochs).__name__}")
    if epochs is not None and mechanism != "tensor":
        raise ValueError("continual release noises tree nodes once: use mechanism='tensor'")
    if continual_aggregator not in AGGREGATORS:
        raise ValueError(f"continual_aggregator must be one of {AGGREGATORS}, "
                         f"got {continual_aggregator!r}")
    return None if horizon is None else check_positive_int("horizon", horizon)


def check_continual_start(epochs, start, cluster_start, refinement: RefinementConfig | None,
                          refinement_arg, n_topics: int) -> RefinementConfig | None:
    """Continual mode's start (``epochs=``); returns the refinement plan of its nodes.

    "auto" (the default) and "tensor" start every epoch's chain from the private tensor release
    (epochs 1 … L spectral). A :class:`PublicStart` starts it as the services' ``start: public``
    does: epochs 1 … L are folded into the public topics, every epoch is refined, and each node's
    ρ is split ``PUBLIC_START_SHARE`` (0.9) to the refinement sums unless ``refinement`` is an
    explicit RefinementConfig (its share is kept). A start continual mode has no use for — the
    clustering start, a ClusterStartConfig — is refused rather than silently dropped."""
    if epochs is None:
        return refinement
    if isinstance(start, PublicStart):
        if refinement is None:
            raise ValueError("a public start in continual mode is used only by the refinement "
                             "(epochs 1..L are folded into it): pass refinement=True or a "
                             "RefinementConfig, or drop start=")
        if start.n_topics != n_topics:
            raise ValueError(f"the public start has {start.n_topics} topics; this model has "
                             f"n_topics={n_topics}")
        if isinstance(refinement_arg, RefinementConfig):
            return refinement
        return replace(refinement, share=PUBLIC_START_SHARE)
    if start not in ("auto", "tensor"):
        raise ValueError(
            f"start={start!r} is not used in continual mode (epochs=EpochClock(...)): "
            "close_epochs has no clustering start. Release one-shot (drop epochs/horizon and "
            "call streamdp.fit(..., start='cluster')), or pass start='auto' (the default), "
            "'tensor' or a streamdp.PublicStart here")
    if cluster_start is not None:
        raise ValueError(
            "cluster_start= is not used in continual mode (epochs=EpochClock(...)): "
            "close_epochs has no clustering start. Drop it, or release one-shot "
            "(streamdp.fit(..., start='cluster', cluster_start=...))")
    return refinement


def check_refinement(refinement) -> RefinementConfig | None:
    if refinement is True:
        refinement = RefinementConfig()
    elif refinement is False:
        refinement = None
    if refinement is not None and not isinstance(refinement, RefinementConfig):
        raise ValueError("refinement must be a streamdp.RefinementConfig, True or None, "
                         f"got {type(refinement).__name__}")
    return refinement


def check_cluster_start(cluster_start) -> ClusterStartConfig:
    if cluster_start is not None and not isinstance(cluster_start, ClusterStartConfig):
        raise ValueError("cluster_start must be a streamdp.ClusterStartConfig or None, "
                         f"got {type(cluster_start).__name__}")
    return cluster_start or ClusterStartConfig()


def check_warmup_boundary(warmup_boundary, warmup_share) -> float:
    """The warm-up boundary's arguments; returns the checked share."""
    if warmup_boundary not in WARMUP_BOUNDARIES:
        raise ValueError(f"warmup_boundary must be one of {WARMUP_BOUNDARIES}, got {warmup_boundary!r}")
    if not 0 < warmup_share < 1:
        raise ValueError(f"warmup_share must be in (0, 1), got {warmup_share!r}")
    return float(warmup_share)


def user_bounders(privacy_unit, m, M, schedule, max_users, warmup_boundary):
    """(warm-up bounder, stream bounder, the bounding's report): all None for the document
    unit, which takes none of the user arguments."""
    if privacy_unit not in PRIVACY_UNITS:
        raise ValueError(f"privacy_unit must be one of {PRIVACY_UNITS}, got {privacy_unit!r}")
    if privacy_unit == "document":
        if m is not None or M is not None or schedule != "uniform":
            raise ValueError("max_docs_per_user_epoch, max_docs_per_user and user_weights "
                             "bound users: set privacy_unit='user' to use them")
        return None, None, None
    if warmup_boundary == "count":
        raise ValueError("privacy_unit='user' needs a per-document warm-up boundary "
                         "(timestamps=, stream_start=): a row count can move documents of "
                         "many users across it")
    m = DEFAULT_MAX_DOCS_PER_USER_EPOCH if m is None else check_positive_int(
        "max_docs_per_user_epoch", m)
    M = m if M is None else check_positive_int("max_docs_per_user", M)
    if schedule not in SCHEDULES:
        raise ValueError(f"user_weights must be one of {SCHEDULES}, got {schedule!r}")
    cfg = dict(max_docs_per_epoch=m, max_docs=M, schedule=schedule,
               max_users=check_max_users(max_users))
    # one weight sequence per side: a user may have documents in the warm-up and in the
    # stream; the two sums compose sequentially (both charged to the stream partition)
    warmup_users, stream_users = UserBounder(**cfg), UserBounder(**cfg)
    return warmup_users, stream_users, bounding_report(stream_users)


def default_accountant(accountant, epsilon, delta, privacy_unit: str):
    """The given accountant, or a private in-memory one with this (ε, δ) budget; a user-unit
    estimator refuses a document-level accountant."""
    if accountant is None and epsilon is not None:
        accountant = Accountant(epsilon, delta, MemoryLedger(), unit=privacy_unit)
    if (privacy_unit == "user" and accountant is not None
            and getattr(accountant, "privacy_unit", "user") != "user"):
        raise ValueError("privacy_unit='user' with a document-level accountant: create it "
                         "with Accountant(..., unit='user') so its ledger records and "
                         "enforces the user unit")
    return accountant


def spend_session(accountant, run_id, unit: str = "document"):
    """The spender every draw goes through: a keyed session on an Accountant."""
    if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()
                               or run_id.startswith("refuse:")):
        raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
    if not isinstance(accountant, Accountant):
        # an EventLog or another BudgetSpender: unkeyed
        return (accountant if unit == "document" or accountant is None
                else UnitSpender(accountant, unit))
    store = output_store_for(accountant)
    if run_id is None and getattr(accountant.ledger, "path", None) is not None:
        raise ValueError(
            f"the accountant's ledger {accountant.ledger!r} is durable: give run_id='...' "
            "naming this run, so that re-running it after a crash reuses its reservations "
            "and persisted outputs instead of spending the budget again (a new run_id "
            "spends anew)")
    return SpendSession(accountant, scope=run_id or uuid.uuid4().hex, store=store, unit=unit)
