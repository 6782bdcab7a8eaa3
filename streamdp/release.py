"""Release: noise the sketch sums, whiten, decompose, un-whiten, denoise (DESIGN §3-4).

Pipeline for sums Σ over N (weighted) stream documents, subspace Q (d × k'):

1. plan the Gaussian events from the ρ budget and its per-block split, hand them
   to the accountant (reserve, durably) — only then draw noise;
2. N ← noised count; M1 = m1/N, Z = z/N, S1, S2 (noised, or derived from the
   noised m1 and z as S1 = QᵀM1, S2 = QᵀZ — free post-processing);
3. K = S2 − a S1S1ᵀ = V Λ Vᵀ; keep the top k, floor small eigenvalues, W = V_k Λ_k^{-1/2};
4. T = T3(W,W,W), T3 = S3 − b(S2⊗S1 + perms) + c S1^{⊗3};
5. robust tensor power method → (λ_i, v_i): on a once-noised T ("tensor"), or
   with noise on every query of the raw S3 sum ("iterative", seed 003 Alg. 3);
6. α_i = 4α0(α0+1)/((α0+2)²λ_i²);  μ_i = ((α0+2)/2) λ_i (Z − a M1 (M1ᵀQ)) W v_i;
7. zero entries below τ × their known noise standard deviation, clip negatives,
   renormalise to the simplex.
"""
from __future__ import annotations

import math
from typing import Callable
from dataclasses import dataclass

import numpy as np

from streamdp.moments.clipping import ClipBounds
from streamdp.moments.reference import lda_coefficients, whiten3
from streamdp.moments.sketch import SketchSums, symmetrize3
from streamdp.privacy.events import STREAM, BudgetSpender, EventLog, GaussianEvent
from streamdp.privacy.noise import GaussianSampler
from streamdp.privacy.plan import BudgetSplit, plan_release
from streamdp.privacy.rounding import DEFAULT_MAX_DOCUMENTS_PER_SUM, require_within_premise
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.privacy.report import release_report
from streamdp.privacy.kept_draws import KeptDraws, kept_or_fresh
from streamdp.privacy.spend import ARRAY_CODEC, Codec, spend
from streamdp.snapshot import TopicSnapshot
from streamdp.tensor.power_method import ExactOracle, PowerMethodConfig, robust_power_method
from streamdp.tensor.private import NoisyQueryOracle
from streamdp.whitening.subspace import Subspace

# Blocks a private release may leave out (their k'-space images s1/s2 are noised instead).
WITHHOLDABLE = ("m1", "z")


def noise_sums(sums: SketchSums, events: list[GaussianEvent], sampler: GaussianSampler,
               Q: np.ndarray, *, max_documents: int | None = DEFAULT_MAX_DOCUMENTS_PER_SUM) -> SketchSums:
    """Add the planned noise to each block; derive un-noised s1/s2 from m1/z.

    Noise goes through ``sampler.add_noise`` (for OpenDP's sampler the true
    values pass through the vetted mechanism). Blocks without an event (s3
    under the iterative mechanism, everything when non-private) pass through
    un-noised: their consumer must noise its own queries. s2 and s3 are
    returned symmetrised.

    Before any draw, a private call refuses sums of more than ``max_documents`` documents
    (the premise of the sensitivities' rounding headroom; DocumentCountExceeded).
    ``max_documents=None``: the caller has decided the premise by a noised, charged check
    (streamdp.continual, docs/privacy.md "The premise check") and no exact count may refuse.
    """
    if events and max_documents is not None:
        require_within_premise(sums.n_docs, max_documents, "release")
    by_block = {e.block: e for e in events}
    out = {}
    for name in ("count", "m1", "z", "s1", "s2", "s3"):
        value = getattr(sums, name)
        e = by_block.get(name)
        if e is not None and name == "count":
            value = float(sampler.add_noise(np.array([float(value)]), e.sigma)[0])
        elif e is not None:
            value = sampler.add_noise(value, e.sigma)
        elif events and name in WITHHOLDABLE:
            # a private release that does not buy this block must not pass it on raw
            value = np.zeros_like(value)
        out[name] = value
    if "s1" not in by_block:
        out["s1"] = Q.T @ out["m1"]
    if "s2" not in by_block:
        out["s2"] = Q.T @ out["z"]
    out["s2"] = 0.5 * (out["s2"] + out["s2"].T)
    out["s3"] = symmetrize3(out["s3"])
    return SketchSums(**out)


