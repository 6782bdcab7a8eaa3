"""Differentially private whitening warm-up: a randomized range finder on E2.

    Y = Σ_n clip(e2_n Ω) + N(0, σ_w²)^{d×k'},    Q = orth(Y)

Ω is a public, seeded d × k' matrix with orthonormal columns (orthonormal rather
than i.i.d. Gaussian so that ‖e2 Ω‖_F ≤ ‖e2‖_F ≤ 1 and the exact per-document
norm is cheap, see :func:`streamdp.moments.clipping.projected_e2_norm`).
range(E2) = span(μ), so E2 alone suffices; no M1 and no count are spent here.

The sum has L2 sensitivity C_w (the warm-up clip bound) under add/remove of one
document, plus twice the rounding bound R_w of the computed sum (chunked, compensated
accumulation; :mod:`streamdp.privacy.rounding`) — Δ_w from
:func:`streamdp.privacy.sensitivity.block_sensitivities`. The Gaussian mechanism with σ_w costs
ρ = Δ_w²/(2σ_w²) on the warm-up partition only: warm-up documents are never used again
(DESIGN §4).
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular

from streamdp import serialization as ser
from streamdp.documents import MIN_DOC_LENGTH, as_count_batch
from streamdp.moments import clipping
from streamdp.moments.accumulator import ChunkedAccumulator, Part
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy import rounding
from streamdp.privacy.events import WARMUP, BudgetSpender, EventLog, GaussianEvent, sigma_for_rho
from streamdp.privacy.noise import GaussianSampler
from streamdp.privacy.plan import PremiseCheck
from streamdp.privacy.premise import check_report, draw_noisy_count
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.privacy.spend import spend
from streamdp.whitening.subspace import Subspace

#: the warm-up sketch's state. v2: every field present; v1 states are migrated
#: (:func:`_sketch_v1_to_v2`)
SCHEMA_VERSION = 2
#: the persisted warm-up draw (:class:`WarmupDraw`). v2: ``premise_check`` present (None when
#: no check decided the draw); v1 records are migrated (:func:`_draw_v1_to_v2`)
DRAW_VERSION = 2


def test_matrix(d: int, k_prime: int, seed: int) -> np.ndarray:
    """Public random d × k' matrix with orthonormal columns (seeded)."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((d, k_prime))
    Q, R = np.linalg.qr(G)
    return Q * np.sign(np.diag(R))   # unique QR: reproducible across LAPACKs


def orthonormal_basis(Y: np.ndarray) -> np.ndarray:
    """Q of the QR factorisation Y = QR with diag(R) > 0 (unique), for a tall d × k' matrix.

    Cholesky QR applied twice (Yamamoto et al. 2015): two Gram products and two k' × k'
    Cholesky factorisations, ≈ 10× faster than Householder QR at d = 50k, k' = 100 (it is
    BLAS-3 throughout), orthogonal to working precision when cond(Y) ≲ 10⁷. Householder QR
    is the fallback when the Gram matrix is not numerically positive definite or the result
    is not orthonormal to 10⁻¹². Post-processing of the noised Y: no privacy effect.
    """
    Y = np.asarray(Y, dtype=np.float64)
    try:
        Q = Y
        for _ in range(2):
            R = np.linalg.cholesky(Q.T @ Q).T                  # upper, positive diagonal
            Q = solve_triangular(R, Q.T, trans="T", lower=False).T   # Q R⁻¹
        if np.abs(Q.T @ Q - np.eye(Q.shape[1])).max() <= 1e-12 and np.all(np.isfinite(Q)):
            return Q
    except np.linalg.LinAlgError:
        pass
    Q, R = np.linalg.qr(Y)
    return Q * np.where(np.diag(R) < 0, -1.0, 1.0)


# Log-spaced bins for the private norm histograms: every block norm lies in (0, 1].
NORM_BIN_EDGES = np.logspace(-6.0, 0.0, 121)
NORM_BLOCKS = ("m1", "e2", "e3")


def quantile_from_histogram(counts: np.ndarray, q: float) -> float:
    """Upper bin edge where the cumulative (noisy, clipped at 0) count first reaches q."""
    c = np.maximum(np.asarray(counts, float), 0.0)
    total = c.sum()
    if total <= 0:
        return 1.0
    idx = int(np.searchsorted(np.cumsum(c), q * total))
    # bin j covers [edge_{j-1}, edge_j) with an underflow bin 0 and overflow bin 121
    return float(NORM_BIN_EDGES[min(idx, len(NORM_BIN_EDGES) - 1)])


