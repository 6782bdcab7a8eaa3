"""Topic trends with error bars, and significant share changes, from released values only.

What a trend point is. A refined release carries ``topic_mass`` (k,): the row sums of the
released (noised) refinement sums T over the epochs it covers (streamdp.refinement: row i of
T is topic i's expected word mass, each document weighing l/‖c‖₂ ∈ [1, √l]). The difference
of two consecutive releases' masses is the mass of the epochs between them; topic i's *share*
of an epoch is

    s_i = m_i / M,     m = topic_mass(t) − topic_mass(u),   M = Σ_j m_j

Noise, known exactly. Every entry of T carries Gaussian noise that is a fixed linear
combination of independent draws of the continual mechanism (the binary tree: one draw per
noised node, each of the same σ; BLT: one per epoch, weighted by the prefix sums of C⁻¹'s
coefficients); the snapshot's privacy report names them (``nodes_summed`` / ``blt`` and
``noise_sd``). :func:`noise_coefficients` rebuilds that combination, so the noise of m_i is
N(0, d·‖a‖²) with a = coef(t) − coef(u) (d entries per row, rows independent), and the
covariance of two epochs' masses is d·(a·b). The share interval is the delta method on
s = m/M: Var(s_i) ≈ d‖a‖²·(1 − 2s_i + k s_i²)/M² (exact to first order in noise/M; M is
thousands of noise sd in any deployment worth trending). No new statistic, no budget:
post-processing of released values.

A significant change (:func:`share_changes`): for consecutive points A, B whose documents were
both folded into models that sum at least MIN_MODEL_EPOCHS = 5 refined epochs (epoch e's model
sums e − 2L of them at lag L; earlier models still differ from one another by more than noise,
so shares move with the model: no test before epoch 2L + 6), and topic i,
D = s_i(B) − s_i(A) with Var(D) from the same linear form (cross term d·(a·b)·g_A·g_B) plus
the stream's own variation: two epochs are two samples of documents, and under the LDA model
the release fits (configured α0, public) a share over n documents varies by about
s_i(1 − s_i)/((α0 + 1)·n) (n from the released counts). Without that term a stationary stream
"changes" at every release: 3000 documents per epoch move a share as much as the noise. The
change is significant when |D| / sd(D) > z*, z* = Φ⁻¹(1 − α/(2k)): a two-sided test per topic
at level α/k, so the probability that a release reports any change on a stationary stream is
≤ α (Bonferroni over the k topics), α = :data:`CHANGE_ALPHA` = 1 % by default.

Pure numerical code: no Kafka, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Iterable, Sequence

import numpy as np

from streamdp.privacy.blt_factorization import BLTParams

#: the display interval of a share (gauges streamdp_topic_share_lower/upper, the report's bands)
INTERVAL_LEVEL = 0.95
#: the family-wise false-positive rate of the change test per release (Bonferroni over k)
CHANGE_ALPHA = 0.01
REFINE_BLOCK = "topic_word"


def z_for_interval(level: float = INTERVAL_LEVEL) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def z_for_change(k: int, alpha: float = CHANGE_ALPHA) -> float:
    """z* of the change test: two-sided at α/k per topic (Bonferroni over k topics)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return NormalDist().inv_cdf(1.0 - alpha / (2.0 * max(int(k), 1)))


def noise_coefficients(snap) -> dict | None:
    """The noise on each entry of ``snap``'s released refinement sums, as {draw: coefficient}
    over independent standard normal draws (coefficients in absolute units). ``{}`` for a
    non-private release (no noise); None when the snapshot carries no topic masses.

    Draw names are shared across the releases of one deployment, so the noise of a difference
    of two releases is the difference of their dictionaries."""
    if getattr(snap, "topic_mass", None) is None:
        return None
    priv = snap.privacy or {}
    sd = float((priv.get("noise_sd") or {}).get(REFINE_BLOCK) or 0.0)
    if sd <= 0.0:
        return {}
    if snap.epoch is None:          # a one-shot release: one draw of its own
        return {("release", snap.release_id): sd}
    t = int(snap.epoch)
    blt = priv.get("blt")
    if blt:
        params = BLTParams.from_dict(blt)
        P = np.cumsum(params.inverse_coefs(t))            # prefix noise = Σ_j P_{t−j} z_j
        unit = sd / math.sqrt(float(np.sum(P * P)))       # = sd / noise_multiplier
        return {("blt", j): unit * float(P[t - j]) for j in range(1, t + 1)}
    nodes = priv.get("nodes_summed")
    if nodes:
        unit = sd / math.sqrt(len(nodes))                 # every node is noised with one σ
        return {("node", int(a), int(b)): unit for a, b in nodes}
    # an aggregator this module does not know: independent of every other release
    return {("release", snap.release_id): sd}