def noise_scales(events: list[GaussianEvent], multiplier: float = 1.0) -> dict[str, float]:
    """Standard deviation of the noise on each released block sum.

    ``multiplier`` is √(number of independently noised sums added together),
    e.g. √popcount(t) for a tree release. s1/s2 derived from m1/z inherit their sd.
    """
    sd = {e.block: e.sigma * multiplier for e in events if e.block != "s3_query"}
    if sd:
        sd.setdefault("s1", sd.get("m1", 0.0))
        sd.setdefault("s2", sd.get("z", 0.0))
    return sd


def _pairs(E2: np.ndarray, M1: np.ndarray) -> np.ndarray:
    """E2⊗M1 + its two distinct permutations: [a,b,c] = E2_ab M1_c + E2_ac M1_b + E2_bc M1_a."""
    return (np.einsum("ab,c->abc", E2, M1) + np.einsum("ac,b->abc", E2, M1)
            + np.einsum("bc,a->abc", E2, M1))


def qspace_moments(S1: np.ndarray, S2: np.ndarray, S3: np.ndarray | None, alpha0: float):
    """K = S2 − a S1S1ᵀ (= QᵀM2Q) and T3 = S3 − b(S2⊗S1 + perms) + c S1^{⊗3} (= M3(Q,Q,Q)).

    Inputs are normalised (divided by N). ``S3=None`` returns only the public
    correction part of T3 (everything but S3), used by the iterative mechanism.
    """
    a, b, c = lda_coefficients(alpha0)
    K = S2 - a * np.outer(S1, S1)
    T3 = -b * _pairs(S2, S1) + c * np.einsum("a,b,c->abc", S1, S1, S1)
    if S3 is not None:
        T3 = T3 + S3
    return 0.5 * (K + K.T), T3


@dataclass(frozen=True)
class DenoiseConfig:
    """τ: entries of μ_i below τ × their noise standard deviation are zeroed."""

    threshold: float = 2.0
    eig_floor: float = 1e-9

    def __post_init__(self) -> None:
        if not (self.threshold >= 0 and math.isfinite(self.threshold)):
            raise ValueError(f"denoising threshold must be >= 0, got {self.threshold}")
        if not (0 < self.eig_floor < 1):
            raise ValueError(f"eig_floor must be in (0, 1), got {self.eig_floor}")


def release_topics(sums: SketchSums, subspace: Subspace, *, n_topics: int, alpha0: float,
                   rho: float | None, clip: ClipBounds, mechanism: str = "tensor",
                   split: BudgetSplit = BudgetSplit(), sampler: GaussianSampler | None = None,
                   spender: BudgetSpender | None = None,
                   power: PowerMethodConfig = PowerMethodConfig(),
                   denoise: DenoiseConfig = DenoiseConfig(), partition: str = STREAM,
                   label: str | Callable[[], str] = "release", epoch: int | None = None,
                   max_documents: int = DEFAULT_MAX_DOCUMENTS_PER_SUM,
                   kept: KeptDraws | None = None,
                   premise_checked: bool = False) -> TopicSnapshot:
    """Run the whole release on closed sums. ``rho=None``: the non-private estimator.

    ``max_documents``: the premise N_max (docs/privacy.md "Floating point"); a private
    release of a larger sum is refused before anything is reserved or drawn, unless
    ``premise_checked``: the caller decided the premise by the noised, charged check
    (:mod:`streamdp.privacy.premise`; the estimator's ``release``) and passes noise-only
    sums when it failed, so no exact count may refuse.

    ``kept`` (issue 23 item 4): the tensor mechanism's draw (the noised sums) is kept there
    before the decomposition, so a caller who retries after a post-processing exception
    gets the same noised sums decomposed again, never a new draw. The iterative mechanism
    draws during its decomposition (the power-method queries): the whole decomposition is
    one draw, kept only once it returned (docs/privacy.md says what that means).
    ``label``: the draw's name, or a function giving it (called only when a draw is made)."""
    _check_topics(subspace, n_topics, alpha0)
    private = rho is not None
    n_queries = power.n_queries(n_topics) if mechanism == "iterative" else 0
    events = (plan_release(rho, clip, split, mechanism, n_queries, partition,
                           max_documents=max_documents) if private else [])
    if private and sampler is None:
        raise ValueError("a private release needs a noise sampler")
    # None: no exact count may refuse (the caller's noised check decided the premise)
    refuse_over = None if premise_checked else max_documents
    if private and refuse_over is not None:
        require_within_premise(sums.n_docs, refuse_over, "release")
    spender = spender if spender is not None else EventLog()
    name = label if callable(label) else (lambda: label)
    noise_sd = noise_scales(events) if private else None

    if mechanism == "iterative" and private:
        def draw():
            # Every draw of this release (the s-blocks' noise and the power-method queries)
            # happens in here, between reserve and persist.
            noisy = noise_sums(sums, events, sampler, Q=subspace.Q, max_documents=refuse_over)
            q = next(e for e in events if e.block == "s3_query")

            def oracle_factory(W, T3_public, N):
                # s3 has no event under this mechanism: noisy.s3 is the raw (symmetrised) sum
                s3_sens = block_sensitivities(clip, max_documents=max_documents)["s3"]
                return NoisyQueryOracle(whiten3(noisy.s3, W), whiten3(T3_public, W), N, s3_sens,
                                        W, q.sigma / q.sensitivity, q.count, sampler)

            return (*decompose_sums(
                noisy, subspace, n_topics=n_topics, alpha0=alpha0, noise_sd=noise_sd,
                power=power, denoise=denoise, oracle_factory=oracle_factory,
                return_subspace_topics=True), float(noisy.count))

        # reserve → draw → persist → commit (streamdp.privacy.spend); the persisted output
        # is the release itself, since the iterative mechanism draws during decomposition
        topic_word, alpha, lambdas, U, n_docs = kept_or_fresh(
            kept, lambda: spend(spender, events, label=name(), draw=draw, fulfil=False))
    else:
        # reserve → draw → persist (the noised sums) → commit; the decomposition is
        # post-processing of the kept/persisted noised sums (issue 23 item 4)
        noisy = kept_or_fresh(kept, lambda: spend(
            spender, events, label=name(), codec=SUMS_CODEC,
            draw=lambda: noise_sums(sums, events, sampler, Q=subspace.Q,
                                    max_documents=refuse_over)))
        topic_word, alpha, lambdas, U = decompose_sums(
            noisy, subspace, n_topics=n_topics, alpha0=alpha0, noise_sd=noise_sd, power=power,
            denoise=denoise, return_subspace_topics=True)
        n_docs = float(noisy.count)
    privacy = release_report(mechanism=mechanism, events=events,
                             noise_sd=noise_scales(events) if private else {}, clip=clip,
                             split=split, sampler=sampler, power=power,
                             denoise_threshold=denoise.threshold, max_documents=max_documents)
    return TopicSnapshot(topic_word=topic_word, alpha=alpha, eigenvalues=lambdas,
                         n_docs=n_docs, privacy=privacy,
                         mechanism=mechanism if private else "none",
                         subspace_id=subspace.id, epoch=epoch, subspace_topics=U)


