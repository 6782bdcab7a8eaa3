"""The budget plan: how ρ is split between blocks, between warm-up and stream, and the
Gaussian events of one release, all decided before any noise is drawn (DESIGN §4).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.events import STREAM, WARMUP, GaussianEvent, sigma_for_rho
from streamdp.privacy.rounding import DEFAULT_MAX_DOCUMENTS_PER_SUM
from streamdp.privacy.sensitivity import block_sensitivities

MECHANISMS = ("tensor", "iterative")


@dataclass(frozen=True)
class BudgetSplit:
    """Fractions of the stream's ρ spent on each block (must sum to 1).

    A zero share for s1 or s2 means "derive it from the noised m1 / z" (S1 = QᵀM1,
    S2 = QᵀZ), which is post-processing and costs nothing. The default puts most
    of the budget on z, whose noise dominates the topic error (DESIGN §7).
    """

    z: float = 0.75
    s3: float = 0.15
    m1: float = 0.08
    count: float = 0.02
    s1: float = 0.0
    s2: float = 0.0

    def __post_init__(self) -> None:
        shares = asdict(self)
        bad = {k: v for k, v in shares.items() if not (math.isfinite(v) and v >= 0)}
        if bad:
            raise ValueError(f"budget shares must be finite and >= 0, got {bad}")
        for required in ("s3", "count"):
            if shares[required] <= 0:
                raise ValueError(f"budget share for block {required!r} must be > 0 "
                                 "(it is released in every private release)")
        # z (d × k') and m1 (d) may be withheld only when their k'-space images are released
        # directly: the release is then a subspace model (topics via Q, for refinement)
        for full, small in (("z", "s2"), ("m1", "s1")):
            if shares[full] <= 0 and shares[small] <= 0:
                raise ValueError(f"budget share for block {full!r} or {small!r} must be > 0")
        total = sum(shares.values())
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"budget shares must sum to 1, got {total:.6g} ({shares})")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @property
    def full_space(self) -> bool:
        """Whether z and m1 are released (topics can be un-whitened through z)."""
        return self.z > 0 and self.m1 > 0

    @classmethod
    def spectral_start(cls) -> "BudgetSplit":
        """The split of a spectral release that only starts a refinement (docs/estimator.md).

        Refinement needs the model in k'-space only (θ by least squares on Qᵀc/l), so
        nothing is spent on the d-dimensional z and m1; most goes to the tensor s3, whose
        noise limits the start on real text (measured: docs/benchmarks.md).
        """
        return cls(z=0.0, m1=0.0, s1=0.03, s2=0.15, s3=0.80, count=0.02)


#: share of ρ the warm-up gets when it is charged to the stream partition (a row-count boundary,
#: or the user unit); the stream keeps the rest
WARMUP_SHARE = 0.25


@dataclass(frozen=True)
class WarmupPlan:
    """How ρ is shared between the warm-up's draws and the stream: ONE rule, used by
    ``StreamingSpectralLDA`` and the release service (docs/privacy.md, "The user-level unit").

    ``clip_rho``: the clip-norm histograms (None: fixed clip bounds, or non-private);
    ``subspace_rho``: the DP range finder; ``stream_rho``: every stream release;
    ``where``: the warm-up events' ``partition``/``sensitivity_factor`` (empty: the warm-up is
    its own atom, parallel composition with the stream); ``premise``: the noised check of the
    rounding premise N_max on the warm-up's document count (its ρ carved from the range
    finder's, docs/privacy.md "The premise check"), None when non-private."""

    clip_rho: float | None
    subspace_rho: float | None
    stream_rho: float | None
    where: dict
    premise: "PremiseCheck | None" = None

    @property
    def premise_partition(self) -> str:
        """The partition the premise check is charged to: the warm-up events' own."""
        return self.where.get("partition", WARMUP)

    @property
    def sequential(self) -> bool:
        """Whether the warm-up is charged to the stream partition (sequential composition)."""
        return bool(self.where)


def warmup_plan(rho: float | None, *, privacy_unit: str = "document",
                warmup_boundary: str = "document", warmup_share: float = WARMUP_SHARE,
                auto_clip: bool = True, clip_budget_share: float = 0.05,
                user_max_documents: int | None = None) -> WarmupPlan:
    """The :class:`WarmupPlan` of a ρ budget.

    * per-document (time) boundary, document unit: the warm-up documents are disjoint from the
      stream's — parallel composition, each side has all of ρ;
    * row-count boundary: the same documents may sit on either side — sequential, on the stream
      partition, ``warmup_share`` of ρ, sensitivity factor 2 (a replace moves one row across);
    * user unit: a user may have documents on both sides — sequential, on the stream partition,
      ``warmup_share`` of ρ, sensitivity factor 1 (add/remove of the user).

    The warm-up's premise check (a noised count of its documents against N_max) gets
    :data:`PREMISE_SHARE` of the range finder's ρ: sensitivity 1 per document (user unit: M =
    ``user_max_documents``, a user's most documents of weight > 0), times the sensitivity factor
    (a row-count boundary: 2, conservatively).
    """
    if privacy_unit not in ("document", "user"):
        raise ValueError(f"privacy_unit must be 'document' or 'user', got {privacy_unit!r}")
    if rho is None:
        return WarmupPlan(None, None, None, {})
    warm, stream, where = rho, rho, {}
    if warmup_boundary == "count":
        warm, stream = rho * warmup_share, rho * (1.0 - warmup_share)
        where = {"partition": STREAM, "sensitivity_factor": 2.0}
    elif privacy_unit == "user":
        warm, stream = rho * warmup_share, rho * (1.0 - warmup_share)
        where = {"partition": STREAM, "sensitivity_factor": 1.0}
    clip_rho = warm * clip_budget_share if auto_clip else None
    if privacy_unit == "user" and user_max_documents is None:
        raise ValueError("a private user-level warm-up needs user_max_documents (M, the premise "
                         "check's sensitivity)")
    sens = (float(user_max_documents) if privacy_unit == "user" else 1.0) \
        * float(where.get("sensitivity_factor", 1.0))
    subspace_rho, premise = premise_split(warm - clip_rho if auto_clip else warm,
                                          checks_per_atom=1, sensitivity=sens)
    return WarmupPlan(clip_rho, subspace_rho, stream, where, premise)