def check_clip_quantile(quantile: float) -> None:
    if not 0 < quantile <= 1:
        raise ValueError(f"clip quantile must be in (0, 1], got {quantile!r}")


def clip_bounds_from_histogram(hist: np.ndarray, quantile: float, warmup_clip: float) -> ClipBounds:
    """The stream clip bounds from the (noised) norm histograms: post-processing only."""
    check_clip_quantile(quantile)
    m1, e2, e3 = (quantile_from_histogram(h, quantile) for h in hist)
    return ClipBounds(m1=m1, z=e2, s3=e3, warmup=warmup_clip)


def subspace_from_draw(Y: np.ndarray, events: list[GaussianEvent], *, omega_seed: int,
                       clip: float, premise_check: dict | None = None) -> Subspace:
    """Q = orth(Y) from the (noised) range sum: post-processing only, deterministic, so a
    kept or persisted draw gives the same subspace every time it is post-processed.
    ``premise_check``: the warm-up's noised premise check (:func:`premise_decision`), reported."""
    Q = orthonormal_basis(Y)
    provenance = {"source": "dp-range-finder" if events else "range-finder (non-private)",
                  "omega_seed": int(omega_seed), "clip": float(clip),
                  "events": [e.to_dict() for e in events]}
    if premise_check is not None:
        provenance["premise_check"] = dict(premise_check)
    return Subspace(Q, provenance=provenance)


PREMISE_LABEL = "warmup-premise"


def premise_decision(warm: "WarmupSketch", check: PremiseCheck, noisy_count: float,
                     max_documents: int) -> tuple["WarmupSketch", dict]:
    """The warm-up's premise rule (issue 23 item 2, docs/privacy.md "The premise check"), from
    the released ñ and public constants only: the warm-up's own sums if ``check.passes``, else an
    empty warm-up of the same public parameters — released from noise only, on schedule, never
    refused. Returns (the sketch to draw from, the check's report)."""
    report = check_report(check, noisy_count, max_documents)
    return (warm if report["passed"] else warm.noise_only()), report