def _encode_sums(s: SketchSums):
    return ARRAY_CODEC.encode((float(s.count), s.m1, s.z, s.s1, s.s2, s.s3))


def _decode_sums(x) -> SketchSums:
    v = ARRAY_CODEC.decode(x)
    if not (isinstance(v, tuple) and len(v) == 6):
        raise ValueError("the persisted output of this release is not a set of noised sums (it "
                         "was written by a version that persisted the decomposed topics): finish "
                         "that run with the version that started it, or use a new run_id")
    return SketchSums(*v)


#: How an output store keeps a release's noised sums (the tensor mechanism's draw).
SUMS_CODEC = Codec(_encode_sums, _decode_sums)


def _check_topics(subspace: Subspace, n_topics: int, alpha0: float) -> None:
    if not 1 <= n_topics <= subspace.dim:
        raise ValueError(f"n_topics={n_topics} must be between 1 and the subspace dimension "
                         f"{subspace.dim}")
    if not alpha0 > 0:
        raise ValueError(f"alpha0 must be > 0, got {alpha0}")


def tensor_snr(noisy: SketchSums, *, n_topics: int, alpha0: float,
               noise_sd: dict[str, float] | None) -> float:
    """The whitened tensor's signal-to-noise index of released sums: λ_k^{3/2}·N / (σ₃·√k).

    Whitening by W (‖W‖₂ = λ_k^{-1/2}, λ_k the k-th eigenvalue of the released K) scales the
    noise of each entry of S3/N (sd σ₃/N) by up to ‖W‖₂³, and a k×k×k Gaussian tensor has
    spectral norm about √k times its entries' sd, while the whitened signal's eigenvalues are
    O(1) (≥ 2√(α0+1)/(α0+2)): the index is about the smallest signal eigenvalue over the
    noise's spectral norm. λ_k within the noise on K (2σ₂√k'/N, the floor of
    :func:`decompose_sums`) gives 0: that whitening direction is noise. Released values (count,
    s1, s2) and public σ only: post-processing. Without noise (``noise_sd`` None): ∞."""
    if noise_sd is None:
        return math.inf
    N = max(float(noisy.count), 1.0)
    Kmat, _ = qspace_moments(noisy.s1 / N, noisy.s2 / N, None, alpha0)
    lam_k = float(np.sort(np.linalg.eigvalsh(Kmat))[::-1][n_topics - 1])
    if lam_k <= 2.0 * noise_sd["s2"] / N * math.sqrt(Kmat.shape[0]):
        return 0.0
    return lam_k ** 1.5 * N / (noise_sd["s3"] * math.sqrt(n_topics))