def _minus(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, v in b.items():
        out[key] = out.get(key, 0.0) - v
    return out


def _dot(a: dict, b: dict) -> float:
    if len(b) < len(a):
        a, b = b, a
    return float(sum(v * b.get(key, 0.0) for key, v in a.items()))


def _refined_epochs(snap) -> int | None:
    ref = (snap.privacy or {}).get("refinement") or {}
    n = ref.get("refined_epochs")
    return None if n is None else int(n)


#: the change test starts once both epochs were folded into models that sum at least this many
#: refined epochs: each model adds one epoch to the refinement sums, so early models differ
#: from one another by more than noise and shares move with the model. Measured on shuffled
#: Debian descriptions (docs/benchmarks.md §Topic trends): every false alarm of models with
#: 1-4 refined epochs, none beyond sampling at 5 and more
MIN_MODEL_EPOCHS = 5


def _model_epochs(snap, first_epoch) -> int | None:
    """How many refined epochs the model that epoch ``first_epoch``'s documents were folded
    into sums (public: the model rule, streamdp.refinement.model_epoch_for): epoch e's model is
    the snapshot of e − L, whose refinement sums cover epochs L + 1 … e − L, i.e. e − 2L of
    them (≤ 0: the spectral start). None when the release says nothing about it."""
    if snap.epoch is None or first_epoch is None:
        return None
    lag = ((snap.privacy or {}).get("refinement") or {}).get("model_lag")
    return None if lag is None else int(first_epoch) - 2 * int(lag)


@dataclass(frozen=True, eq=False)
class TrendPoint:
    """Topic shares of the epochs (``first_epoch`` … ``epoch``) a release added.

    ``share``/``sd``/``lower``/``upper`` are (k,) arrays, NaN where the release carries no
    refined mass for those epochs (``note`` says why). ``lower``/``upper``: the
    :data:`INTERVAL_LEVEL` interval, clipped to [0, 1]."""

    release_id: str
    epoch: int | None
    first_epoch: int | None
    created_at: float
    share: np.ndarray
    sd: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    mass: float                      # M, the noised total mass of those epochs
    sampling_sd: np.ndarray | None = None   # the stream's own variation (see module doc)
    #: refined epochs in the model these epochs' documents were folded into (None: unknown,
    #: e.g. a one-shot release); :func:`share_changes` needs ≥ MIN_MODEL_EPOCHS on both sides
    model_epochs: int | None = None
    new_topics: tuple[int, ...] = ()
    note: str | None = None
    _coef: dict = field(default_factory=dict, repr=False)
    _d: int = 0

    @property
    def valid(self) -> bool:
        return bool(np.all(np.isfinite(self.share)))

    def _grad(self, i: int) -> np.ndarray:
        g = np.full(self.share.shape, -self.share[i] / self.mass)     # ∂s_i/∂m_j
        g[i] += 1.0 / self.mass
        return g

    def to_dict(self) -> dict:
        def num(x):
            return [None if not math.isfinite(v) else float(v) for v in np.asarray(x, float)]
        return {"release_id": self.release_id, "epoch": self.epoch,
                "first_epoch": self.first_epoch, "created_at": self.created_at,
                "share": num(self.share), "sd": num(self.sd), "lower": num(self.lower),
                "upper": num(self.upper), "new_topics": list(self.new_topics), "note": self.note}


@dataclass(frozen=True)
class ShareChange:
    """Topic ``topic``'s share moved from ``before`` to ``after`` between two trend points;
    ``z`` = (after − before)/sd of the difference; ``significant`` when |z| > ``threshold``."""

    epoch: int | None
    previous_epoch: int | None
    topic: int
    before: float
    after: float
    sd: float
    z: float
    threshold: float
    significant: bool
    new_topic: bool = False

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in self.__dict__.items()}


