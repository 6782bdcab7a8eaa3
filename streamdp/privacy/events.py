"""Privacy events: immutable records of every noise draw.

Every Gaussian draw the engine makes is described, *before* it is drawn, by a
:class:`GaussianEvent`. The release code hands the full list of planned events to
a :class:`BudgetSpender` (the accountant) first; only if the spender accepts them
is noise drawn. Mechanisms never decide whether budget is available: that is the
accountant's job (the dp_accounting split between mechanisms and accountants).

Currency is zero-concentrated DP (zCDP, Bun & Steinke 2016). A Gaussian mechanism
with L2 sensitivity ``Δ`` and standard deviation ``σ`` is ρ-zCDP with
``ρ = Δ² / (2σ²)``; ``count`` independent draws of the same shape compose to
``count · ρ``.

Every event is charged for the input rounding of the samplers too (:data:`ROUNDING_SLACK`):
a vetted sampler rounds the value onto a lattice before adding lattice noise, which can move
two neighbouring inputs apart by up to the lattice's rounding distance s (OpenDP's privacy map
for ``make_gaussian`` with granularity 2^k: Δ + (2^k − 2^−1074)·√n). Every sampler keeps
s ≤ ROUNDING_SLACK·σ per ``add_noise`` call (each call draws one event, or one of its
``count`` draws), and :attr:`GaussianEvent.rho` charges (Δ + ROUNDING_SLACK·σ)²/(2σ²): the
one place where a draw's ρ is computed (docs/privacy.md, "Noise").
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

#: The σ-relative bound on any sampler's input-rounding term, per ``add_noise`` call: the
#: sensitivity every event is charged for is Δ + ROUNDING_SLACK·σ. The samplers enforce it
#: (streamdp.privacy.noise: ``sensitivity_slack(σ, n) <= ROUNDING_SLACK·σ`` before a draw).
ROUNDING_SLACK = 2.0**-40

# Data partitions with disjoint documents. A document belongs to exactly one of
# them (decided by the document alone), so its privacy loss is the maximum over
# partitions of the ρ spent on that partition (parallel composition), not the sum.
WARMUP = "warmup"
STREAM = "stream"
# The documents of the private vocabulary selection (streamdp.text.vocab_selection): a slice
# chosen by a rule of each document alone, disjoint from the warm-up and the stream.
VOCABULARY = "vocabulary"

# Continual release splits the stream further into epochs (by document
# timestamp, 1-based). A released sum that covers epochs a..b (inclusive) is
# tagged "stream:epochs=a-b"; plain "stream" covers every epoch, present and
# future (e.g. a one-shot release of the whole stream).
_EPOCHS_PREFIX = STREAM + ":epochs="
#: what one event's sensitivity protects (docs/privacy.md, "The user-level unit")
PRIVACY_UNITS = ("document", "user")


@dataclass(frozen=True)
class GaussianEvent:
    """One (or ``count`` identical) Gaussian mechanism invocations.

    Attributes
    ----------
    block : str
        What was noised ("z", "s3", "m1", "count", "warmup", "s3_query", ...).
    sensitivity : float
        L2 sensitivity of the released quantity under add/remove of one document
        (the enforced clip bound, or for power-method queries the derived bound).
    sigma : float
        Standard deviation of the Gaussian noise added to every coordinate.
    count : int
        Number of independent releases of this kind (e.g. power-method queries).
    partition : str
        The disjoint data partition whose documents the released sum covers.
    mechanism : str
        "tensor", "iterative" or "warmup": which release path drew it.
    delta : float
        0 for a Gaussian mechanism (pure ρ-zCDP). > 0 for a mechanism that is
        δ-approximately ρ-zCDP (Bun & Steinke 2016, Def. 8.1): ρ-zCDP except on an
        event of probability ≤ δ — e.g. OpenDP's ``make_gaussian_threshold`` partition
        selection, whose privacy map returns (ρ, δ). Under composition ρ's and δ's add
        (ibid., Lemma 8.3). The accountant accepts such events only on the
        ``"vocabulary"`` partition (streamdp.privacy.accountant).
    unit : str
        The privacy unit the sensitivity is for: ``"document"`` (add/remove one document) or
        ``"user"`` (add/remove every document of one user, under user-level contribution
        bounding: streamdp.privacy.user_bounding). Recorded in the ledger.
    """

    block: str
    sensitivity: float
    sigma: float
    count: int = 1
    partition: str = STREAM
    mechanism: str = "tensor"
    delta: float = 0.0
    unit: str = "document"

    def __post_init__(self) -> None:
        if not (self.sensitivity > 0 and self.sigma > 0):
            raise ValueError(
                f"GaussianEvent({self.block}): sensitivity and sigma must be > 0, "
                f"got {self.sensitivity}, {self.sigma}")
        if self.count < 1:
            raise ValueError(f"GaussianEvent({self.block}): count must be >= 1")
        if self.unit not in PRIVACY_UNITS:
            raise ValueError(f"GaussianEvent({self.block}): unit must be one of "
                             f"{PRIVACY_UNITS}, got {self.unit!r}")
        if not (0.0 <= self.delta < 1.0):
            raise ValueError(f"GaussianEvent({self.block}): delta must be in [0, 1), "
                             f"got {self.delta}")

    @property
    def noise_multiplier(self) -> float:
        """σ / (Δ + ROUNDING_SLACK·σ): the dp_accounting convention (add/remove neighbours) for
        the Gaussian this event is charged as, the samplers' rounding included."""
        return self.sigma / (self.sensitivity + ROUNDING_SLACK * self.sigma)

    @property
    def rho(self) -> float:
        """Total zCDP cost of the ``count`` releases, the sampler's rounding included:
        count·(Δ + ROUNDING_SLACK·σ)²/(2σ²)."""
        return self.count * (self.sensitivity / self.sigma + ROUNDING_SLACK)**2 / 2.0

    def to_dict(self) -> dict:
        out = {"block": self.block, "sensitivity": self.sensitivity,
               "sigma": self.sigma, "count": self.count,
               "partition": self.partition, "mechanism": self.mechanism,
               "rho": self.rho}
        if self.delta:       # only approximate events carry it (older records stay identical)
            out["delta"] = self.delta
        if self.unit != "document":     # likewise: document-level records are unchanged
            out["unit"] = self.unit
        return out