class WarmupSketch:
    """Accumulates Σ clip(e2_n Ω) in O(d·k') memory.

    Parameters
    ----------
    d : int            vocabulary size
    k_prime : int      subspace dimension k' (= k + oversampling)
    clip : float       public bound C_w on ‖e2_n Ω‖_F (1 = never clips)
    seed : int         public seed of Ω
    """

    def __init__(self, d: int, k_prime: int, clip: float = 1.0, seed: int = 0) -> None:
        if not 1 <= k_prime <= d:
            raise ValueError(f"subspace dimension k' must be in [1, d={d}], got {k_prime}")
        if not clip > 0:
            raise ValueError(f"warm-up clip bound must be > 0, got {clip}")
        rounding.check_vocabulary(d)
        self.d, self.k_prime, self.clip, self.seed = d, k_prime, float(clip), int(seed)
        self.omega = test_matrix(d, k_prime, seed)
        self._omega_rn2 = np.einsum("ij,ij->i", self.omega, self.omega)
        # chunks of exactly BATCH_ROWS_MAX documents of this sketch's own sequence (as in
        # WhitenedSketch): the range sum does not depend on how the callers batched
        self.acc = ChunkedAccumulator({"yacc": (d, k_prime), "a2": (d,)},
                                      rounding.BATCH_ROWS_MAX, rows_of=d)
        # histograms of the full-space norms ‖c‖/l, ‖e2‖_F, ‖e3‖_F (3 × 122 bins)
        self.norm_hist = np.zeros((len(NORM_BLOCKS), len(NORM_BIN_EDGES) + 1))
        self.n_docs = 0
        self._n_clipped = 0            # in processed chunks

    # the accumulators' parts as attributes: the arrays themselves (value = acc + lo)
    yacc, a2 = Part(), Part()
    yacc_lo, a2_lo = Part("yacc", low=True), Part("a2", low=True)
    pending = property(lambda self: self.acc.pending, doc="the open chunk's rows")
    pending_weights = property(lambda self: self.acc.pending_weights)

    def update(self, X, weights=None, in_histogram=None) -> "WarmupSketch":
        """Add warm-up documents. User-level unit (:mod:`streamdp.privacy.user_bounding`):
        ``weights`` (n,) multiply each document's clip factor in the range sum (rows of
        weight 0 are left out), and only rows with ``in_histogram`` > 0 (each user's first
        warm-up document) are counted in the clip histogram, with that count (1, or 1/2 under
        first-K admission), so a user adds ≤ 1 to one bin of each histogram and the counts
        stay exact (multiples of 1/2)."""
        X = as_count_batch(X, self.d)
        lengths = np.asarray(X.sum(axis=1)).ravel()
        keep = lengths >= MIN_DOC_LENGTH
        w = None
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64).ravel()
            if w.shape[0] != X.shape[0] or not np.all((w >= 0) & (w <= 1)):
                raise ValueError(f"{X.shape[0]} documents need {X.shape[0]} weights in [0, 1]")
            keep &= w > 0
        if in_histogram is not None:
            in_histogram = np.asarray(in_histogram, dtype=np.float64).ravel()
            if in_histogram.shape[0] != X.shape[0] or w is None \
                    or not np.all((in_histogram >= 0) & (in_histogram <= 1)) \
                    or np.any((in_histogram > 0) & ~(w > 0)):
                raise ValueError("in_histogram needs weights and one count in [0, 1] per "
                                 "document, > 0 only for documents of weight > 0")
        if not keep.all():
            X = X[keep]
            w = None if w is None else w[keep]
            in_histogram = None if in_histogram is None else in_histogram[keep]
        if X.shape[0] == 0:
            return self
        lengths = np.asarray(X.sum(axis=1)).ravel()
        self.n_docs += X.shape[0]
        # the norm histograms are counts in multiples of 1/2 (exact in any order): per batch
        counted = None if in_histogram is None else in_histogram > 0
        H = X if counted is None else X[counted]
        hl = lengths if counted is None else lengths[counted]
        hw = None if counted is None else in_histogram[counted]
        if H.shape[0]:
            norms = (np.sqrt(clipping.row_sums(H, H.data**2)) / hl,
                     clipping.e2_norm(H, hl), clipping.e3_norm(H, hl))
            for b, n in enumerate(norms):
                self.norm_hist[b] += np.bincount(np.searchsorted(NORM_BIN_EDGES, n, side="right"),
                                                 weights=hw, minlength=self.norm_hist.shape[1])
        self.acc.feed(X, w, self._update_chunk)
        return self

    def _flush_pending(self) -> None:
        """Process the pending rows as this sketch's final chunk (ends its chunk sequence)."""
        self.acc.close(self._update_chunk)

    def copy(self) -> "WarmupSketch":
        """An independent copy of the state (Ω, public, is shared: never written)."""
        out = object.__new__(WarmupSketch)
        out.__dict__.update(self.__dict__)
        out.norm_hist = self.norm_hist.copy()
        out.acc = self.acc.copy()
        return out

    def _update_chunk(self, X, weights: np.ndarray | None = None) -> None:
        if X.shape[0] == 0:
            return
        lengths = np.asarray(X.sum(axis=1)).ravel()
        U = X @ self.omega
        scale = self._scale(X, lengths, U)
        if weights is not None:
            scale = scale * weights          # user-level weight (docs/privacy.md)
        w2 = scale / (lengths * (lengths - 1))
        Xt = X.T.tocsr()
        self.acc.add("yacc", Xt @ (U * w2[:, None]))
        self.acc.add("a2", Xt @ w2)
        self._n_clipped += int(np.count_nonzero(scale < 1))

    def _scale(self, X, lengths, U) -> np.ndarray:
        norm = clipping.projected_e2_norm(X, lengths, U, self.omega, self._omega_rn2)
        # the pre-cancellation magnitude is bounded too: the rounding bound R_w scales with it
        mag = clipping.projected_e2_magnitude(X, lengths, U, self._omega_rn2)
        return clipping.scale_factor({"w": norm, "w_mag": mag},
                                     {"w": self.clip, "w_mag": rounding.MAGNITUDE_FACTOR * self.clip})

    @property
    def n_clipped(self) -> int:
        """Documents scaled down by the warm-up clip (pending rows included; diagnostics)."""
        n = self._n_clipped
        if self.pending.n:
            X = self.pending.rows()
            lengths = np.asarray(X.sum(axis=1)).ravel()
            n += int(np.count_nonzero(self._scale(X, lengths, X @ self.omega) < 1))
        return n

    def clip_bounds(self, quantile: float, rho: float | None, sampler: GaussianSampler | None = None,
                    spender: BudgetSpender | None = None, *, partition: str = WARMUP,
                    sensitivity_factor: float = 1.0) -> tuple[ClipBounds, list[GaussianEvent]]:
        """Stream clip bounds at the ``quantile`` of the warm-up documents' block norms.

        Each document adds one to one bin of each of the three histograms, so the
        concatenated histogram has L2 sensitivity √3 under add/remove; it is
        released once with the Gaussian mechanism (cost ``rho`` on the warm-up
        partition) and the quantiles are post-processing. Full-space norms bound
        the whitened ones (‖e2 Q‖ ≤ ‖e2‖, ‖e3(Q,Q,Q)‖ ≤ ‖e3‖), so at most about
        1 − quantile of similar stream documents are clipped.

        The draw (:meth:`draw_histogram`) and the quantiles (:func:`clip_bounds_from_histogram`)
        are separate steps so that a caller can keep the draw across a failure (issue 23 item 4).
        ``partition`` and ``sensitivity_factor``: see :meth:`plan`.
        """
        check_clip_quantile(quantile)
        hist, events = self.draw_histogram(rho, sampler, spender, partition=partition,
                                           sensitivity_factor=sensitivity_factor)
        return clip_bounds_from_histogram(hist, quantile, self.clip), events

    def draw_histogram(self, rho: float | None, sampler: GaussianSampler | None = None,
                       spender: BudgetSpender | None = None, *, partition: str = WARMUP,
                       sensitivity_factor: float = 1.0) -> tuple[np.ndarray, list[GaussianEvent]]:
        """The noised norm histograms (3 × 122) and their event: the clip bounds' one draw.
        ``rho=None``: the exact histograms, no event."""
        hist = self.norm_hist
        events = []
        if rho is not None:
            sens = float(np.sqrt(len(NORM_BLOCKS))) * float(sensitivity_factor)
            e = GaussianEvent("clip_histogram", sens, sigma_for_rho(sens, rho),
                              partition=partition, mechanism="warmup")
            events.append(e)
            if sampler is None:
                raise ValueError("a private clip histogram needs a noise sampler")
            noisy = hist
            hist = spend(spender if spender is not None else EventLog(), events,
                         label="warmup-clip-histogram",
                         draw=lambda: sampler.add_noise(noisy, e.sigma))
        return hist, events

    def draw_premise_count(self, check: PremiseCheck, sampler: GaussianSampler | None,
                           spender: BudgetSpender | None = None, *,
                           partition: str = WARMUP) -> float:
        """ñ = n + N(0, σ_p²) of the warm-up's documents (rows of weight > 0, pending rows
        included): the premise check's one draw, through the spend protocol (label
        ``warmup-premise``), before the histogram's and the range finder's."""
        return draw_noisy_count(check, self.n_docs, sampler, spender, partition=partition,
                                label=PREMISE_LABEL)

    def noise_only(self) -> "WarmupSketch":
        """An empty warm-up of the same public parameters (d, k', clip, Ω seed): what a warm-up
        whose premise check failed is drawn from."""
        return WarmupSketch(self.d, self.k_prime, clip=self.clip, seed=self.seed)

    def merge(self, other: "WarmupSketch") -> "WarmupSketch":
        if (other.d, other.k_prime, other.clip, other.seed) != (self.d, self.k_prime, self.clip, self.seed):
            raise ValueError("cannot merge warm-up sketches with different d, k', clip or Ω seed")
        # each side's pending rows are its own final chunk (never one chunk of both sides)
        self._flush_pending()
        if other.pending.n:
            other = other.copy()
            other._flush_pending()
        self.acc.merge(other.acc)
        self.norm_hist += other.norm_hist
        self.n_docs += other.n_docs
        self._n_clipped += other._n_clipped     # other: flushed above
        return self

    def range_sum(self) -> np.ndarray:
        """Σ_n scale_n e2_n Ω, shape (d, k'). Pending rows: one final chunk, on a copy."""
        if self.pending.n:
            work = self.copy()
            work._flush_pending()
            return work.range_sum()
        return self.acc.value("yacc") - self.acc.value("a2")[:, None] * self.omega

    def plan(self, rho: float | None, *, partition: str = WARMUP,
             sensitivity_factor: float = 1.0,
             max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> list[GaussianEvent]:
        """The range finder's event. By default the warm-up is its own partition (documents
        routed by a per-document rule: parallel composition with the stream). A boundary
        that can move documents (a row count) charges the stream partition instead, with
        ``sensitivity_factor=2``: adding one row replaces a warm-up document (docs/privacy.md).
        ``max_documents``: the premise N_max of the rounding headroom."""
        if rho is None:
            return []
        clip = ClipBounds(m1=1.0, z=1.0, s3=1.0, warmup=self.clip)
        sens = block_sensitivities(clip, max_documents=max_documents)["warmup"] * float(sensitivity_factor)
        return [GaussianEvent("warmup", sens, sigma_for_rho(sens, rho),
                              partition=partition, mechanism="warmup")]

    def subspace(self, rho: float | None, sampler: GaussianSampler | None = None,
                 spender: BudgetSpender | None = None, *, partition: str = WARMUP,
                 sensitivity_factor: float = 1.0,
                 max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> Subspace:
        """Release Q = orth(Σ clip(e2 Ω) + noise). ``rho=None``: no noise (non-private).

        Refuses (DocumentCountExceeded, nothing spent) a warm-up of more than
        ``max_documents`` documents: the premise of the rounding headroom. The draw
        (:meth:`draw_range`) and the orthonormalisation (:func:`subspace_from_draw`) are
        separate steps so that a caller can keep the draw across a failure (issue 23 item 4)."""
        Y, events = self.draw_range(rho, sampler, spender, partition=partition,
                                    sensitivity_factor=sensitivity_factor,
                                    max_documents=max_documents)
        return subspace_from_draw(Y, events, omega_seed=self.seed, clip=self.clip)

    def draw_range(self, rho: float | None, sampler: GaussianSampler | None = None,
                   spender: BudgetSpender | None = None, *, partition: str = WARMUP,
                   sensitivity_factor: float = 1.0,
                   max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM,
                   premise_checked: bool = False
                   ) -> tuple[np.ndarray, list[GaussianEvent]]:
        """Y = Σ clip(e2 Ω) + noise (d × k') and its event: the range finder's one draw.
        ``rho=None``: the exact sum, no event. ``premise_checked``: the caller decided the premise
        N_max by the noised check (:func:`premise_decision`): no exact count may refuse."""
        if self.n_docs == 0 and rho is None:
            raise ValueError("the warm-up has seen no documents of length >= 3; "
                             "call warmup() with documents before partial_fit()")
        events = self.plan(rho, partition=partition, sensitivity_factor=sensitivity_factor,
                           max_documents=max_documents)
        if events and not premise_checked:
            rounding.require_within_premise(self.n_docs, max_documents, "warm-up range finder")
        Y = self.range_sum()
        if events:
            if sampler is None:
                raise ValueError("a private warm-up needs a noise sampler")
            raw = Y
            Y = spend(spender if spender is not None else EventLog(), events, label="warmup",
                      draw=lambda: sampler.add_noise(raw, events[0].sigma))
        return Y, events

    def to_bytes(self) -> bytes:
        return ser.dumps({"kind": "warmup_sketch", "v": SCHEMA_VERSION, "d": self.d,
                          "k_prime": self.k_prime, "clip": self.clip, "seed": self.seed,
                          "n_docs": self.n_docs, "n_clipped": self._n_clipped,
                          "yacc": ser.pack_array(self.yacc), "a2": ser.pack_array(self.a2),
                          "yacc_lo": ser.pack_array(self.yacc_lo), "a2_lo": ser.pack_array(self.a2_lo),
                          "norm_hist": ser.pack_array(self.norm_hist),
                          **self.acc.rows_to_dict()})

    @classmethod
    def from_bytes(cls, data: bytes) -> "WarmupSketch":
        obj = ser.upgrade(ser.loads(data), "warmup_sketch", SCHEMA_VERSION, {1: _sketch_v1_to_v2})
        ser.require(obj, "warmup_sketch", "d", "k_prime", "clip", "seed", "n_docs", "n_clipped",
                    "yacc", "a2", "yacc_lo", "a2_lo", "norm_hist", "pending")
        out = cls(int(obj["d"]), int(obj["k_prime"]), float(obj["clip"]), int(obj["seed"]))
        out.yacc = ser.unpack_array(obj["yacc"], name="yacc")
        out.a2 = ser.unpack_array(obj["a2"], name="a2")
        out.acc.lo["yacc"] = ser.unpack_array(obj["yacc_lo"], name="yacc_lo").copy()
        out.acc.lo["a2"] = ser.unpack_array(obj["a2_lo"], name="a2_lo").copy()
        if out.yacc_lo.shape != out.yacc.shape or out.a2_lo.shape != out.a2.shape:
            raise ser.SchemaError("warm-up compensation arrays have the wrong shape")
        out.norm_hist = ser.unpack_array(obj["norm_hist"], name="norm_hist")
        out.n_docs, out._n_clipped = int(obj["n_docs"]), int(obj["n_clipped"])
        out.acc.load_rows(obj)
        return out


def _sketch_v1_to_v2(obj: dict) -> dict:
    """A v1 warm-up sketch state as v2 (the one migration of this kind): v1 states written
    before the rounding work carry no compensation (their value is exact as is) and no pending
    rows (their chunks were all processed)."""
    out = dict(obj)
    for name in ("yacc", "a2"):
        out.setdefault(f"{name}_lo", ser.pack_array(np.zeros_like(ser.unpack_array(obj[name], name=name))))
    out.setdefault("pending", {"n": 0})
    return out


def _draw_v1_to_v2(obj: dict) -> dict:
    """A v1 warm-up draw as v2: records written before the premise check have none."""
    return {**obj, "premise_check": obj.get("premise_check")}



class WarmupDraw:
    """The warm-up's noised values, kept (and persisted by the release service) between the
    draws and the post-processing (issue 23 item 4): the noised norm histograms and their
    events, the noised range sum Y and its events, and the public parameters the
    post-processing needs. :meth:`post_process` is a deterministic function of them.
    ``premise_check``: the noised premise check that decided what Y was drawn from
    (:func:`premise_decision`; None if none did)."""

    KIND = "warmup_draw"

    def __init__(self, hist, hist_events, Y, events, *, omega_seed: int, clip: float,
                 n_docs: int, premise_check: dict | None = None) -> None:
        self.hist, self.Y = np.asarray(hist, dtype=np.float64), np.asarray(Y, dtype=np.float64)
        self.hist_events, self.events = list(hist_events), list(events)
        self.omega_seed, self.clip, self.n_docs = int(omega_seed), float(clip), int(n_docs)
        self.premise_check = None if premise_check is None else dict(premise_check)

    def post_process(self, quantile: float) -> tuple[ClipBounds, Subspace]:
        """The clip bounds (quantiles) and the subspace (orthonormal basis): no privacy cost."""
        clip = clip_bounds_from_histogram(self.hist, quantile, self.clip)
        return clip, subspace_from_draw(self.Y, self.events, omega_seed=self.omega_seed,
                                        clip=self.clip, premise_check=self.premise_check)

    def to_bytes(self) -> bytes:
        return ser.dumps({"kind": self.KIND, "v": DRAW_VERSION, "hist": ser.pack_array(self.hist),
                          "hist_events": [e.to_dict() for e in self.hist_events],
                          "Y": ser.pack_array(self.Y), "events": [e.to_dict() for e in self.events],
                          "omega_seed": self.omega_seed, "clip": self.clip, "n_docs": self.n_docs,
                          "premise_check": self.premise_check})

    @classmethod
    def from_bytes(cls, data: bytes) -> "WarmupDraw":
        obj = ser.upgrade(ser.loads(data), cls.KIND, DRAW_VERSION, {1: _draw_v1_to_v2})

        def events(items):
            return [GaussianEvent(**{k: v for k, v in e.items() if k != "rho"}) for e in items]
        return cls(ser.unpack_array(obj["hist"], name="hist"), events(obj["hist_events"]),
                   ser.unpack_array(obj["Y"], name="Y"), events(obj["events"]),
                   omega_seed=int(obj["omega_seed"]), clip=float(obj["clip"]),
                   n_docs=int(obj["n_docs"]), premise_check=obj["premise_check"])