def _nan_point(snap, first, note: str) -> TrendPoint:
    k = np.asarray(snap.alpha).shape[0]
    nan = np.full(k, np.nan)
    return TrendPoint(snap.release_id, snap.epoch, first, float(snap.created_at), nan, nan, nan,
                      nan, float("nan"), new_topics=tuple(snap.new_topics), note=note)


def trend_point(snap, previous=None, *, level: float = INTERVAL_LEVEL) -> TrendPoint:
    """The shares of the epochs ``snap`` added after ``previous`` (the release before it in the
    same deployment; None: everything ``snap`` covers)."""
    same_chain = (previous is not None and previous.subspace_id == snap.subspace_id
                  and previous.epoch is not None and snap.epoch is not None
                  and int(previous.epoch) < int(snap.epoch))
    if previous is not None and not same_chain:
        previous = None
    first = None if snap.epoch is None else (int(previous.epoch) + 1 if previous else 1)
    coef = noise_coefficients(snap)
    if coef is None:
        return _nan_point(snap, first, "no topic masses (a spectral-only release or an older "
                                       "snapshot): shares need the refinement's released sums")
    mass = np.asarray(snap.topic_mass, dtype=np.float64)
    refined_now = _refined_epochs(snap)
    if previous is not None:
        pcoef = noise_coefficients(previous)
        if pcoef is None:
            return _nan_point(snap, first, "the previous release carries no topic masses")
        mass = mass - np.asarray(previous.topic_mass, dtype=np.float64)
        coef = _minus(coef, pcoef)
        refined_before = _refined_epochs(previous)
    else:
        refined_before = 0
    if snap.epoch is not None and refined_now is not None and refined_before is not None:
        if refined_now - refined_before != int(snap.epoch) - (first - 1):
            return _nan_point(snap, first, "epoch(s) whose documents were not refined (the "
                                           "first model_lag epochs): no topic mass")
    k, d = mass.shape[0], int(np.asarray(snap.topic_word).shape[1])
    M = float(mass.sum())
    var_row = d * _dot(coef, coef)
    if not M > 0 or not math.isfinite(M):
        return _nan_point(snap, first, "no mass above the noise in these epochs")
    share = mass / M
    # ∂s_i/∂m_j = (δ_ij − s_i)/M: ‖∇s_i‖² = (1 − 2s_i + k s_i²)/M²
    sd = np.sqrt(var_row * np.maximum(1.0 - 2.0 * share + k * share ** 2, 0.0)) / M
    z = z_for_interval(level)
    # documents of these epochs: the difference of the released (noised) counts
    n = float(snap.n_docs) - (float(previous.n_docs) if previous is not None else 0.0)
    alpha0 = float(np.sum(np.asarray(snap.alpha, dtype=np.float64)))
    samp = np.sqrt(np.clip(share, 0, 1) * np.clip(1 - share, 0, 1)
                   / ((alpha0 + 1.0) * max(n if n > 0 else M, 1.0)))
    return TrendPoint(snap.release_id, snap.epoch, first, float(snap.created_at), share, sd,
                      np.clip(share - z * sd, 0.0, 1.0), np.clip(share + z * sd, 0.0, 1.0), M,
                      sampling_sd=samp, model_epochs=_model_epochs(snap, first), new_topics=tuple(snap.new_topics), _coef=coef, _d=d)


def share_changes(a: TrendPoint, b: TrendPoint, *, alpha: float = CHANGE_ALPHA,
                  sampling: bool = True,
                  min_model_epochs: int = MIN_MODEL_EPOCHS) -> list[ShareChange]:
    """Each topic's change from point ``a`` to the next point ``b``, tested at family-wise
    level ``alpha`` per release (Bonferroni over k). Empty when either point has no shares."""
    if not (a.valid and b.valid) or a.share.shape != b.share.shape:
        return []
    if any(p.model_epochs is not None and p.model_epochs < min_model_epochs for p in (a, b)):
        return []           # the models still settle: their change, not the stream's (module doc)
    k = a.share.shape[0]
    zstar = z_for_change(k, alpha)
    aa, bb, ab = _dot(a._coef, a._coef), _dot(b._coef, b._coef), _dot(a._coef, b._coef)
    out = []
    for i in range(k):
        ga, gb = a._grad(i), b._grad(i)
        var = a._d * (bb * gb @ gb + aa * ga @ ga - 2.0 * ab * (ga @ gb))
        if sampling:        # two epochs' documents: independent draws from the stream
            var += float(a.sampling_sd[i]) ** 2 + float(b.sampling_sd[i]) ** 2
        sd = math.sqrt(max(var, 0.0))
        diff = float(b.share[i] - a.share[i])
        z = diff / sd if sd > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
        out.append(ShareChange(b.epoch, a.epoch, i, float(a.share[i]), float(b.share[i]), sd, z,
                               zstar, abs(z) > zstar, i in b.new_topics))
    return out