def plan_release(rho: float, clip: ClipBounds, split: BudgetSplit, mechanism: str,
                 n_queries: int = 0, partition: str = STREAM, *,
                 max_documents: int = DEFAULT_MAX_DOCUMENTS_PER_SUM) -> list[GaussianEvent]:
    """Every Gaussian event of one release, before any noise is drawn.

    For ``mechanism="iterative"`` the s3 share buys ``n_queries`` noisy power-method
    queries instead of one noised s3 block: one event with sensitivity 1 and
    sigma = ν (the per-query noise multiplier; each query's actual σ is ν times
    its own sensitivity, see :mod:`streamdp.tensor.private`).
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    sens = block_sensitivities(clip, max_documents=max_documents)
    events = []
    for block, share in split.as_dict().items():
        if share == 0:
            continue
        r = rho * share
        if block == "s3" and mechanism == "iterative":
            if n_queries < 1:
                raise ValueError("the iterative mechanism needs the number of power-method queries")
            events.append(GaussianEvent("s3_query", 1.0, sigma_for_rho(1.0, r, n_queries),
                                        count=n_queries, partition=partition, mechanism=mechanism))
        else:
            events.append(GaussianEvent(block, sens[block], sigma_for_rho(sens[block], r),
                                        partition=partition, mechanism=mechanism))
    return events


#: the noised premise check of the continual release (docs/privacy.md "The premise check"): the
#: share of the stream's ρ it is carved from, and z of its margin N_max − z·σ_p (Φ(−12) ≈ 1.8e-33
#: per check, charged to δ)
PREMISE_SHARE = 1e-4
PREMISE_Z = 12.0
PREMISE_BLOCK = "premise_count"


def gaussian_tail(z: float) -> float:
    """Φ(−z), rounded up (erfc is accurate to a few ulps; 1e-9 relative covers them)."""
    return math.erfc(z / math.sqrt(2.0)) / 2.0 * (1.0 + 1e-9)


@dataclass(frozen=True)
class PremiseCheck:
    """One noised check of the rounding premise N_max: ñ = n + N(0, σ²) of the documents in the
    largest raw sum an epoch would noise; the epoch is drawn from its sums iff
    ñ ≤ N_max − z·σ (:meth:`passes`), else from noise only (as an empty epoch).

    ``sensitivity``: 1 (a document) or M (a user's most documents of weight > 0; under first-K
    admission the displaced user's rows leave as the new user's enter, so the count still moves
    by ≤ M). ``rho`` per check = the premise share of ρ_stream / ``checks_per_atom`` (how many
    checks one document's or user's count can enter), so all checks cost ≤ share·ρ_stream per
    atom; ``delta`` = Φ(−z + (s − 1)/σ) ≥ the probability that a neighbour of a sum over N_max
    passes (Φ(−z) for documents)."""

    rho: float
    sensitivity: float
    sigma: float
    z: float
    delta: float
    checks_per_atom: int

    def threshold(self, max_documents: int) -> float:
        return float(max_documents) - self.z * self.sigma

    def passes(self, noisy_count: float, max_documents: int) -> bool:
        """THE decision: from the released ñ and public constants only."""
        return float(noisy_count) <= self.threshold(max_documents)

    def event(self, partition: str) -> GaussianEvent:
        return GaussianEvent(PREMISE_BLOCK, self.sensitivity, self.sigma, partition=partition,
                             mechanism="premise", delta=self.delta)

    def to_dict(self) -> dict:
        return asdict(self)


def premise_split(stream_rho: float, *, checks_per_atom: int, sensitivity: float = 1.0,
                  share: float = PREMISE_SHARE, z: float = PREMISE_Z) -> tuple[float, PremiseCheck]:
    """(ρ left for the stream's releases, the :class:`PremiseCheck`): ``share`` of ρ_stream is
    carved out for the premise checks, the releases keep the rest (the one place)."""
    if not (0 < share < 1):
        raise ValueError(f"premise share must be in (0, 1), got {share!r}")
    checks = int(checks_per_atom)
    if checks < 1:
        raise ValueError(f"checks_per_atom must be >= 1, got {checks_per_atom!r}")
    rho = stream_rho * share / checks
    sigma = sigma_for_rho(float(sensitivity), rho)
    # a neighbour of a count over N_max has a count ≥ N_max − s + 1: it passes with probability
    # ≤ Φ(−z + (s − 1)/σ) (docs/privacy.md "The premise check", proof (b))
    delta = gaussian_tail(z - (float(sensitivity) - 1.0) / sigma)
    return stream_rho * (1.0 - share), PremiseCheck(rho, float(sensitivity), sigma, float(z),
                                                    delta, checks)