def decompose_sums(noisy: SketchSums, subspace: Subspace, *, n_topics: int, alpha0: float,
                   noise_sd: dict[str, float] | None, power: PowerMethodConfig = PowerMethodConfig(),
                   denoise: DenoiseConfig = DenoiseConfig(), oracle_factory=None,
                   return_subspace_topics: bool = False):
    """Topics from already-noised (or exact) sums — pure post-processing, spends nothing.

    Parameters
    ----------
    noisy : SketchSums        released sums (s2, s3 symmetric)
    noise_sd : dict or None   sd of the noise on each block sum (``noise_scales``);
                              None = exact sums (no eigenvalue floor, no thresholding)
    oracle_factory : callable (W, T3_public, N) -> oracle, optional
                              replaces the exact oracle on the whitened T3 (the
                              iterative mechanism noises its own queries)

    return_subspace_topics : bool
                              also return U = Qᵀμ (k' × k), the topics in k'-space
                              (what a refinement pass folds documents into)

    When z or m1 was withheld (``noise_sd`` without "z" or "m1", a
    :meth:`BudgetSplit.spectral_start` release), topics are un-whitened through the
    subspace instead: μ_i ≈ Q U_i, clipped and renormalised (coarse: it is a start).

    Returns
    -------
    topic_word : (k, d)   rows on the simplex
    alpha : (k,)
    lambdas : (k,)        power-method eigenvalues
    U : (k', k)           only with ``return_subspace_topics``
    """
    _check_topics(subspace, n_topics, alpha0)
    Q = subspace.Q
    k_prime = subspace.dim
    private = noise_sd is not None
    N = max(float(noisy.count), 1.0)
    a = lda_coefficients(alpha0)[0]
    M1, Z = noisy.m1 / N, noisy.z / N
    S1, S2 = noisy.s1 / N, noisy.s2 / N

    # --- whitening in k'-space
    Kmat, T3 = qspace_moments(S1, S2, None if oracle_factory else noisy.s3 / N, alpha0)
    evals, evecs = np.linalg.eigh(Kmat)
    order = np.argsort(evals)[::-1][:n_topics]
    lam, V = evals[order], evecs[:, order]
    floor = denoise.eig_floor * max(lam[0], np.finfo(float).tiny)
    if private:
        # spectral norm of the symmetrised noise on K is about 2σ√k' (σ per entry)
        floor = max(floor, 2.0 * noise_sd["s2"] / N * math.sqrt(k_prime))
    lam = np.maximum(lam, floor)
    W = V / np.sqrt(lam)                                     # (k', k)

    # --- the whitened tensor and its decomposition
    oracle = oracle_factory(W, T3, N) if oracle_factory else ExactOracle(whiten3(T3, W))
    lambdas, Vt = robust_power_method(oracle, n_topics, power)
    lambdas = np.maximum(lambdas, 1e-12)

    # --- un-whitening through Z and denoising
    alpha = 4 * alpha0 * (alpha0 + 1) / ((alpha0 + 2) ** 2 * lambdas**2)
    M1Q = M1 @ Q                                             # (k',)
    M2Q = Z - a * np.outer(M1, M1Q)                          # (d, k')
    WV = W @ Vt                                              # (k', k)
    beta = (alpha0 + 2) / 2 * lambdas
    U = (Kmat @ WV) * beta                                   # (k', k) = Qᵀμ_i
    if private and ("z" not in noise_sd or "m1" not in noise_sd):
        mu = Q @ U                                           # z or m1 withheld
    else:
        mu = (M2Q @ WV) * beta                               # (d, k) columns = topics
    if private and "z" in noise_sd and "m1" in noise_sd:
        sz, sm = noise_sd["z"] / N, noise_sd["m1"] / N
        sd = beta * np.sqrt(sz**2 * np.sum(WV**2, axis=0) + (a * sm * (M1Q @ WV))**2)
        mu = np.where(mu >= denoise.threshold * sd[None, :], mu, 0.0)
    topic_word = project_rows_to_simplex(mu.T)
    if return_subspace_topics:
        return topic_word, alpha, lambdas, U
    return topic_word, alpha, lambdas


def project_rows_to_simplex(M: np.ndarray) -> np.ndarray:
    """Clip negatives and renormalise each row to sum 1 (uniform if nothing is left)."""
    M = np.maximum(np.asarray(M, dtype=np.float64), 0.0)
    s = M.sum(axis=1, keepdims=True)
    d = M.shape[1]
    return np.where(s > 0, M / np.where(s > 0, s, 1.0), 1.0 / d)