@dataclass(frozen=True)
class Partition:
    """A set of documents that other partitions never share (parallel composition).

    Attributes
    ----------
    kind : str
        ``"warmup"``, ``"stream"`` or ``"vocabulary"``.
    epochs : (int, int) or None
        For ``kind == "stream"``: the inclusive, 1-based epoch range the released
        sum covers, or ``None`` for every stream epoch (present and future).
        Always ``None`` for the warm-up.

    The per-document accounting unit ("atom") is the warm-up, or one stream
    epoch: a document belongs to exactly one atom, chosen by its own timestamp.
    """

    kind: str
    epochs: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.kind not in (WARMUP, STREAM, VOCABULARY):
            raise ValueError(f"partition kind must be {WARMUP!r}, {STREAM!r} or {VOCABULARY!r}, "
                             f"got {self.kind!r}")
        if self.epochs is not None:
            if self.kind != STREAM:
                raise ValueError("only stream partitions have epochs")
            a, b = self.epochs
            if not (isinstance(a, int) and isinstance(b, int) and 1 <= a <= b):
                raise ValueError(f"epoch range must satisfy 1 <= first <= last, got {self.epochs}")

    def __str__(self) -> str:
        if self.epochs is None:
            return self.kind
        return f"{_EPOCHS_PREFIX}{self.epochs[0]}-{self.epochs[1]}"

    def covers_epoch(self, epoch: int) -> bool:
        """Whether a stream document of ``epoch`` is in this partition."""
        if self.kind != STREAM:
            return False
        return self.epochs is None or self.epochs[0] <= epoch <= self.epochs[1]


_EPOCHS_RE = re.compile(r"stream:epochs=([1-9][0-9]*)-([1-9][0-9]*)")


def parse_partition(text: str) -> Partition:
    """Parse ``"warmup"``, ``"stream"``, ``"vocabulary"`` or ``"stream:epochs=a-b"`` (1 ≤ a ≤ b).

    Anything else raises ``ValueError``: an accountant must never guess which
    documents an unknown label covers.
    """
    if text == WARMUP or text == STREAM or text == VOCABULARY:
        return Partition(text)
    m = _EPOCHS_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"unknown partition {text!r}: expected {WARMUP!r}, {STREAM!r}, "
                         f"{VOCABULARY!r} or '{_EPOCHS_PREFIX}<first>-<last>'")
    return Partition(STREAM, (int(m.group(1)), int(m.group(2))))


def epoch_partition(first: int, last: int) -> str:
    """The partition string of stream epochs ``first..last`` (inclusive, 1-based)."""
    return str(Partition(STREAM, (int(first), int(last))))


def sigma_for_rho(sensitivity: float, rho: float, count: int = 1) -> float:
    """Noise standard deviation so that ``count`` draws cost ``rho`` in total, as
    :attr:`GaussianEvent.rho` charges them: count·(Δ/σ + ROUNDING_SLACK)²/2 = ρ, i.e.
    σ = Δ/(√(2ρ/count) − ROUNDING_SLACK)."""
    if rho <= 0:
        raise ValueError(f"rho must be > 0, got {rho}")
    per_draw = (2.0 * rho / count) ** 0.5
    if not per_draw > 2.0 * ROUNDING_SLACK:
        raise ValueError(f"rho={rho} over {count} draws is below the samplers' rounding "
                         f"resolution (√(2ρ/count) must exceed {2.0 * ROUNDING_SLACK:.3g})")
    return sensitivity / (per_draw - ROUNDING_SLACK)


def rho_by_partition(events: Sequence[GaussianEvent]) -> dict[str, float]:
    """Sum of ρ per data partition (sequential composition within a partition)."""
    out: dict[str, float] = {}
    for e in events:
        out[e.partition] = out.get(e.partition, 0.0) + e.rho
    return out


@runtime_checkable
class BudgetSpender(Protocol):
    """What a release needs from an accountant.

    ``reserve`` must durably record the events as spent (or raise, e.g.
    ``BudgetExhausted``) *before* any noise is drawn, and return a token;
    ``commit`` marks the reservation as released. A crash between the two still
    counts the reservation as spent.
    """

    def reserve(self, events: Sequence[GaussianEvent], *, label: str = "") -> object: ...

    def commit(self, token: object) -> None: ...


@dataclass
class EventLog:
    """The minimal spender: records events, enforces nothing.

    Used by the in-process estimator when no accountant is given; the snapshot's
    privacy report still lists every event.
    """

    events: list[GaussianEvent] = field(default_factory=list)

    def reserve(self, events: Sequence[GaussianEvent], *, label: str = "") -> object:
        self.events.extend(events)
        return len(self.events)

    def commit(self, token: object) -> None:
        return None