@dataclass(frozen=True, eq=False)
class Trends:
    """Trend points of a sequence of releases, and the share changes between consecutive ones."""

    points: list[TrendPoint]
    changes: list[list[ShareChange]]        # changes[j]: from points[j−1] to points[j] ([] for j=0)
    level: float = INTERVAL_LEVEL
    alpha: float = CHANGE_ALPHA

    @property
    def significant(self) -> list[ShareChange]:
        return [c for cs in self.changes for c in cs if c.significant]

    def to_dict(self) -> dict:
        return {"kind": "topic_trends", "v": 1, "interval_level": self.level,
                "change_alpha": self.alpha,
                "change_test": (f"two-sided z-test per topic at {self.alpha:g}/k (Bonferroni over "
                                f"k topics: at most {self.alpha:.0%} of releases of a stationary "
                                "stream report a change)"),
                "points": [p.to_dict() for p in self.points],
                "changes": [[c.to_dict() for c in cs] for cs in self.changes]}


def trends(snaps: Iterable, *, level: float = INTERVAL_LEVEL, alpha: float = CHANGE_ALPHA,
           min_model_epochs: int = MIN_MODEL_EPOCHS) -> Trends:
    """Trend points of releases given in release order (each ``release_id`` once)."""
    points: list[TrendPoint] = []
    changes: list[list[ShareChange]] = []
    prev = None
    for snap in snaps:
        p = trend_point(snap, prev, level=level)
        changes.append(share_changes(points[-1], p, alpha=alpha, min_model_epochs=min_model_epochs)
                       if points else [])
        points.append(p)
        prev = snap
    return Trends(points, changes, level, alpha)


class TrendTracker:
    """Follows a deployment's releases one at a time (the release service): keeps the previous
    release and its point. :meth:`observe` returns the new point and its changes; a release seen
    already (a re-publication) returns None. :meth:`seed` takes a restored release without
    reporting it (after a restart the next release has a point but no change test)."""

    def __init__(self, *, level: float = INTERVAL_LEVEL, alpha: float = CHANGE_ALPHA,
                 min_model_epochs: int = MIN_MODEL_EPOCHS) -> None:
        self.level, self.alpha, self.min_model_epochs = level, alpha, min_model_epochs
        self.previous = None
        self.point: TrendPoint | None = None

    def seed(self, snap) -> None:
        self.previous, self.point = snap, None

    def observe(self, snap) -> tuple[TrendPoint, list[ShareChange]] | None:
        if self.previous is not None and snap.release_id == self.previous.release_id:
            return None
        p = trend_point(snap, self.previous, level=self.level)
        ch = (share_changes(self.point, p, alpha=self.alpha, min_model_epochs=self.min_model_epochs)
              if self.point is not None else [])
        self.previous, self.point = snap, p
        return p, ch


def format_table(tr: Trends, labels: Sequence[str] | None = None) -> str:
    """Plain text: one line per release, each topic's share ± half-interval; '*' marks a
    significant change from the release before."""
    lines = [f"topic shares per release ({tr.level:.0%} intervals; * = significant change at "
             f"{tr.alpha:.0%} per release, Bonferroni over k)"]
    for p, cs in zip(tr.points, tr.changes):
        span = ("one-shot" if p.epoch is None else
                f"epoch {p.epoch}" if p.first_epoch == p.epoch else f"epochs {p.first_epoch}-{p.epoch}")
        if not p.valid:
            lines.append(f"  {span}: {p.note}")
            continue
        sig = {c.topic for c in cs if c.significant}
        cells = []
        for i, s in enumerate(p.share):
            half = (p.upper[i] - p.lower[i]) / 2
            name = labels[i] if labels else f"{i}"
            cells.append(f"{name} {100 * s:.1f}±{100 * half:.1f}%{'*' if i in sig else ''}")
        lines.append(f"  {span}: " + "  ".join(cells))
    return "\n".join(lines)
