"""Baseline: DeCarolis, Ram, Esmaeili, Wang & Huang (ICML 2020), "An end-to-end differentially
private Latent Dirichlet Allocation using a spectral algorithm" (shared/seeds/000, LaTeX in 001).

The paper's data flow (its Fig. 1): counts → M̂2 (e0), M̂3 (e1) → whitening Ŵ from the top-k
eigenpairs of M̂2 (e2) → T̂ = M̂3(Ŵ,Ŵ,Ŵ) (e3 on M̂3, e4 on Ŵ) → un-whitening Ŵ† (e5) → tensor
decomposition (e6) → (μ̄_i, ᾱ_i) (e7) → un-whitened output μ_i, α_i (e8 carries Ŵ†, e9 is the
output). §6 picks four cuts ("configurations") and puts Gaussian noise on every edge of the cut:

    1  (e3, e4, e8)  noise on M̂3 (for T̂) and on two copies of M̂2 (one for Ŵ, one for Ŵ†);
                     global sensitivities Δ2, Δ3 (Theorem 4, App. H.1-H.2); no Procedure 1.
    2  (e6, e8)      noise on the whitened tensor T̂ (local sensitivity Δ_T̂, Theorem 5 / eq. 64,
                     calibrated by Procedure 1's private lower bound σ̃_k of σ_k(M̂2)) and on
                     M̂2 for Ŵ† (Δ2).
    3  (e7, e8)      noise on the power-method output (μ̄_i, ᾱ_i) (Theorem 6 / App. H.4: each moves
                     ≤ 2√k Δ_T̂/γ_s; Procedure 1 releases σ̃_k and the eigen-gap γ̃_s) and on M̂2
                     for Ŵ† (Δ2).
    4  (e9)          noise on the final (μ_i, α_i) (Theorem 7 / App. H.5), Procedure 1 as in 3.

``fit(counts_csr, n_topics, *, epsilon, delta, seed, configuration, alpha0=1.0, **kw)`` returns
``(topic_word (k, d) rows on the simplex, info)``. ``epsilon=None`` is the non-private spectral
algorithm (flagged ``info["private"] = False``). When Procedure 1 returns ⊥ (a private lower bound
σ̃_k or γ̃_s too small for the sensitivity bound to be finite) nothing is estimated: the result is
the uniform topic matrix with ``info["refused"] = True`` — never a silent non-private fallback.

Privacy claimed (as the paper): (ε, δ)-DP at the document level, neighbouring corpora differ by
*replacing* one document (paper §3), N public; the parts compose by basic composition
(Prop. 19, Lemma 8: (ε1 + ε1' + ε, δ1 + δ1' + δ)).

Two calibrations (``calibration=``):

* ``"appendix"`` (default) — the explicit bounds of Appendix H (eq. 64 for Δ_T̂, H.4, H.5), the
  global sensitivities of Theorem 4 with their constants, and every data-dependent quantity in
  a noise scale replaced by a private bound (Procedure 1, extended where the paper uses a
  non-private value; see the notes below). Gaussian noise by the analytic Gaussian mechanism
  (Balle & Wang 2018, the paper's [4], App. B: valid for any ε, tighter than Prop. 18).
  Where the paper is ambiguous, the choice is the most favourable to the baseline *that is still
  a privacy guarantee under the paper's own lemmas*.
* ``"section6"`` — the noise exactly as §6 writes it: O(·) forms with constant 1
  (std 1/N · τ, k^1.5/(N σ̃_k^1.5) · τ, k²/(N γ̃_s σ̃_k^1.5) · τ, k² √σ1(M̂2)/(N γ̃_s σ̃_k^1.5) · τ),
  τ = √(2 ln(1.25/δ))/ε (Prop. 18), Procedure 1 with Lap(1/(Nε1)) and the 2/(Nε1) log(1/(2δ1))
  shift, σ1(M̂2) non-private. This is *not* a proven guarantee (dropped constants, a σ1 that
  leaks, Prop. 18 used for ε > 1): ``info["privacy"]["proven"] = False``. It exists to show the
  paper's most optimistic reading.

Reading notes (section / equation of the paper; "001" is the LaTeX version):

* Moments: the U-statistic estimators of App. C, eq. (5)-(7), with the typos of eq. (7) fixed as
  its proof (Lemma 22) and Lemma 3 require: no leading factor "d", B-terms with −α0/(α0+2) and
  the Σ_n M̃2^n ⊗ M̃1^n self-terms removed, b-term over distinct triples, and the three B
  permutations E[x1⊗x2⊗E x3] + E[x1⊗E x2⊗x3] + E[E x1⊗x2⊗x3] (eq. (7)'s B3 repeats B2).
  Documents with fewer than 3 tokens are dropped (M̃3^n needs l ≥ 3); N counts the rest and is
  treated as public, as the paper's replace-one neighbourhood does (pass documents of length ≥ 3
  for the claim to hold literally: otherwise replacing a document can change N).
* M̂3 is never formed for d > ``dense_max_d``: T̂ = M̂3(W,W,W) is computed exactly in whitened
  space. For Config. 1 the noise G (iid N(0, s²) on all d³ entries of M̂3, symmetrised — a
  post-processing) enters T̂ as G(W,W,W), a Gaussian with covariance s²(WᵀW)^{⊗3}; it is drawn
  exactly in k³ as H ×1 L ×2 L ×3 L with L Lᵀ = WᵀW. The released T̂ has the same distribution as
  with the literal d³ noise (``m3_noise="dense"`` does it literally, for small d).
* Symmetric noise on M̂2, M̂3, T̂: iid on every entry, then symmetrised (post-processing of an
  ℓ2-calibrated release; halves the off-diagonal variance compared with mirrored noise).
* σ_k(M̂2) is the k-th largest eigenvalue of M̂2 (Ŵ uses the top-k eigenpairs); eigenvalues of
  a noisy M̂2 below 1e-6 λ_1 are floored there.
* Procedure 1 (appendix mode): Laplace scale Δ/ε1 with the sensitivity Δ that Lemma 9's proof
  (Weyl) gives from Theorem 4, i.e. Δ2 for σ_k(M̂2) (Procedure 1 says 1/N, Lemma 9 says 2/N, the
  proof only covers the E2 part of M̂2); and the one-sided Laplace tail b·log(1/(2δ1)) (exact,
  half the paper's 2b·log(1/(2δ1))). For γ_s Lemma 9 claims 2/N, but its proof perturbs T̂,
  whose sensitivity is Δ_T̂ (Theorem 5), not 2/N: γ_s = min_i (σ_i − σ_{i+1})/4 moves by at most
  2Δ_T̂/4, so the Laplace scale is Δ_T̂(σ̃_k)/(2ε1') (Δ_T̂ at the already-released σ̃_k; valid on
  Procedure 1's good event, as Lemma 8 argues).
* Eq. (64) uses ½(σ_k + σ_{k+1}) as a lower bound on σ_k(M̂2') that needs the gap condition
  ‖E‖ ≤ (σ_k − σ_{k+1})/2; we use the Weyl bound σ_k(M̂2') ≥ σ̃_k − Δ2 instead (same proof,
  eq. (58) middle step; valid without the gap condition, and tighter). ⊥ when σ̃_k ≤ Δ2.
* Theorem 6 bounds each μ̄_i and each ᾱ_i; the released set (μ̄_1..k, ᾱ_1..k) has joint ℓ2
  sensitivity √(2k)·2√kΔ_T̂/γ_s (App. I.3 writes √(2k)Δ_T̂/γ_s). Likewise Config. 4 releases k
  topics and k α's: √(2k)·Δ_μ with Δ_α = Δ_μ as Theorem 7 states.
* Theorem 7 (H.5) needs σ1(M̂2) and σ1(T̂), which Procedure 1 does not release (§6.4 uses the
  non-private σ1(M̂2)). Appendix mode releases private upper bounds of both with Laplace noise
  (sensitivities Δ2 by Weyl, Δ_T̂ by H.7), as two more Procedure-1 statistics.
* Un-whitening (App. I, H.5): μ_i = (1/√α_i^r) (Ŵᵀ)† μ̄_i with 1/√α_i^r = (α0+2)/(2√(α0(α0+1))) ᾱ_i
  — that is μ_i/√(α0(α0+1)) (the paper's M2 normalisation); we release exactly that vector, with
  the H.5 sensitivity, and rescale by √(α0(α0+1)) afterwards (post-processing).
* Configs 1-3 whiten and un-whiten with two different M̂2's (1: two noisy copies; 2-3: noiseless Ŵ,
  noisy Ŵ†). Their eigenbases agree only up to signs and rotations; the paper's utility proofs
  (I.2, eqs. 72-74) silently take Ŵ_DP = Ŵ A D^{-1/2} Aᵀ, aligned with the private Ŵ. Here: every
  eigenvector gets a public sign convention (Σ_j u_j³ ≥ 0); in Config. 1 both whitenings are
  private releases, so Ŵ† is additionally rotated (orthogonal Procrustes) onto Ŵ — free
  post-processing. In Configs. 2-3 aligning with the private Ŵ would leak, so only signs are fixed.
* Tensor decomposition: the robust tensor power method with deflation (Anandkumar et al. 2014,
  ``streamdp.tensor.power_method``) instead of the simultaneous power method of [23]; the
  sensitivity bound of Theorem 6 is the paper's either way. γ_s is computed from the sorted
  eigenvalues of the decomposition of the noiseless T̂, with σ_{k+1} = 0.
* Budget split: the paper grid-searches per-edge ε for each composite ε (§7, App. J; selection by
  likelihood is itself not private). Default here: Procedure 1 gets 10% of ε (evenly over its
  statistics), the edges share the rest evenly; δ is split evenly over all parts. ``split=`` /
  ``delta_split=`` override.
* Output: rows projected onto the probability simplex (Euclidean projection, Duchi et al. 2008);
  the paper does not say how it maps noisy μ to distributions.
"""
from __future__ import annotations

import math
import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import brentq
from scipy.special import log_ndtr

from streamdp.tensor.power_method import ExactOracle, PowerMethodConfig, robust_power_method

CONFIG_NAMES = {
    1: "config1 (e3,e4,e8): noise on M3 and on two copies of M2 (input perturbation)",
    2: "config2 (e6,e8): noise on the whitened tensor T (Procedure 1) and on M2 for W-pinv",
    3: "config3 (e7,e8): noise on the power-method output (mu-bar, alpha-bar) (Procedure 1) and on M2",
    4: "config4 (e9): noise on the final output (mu, alpha) (Procedure 1)",
}
CONFIG_EDGES = {1: ("e3", "e4", "e8"), 2: ("e6", "e8"), 3: ("e7", "e8"), 4: ("e9",)}
CALIBRATIONS = ("appendix", "section6")

_KR_ELEMENTS = 1 << 22   # entries of a Khatri-Rao block materialised at once
EIG_FLOOR = 1e-6         # eigenvalues below EIG_FLOOR·λ_1 are floored when whitening


# ======================================================================= noise calibration
def tau_classical(epsilon: float, delta: float) -> float:
    """τ_{ε,δ} = √(2 ln(1.25/δ))/ε (Prop. 18; a proof only for ε ≤ 1)."""
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def analytic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ with N(0, σ²) (ε, δ)-DP for ℓ2 sensitivity Δ (Balle & Wang 2018, Thm. 8):
    Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) ≤ δ."""
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        return math.inf if sensitivity > 0 else 0.0

    def excess(log_s: float) -> float:
        s = math.exp(log_s)   # s = σ/Δ
        a, b = 1.0 / (2.0 * s), epsilon * s
        return math.exp(log_ndtr(a - b)) - math.exp(epsilon + log_ndtr(-a - b)) - delta

    lo, hi = math.log(1e-12), math.log(1e12)
    if excess(lo) <= 0:
        return sensitivity * math.exp(lo)
    s = math.exp(brentq(excess, lo, hi, xtol=1e-14, rtol=1e-12))
    return sensitivity * s * (1.0 + 1e-9)   # round the root up: never under-noise


def gaussian_sigma(sensitivity: float, epsilon: float, delta: float, mode: str) -> float:
    if mode == "analytic":
        return analytic_gaussian_sigma(sensitivity, epsilon, delta)
    if mode == "classical":
        return sensitivity * tau_classical(epsilon, delta)
    raise ValueError(f"unknown Gaussian calibration {mode!r}")


# ================================================================= sensitivities (App. H)
def delta2(n_docs: int, alpha0: float) -> float:
    """Theorem 4 / App. H.1: ℓ1 sensitivity of M̂2 (eq. 6), 2/N + 4a/N, a = α0/(α0+1)."""
    a = alpha0 / (alpha0 + 1.0)
    return 2.0 / n_docs + 4.0 * a / n_docs


def delta3(n_docs: int, alpha0: float) -> float:
    """Theorem 4 / App. H.2: ℓ1 sensitivity of M̂3 (eq. 7),
    2/N + 4α0/((α0+2)N) + 12α0²/((α0+1)(α0+2)) · (N−1)/(N(N−2))."""
    N = float(n_docs)
    return (2.0 / N + 4.0 * alpha0 / ((alpha0 + 2.0) * N)
            + 12.0 * alpha0**2 / ((alpha0 + 1.0) * (alpha0 + 2.0)) * (N - 1.0) / (N * (N - 2.0)))


def m3_l1_bound(n_docs: int, alpha0: float) -> float:
    """Eq. (62): ‖M̂3‖_F ≤ 1 + 6α0/(α0+2)·N/(N−1) + 6α0²/((α0+1)(α0+2))·N³/(N(N−1)(N−2))."""
    N = float(n_docs)
    return (1.0 + 6.0 * alpha0 / (alpha0 + 2.0) * N / (N - 1.0)
            + 6.0 * alpha0**2 / ((alpha0 + 1.0) * (alpha0 + 2.0)) * N**3 / (N * (N - 1.0) * (N - 2.0)))


def lemma28_w_diff(k: int, sigma_k: float, sigma_k_neighbour: float, d2: float) -> float:
    """Lemma 28: ‖Ŵ' − Ŵ‖_F ≤ √(2k) Δ2 / (σ_k √s'), s' a lower bound on σ_k(M̂2') (the paper
    uses s' = ½(σ_k + σ_{k+1}))."""
    return math.sqrt(2.0 * k) * d2 / (sigma_k * math.sqrt(sigma_k_neighbour))


def delta_T(k: int, n_docs: int, alpha0: float, sigma_k: float,
            sigma_k_neighbour: float) -> float:
    """Theorem 5 / eq. (64): Frobenius sensitivity of T̂ = M̂3(Ŵ,Ŵ,Ŵ),

        ‖M̂3‖·(2k)^{3/2} Δ2³ / (σ_k √s')³ + Δ3 k^{3/2} / s'^{3/2},

    s' = lower bound on σ_k(M̂2') (paper: ½(σ_k + σ_{k+1}); the mechanism passes σ̃_k − Δ2).
    ``inf`` when the bounds are not positive (Procedure 1's ⊥)."""
    if not (sigma_k > 0 and sigma_k_neighbour > 0):
        return math.inf
    d2, d3 = delta2(n_docs, alpha0), delta3(n_docs, alpha0)
    first = m3_l1_bound(n_docs, alpha0) * (2.0 * k) ** 1.5 * d2**3 / (
        sigma_k * math.sqrt(sigma_k_neighbour)) ** 3
    return first + d3 * k**1.5 / sigma_k_neighbour**1.5


def delta_mubar(k: int, dT: float, gamma_s: float) -> float:
    """Theorem 6 / App. H.4: ‖μ̄_i − μ̄_i'‖, |ᾱ_i − ᾱ_i'| ≤ 2√k Δ_T̂ / γ_s (each i)."""
    if not gamma_s > 0:
        return math.inf
    return 2.0 * math.sqrt(k) * dT / gamma_s


def unwhiten_coefficient_paper(alpha0: float) -> float:
    """1/√α_i^r = C ᾱ_i with C = (α0+2)/(2√(α0(α0+1))) (App. H.5, I)."""
    return (alpha0 + 2.0) / (2.0 * math.sqrt(alpha0 * (alpha0 + 1.0)))


def delta_mu(k: int, n_docs: int, alpha0: float, *, sigma_k: float, sigma_k_neighbour: float,
             sigma1_m2: float, sigma1_t: float, gamma_s: float) -> float:
    """Theorem 7 / App. H.5, per topic (μ_i = (1/√α_i^r)(Ŵᵀ)†μ̄_i, C as above):

        C σ1(T̂) √σ1(M̂2) · 2√kΔ_T̂/γ_s + C σ1(T̂) √σ1(M̂2)/σ_k · Δ2 + C √(σ1(M̂2)+Δ2) · 2√kΔ_T̂/γ_s
    """
    dT = delta_T(k, n_docs, alpha0, sigma_k, sigma_k_neighbour)
    dmb = delta_mubar(k, dT, gamma_s)
    if not math.isfinite(dmb):
        return math.inf
    C = unwhiten_coefficient_paper(alpha0)
    d2 = delta2(n_docs, alpha0)
    return (C * sigma1_t * math.sqrt(sigma1_m2) * dmb
            + C * sigma1_t * math.sqrt(sigma1_m2) / sigma_k * d2
            + C * math.sqrt(sigma1_m2 + d2) * dmb)


def section6_std(configuration: int, edge: str, *, k: int, n_docs: int, tau: float,
                 sigma_k: float = math.nan, gamma_s: float = math.nan,
                 sigma1_m2: float = math.nan) -> float:
    """Noise standard deviations exactly as §6 writes them (variances there; std = √variance
    with τ, as Prop. 18 and App. I.3/I.4 make clear — "N(0, x τ)" in §6 is a typo for x τ²)."""
    N = float(n_docs)
    if edge in ("e3", "e4", "e8"):
        return tau / N
    if edge == "e6":
        return k**1.5 / (N * sigma_k**1.5) * tau if sigma_k > 0 else math.inf
    if edge == "e7":
        return k**2 / (N * gamma_s * sigma_k**1.5) * tau if sigma_k > 0 and gamma_s > 0 else math.inf
    if edge == "e9":
        # §6.4 writes τ_{ε7,δ7}; App. I.4 uses τ_{ε9,δ9} — the e9 budget is meant.
        return (k**2 * math.sqrt(sigma1_m2) / (N * gamma_s * sigma_k**1.5) * tau
                if sigma_k > 0 and gamma_s > 0 else math.inf)
    raise ValueError(edge)


# ================================================================================ moments
def _prepare(counts) -> sp.csr_matrix:
    X = sp.csr_matrix(counts, dtype=np.float64)
    X.sum_duplicates()
    if X.nnz and X.data.min() < 0:
        raise ValueError("counts must be non-negative")
    lengths = np.asarray(X.sum(axis=1)).ravel()
    return X[lengths >= 3]


def _lengths(X: sp.csr_matrix) -> np.ndarray:
    return np.asarray(X.sum(axis=1)).ravel()


def second_moment(X: sp.csr_matrix, alpha0: float) -> tuple[np.ndarray, np.ndarray]:
    """(M̂1, M̂2) by eq. (5) and the U-statistic eq. (6):
    M̂2 = (1/N) Σ_n M̃2^n − a/(N(N−1)) [S1 S1ᵀ − Σ_n M̃1^n M̃1^nᵀ],  S1 = Σ_n M̃1^n."""
    N, d = X.shape
    l = _lengths(X)
    a = alpha0 / (alpha0 + 1.0)
    w2 = 1.0 / (l * (l - 1.0))
    # Σ_n w2_n c_n c_nᵀ and Σ_n c_n c_nᵀ / l_n²: one sparse Gram product per distinct length
    # (both weights depend on the document only through l), instead of two full products.
    E2 = np.zeros((d, d))
    SS = np.zeros((d, d))
    order = np.argsort(l, kind="stable")
    ls = l[order]
    cuts = np.flatnonzero(np.diff(ls)) + 1
    for idx in np.split(order, cuts):
        Xl = X[idx]
        G = (Xl.T @ Xl).toarray()
        L = float(l[idx[0]])
        E2 += G / (L * (L - 1.0))
        SS += G / L**2
    E2[np.diag_indices_from(E2)] -= X.T @ w2
    S1 = np.asarray(X.T @ (1.0 / l)).ravel()          # Σ_n M̃1^n
    M2 = E2 / N - a / (N * (N - 1.0)) * (np.outer(S1, S1) - SS)
    M2 = 0.5 * (M2 + M2.T)
    return S1 / N, M2


def _sum_outer3(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Σ_n A_n ⊗ B_n ⊗ C_n for (n, p), (n, q), (n, r) arrays, chunked GEMMs."""
    n, p = A.shape
    q, r = B.shape[1], C.shape[1]
    out = np.zeros((p * q, r))
    step = max(1, _KR_ELEMENTS // max(1, p * q))
    for s in range(0, n, step):
        kr = (A[s:s + step, :, None] * B[s:s + step, None, :]).reshape(-1, p * q)
        out += kr.T @ C[s:s + step]
    return out.reshape(p, q, r)


def _sym3(T: np.ndarray) -> np.ndarray:
    return (T + T.transpose(0, 2, 1) + T.transpose(1, 0, 2) + T.transpose(1, 2, 0)
            + T.transpose(2, 0, 1) + T.transpose(2, 1, 0)) / 6.0


def _perm3(T: np.ndarray) -> np.ndarray:
    """T_{(ab)c} + T_{(ac)b} + T_{(bc)a}: given T[a,b,c] = P_ab u_c, the three placements of the
    vector mode (c, then b, then a) — E[x1⊗x2⊗E x3] + E[x1⊗E x2⊗x3] + E[E x1⊗x2⊗x3]."""
    return T + T.transpose(0, 2, 1) + T.transpose(2, 0, 1)


def whitened_third_moment(X: sp.csr_matrix, W: np.ndarray, alpha0: float) -> np.ndarray:
    """T̂ = M̂3(W, W, W) for the U-statistic M̂3 of eq. (7) (typos fixed as in Lemma 22), exactly,
    without forming M̂3. W is (d, m); with W = I it returns the dense M̂3.

    Per document (c, l; y = Wᵀc, w_i = row i of W; u = Wᵀc/l):
      t  = (y⊗y⊗y − Σ_i c_i (w_i⊗w_i⊗y + w_i⊗y⊗w_i + y⊗w_i⊗w_i) + 2 Σ_i c_i w_i^{⊗3}) / (l(l−1)(l−2))
      P  = (y yᵀ − Σ_i c_i w_i w_iᵀ) / (l(l−1))
    M̂3(W,W,W) = (1/N) Σ t − b/(N(N−1)) perm3(S2⊗S1 − Σ_n P_n⊗u_n)
               + c/(N(N−1)(N−2)) [S1^{⊗3} − perm3((Σ u uᵀ)⊗S1) + 2 Σ u^{⊗3}]
    with b = α0/(α0+2), c = 2α0²/((α0+1)(α0+2)), S1 = Σ u, S2 = Σ P.
    """
    N = X.shape[0]
    l = _lengths(X)
    W = np.asarray(W, dtype=np.float64)
    Xt = X.T.tocsr()
    Y = np.asarray(X @ W)                              # (N, m)
    U = Y / l[:, None]
    w2 = 1.0 / (l * (l - 1.0))
    w3 = w2 / (l - 2.0)
    # Σ t
    yyy = _sum_outer3(Y * w3[:, None], Y, Y)
    B3 = np.asarray(Xt @ (Y * w3[:, None]))            # Σ_n w3 c_{n,i} y_n, per word i
    a3 = Xt @ w3
    P3 = np.einsum("ia,ib,ic->abc", W, W, B3, optimize=True)          # Σ_i w_i⊗w_i⊗B3_i
    D3 = np.einsum("ia,ib,ic->abc", W * a3[:, None], W, W, optimize=True)
    sum_t = yyy - (P3 + P3.transpose(0, 2, 1) + P3.transpose(2, 0, 1)) + 2.0 * D3
    # S1, S2, Σ_n P_n ⊗ u_n
    S1 = U.sum(axis=0)
    a2 = Xt @ w2
    S2 = (Y * w2[:, None]).T @ Y - (W * a2[:, None]).T @ W
    yyu = _sum_outer3(Y * w2[:, None], Y, U)
    B2 = np.asarray(Xt @ (U * w2[:, None]))            # Σ_n w2 c_{n,i} u_n
    wwB = np.einsum("ia,ib,ic->abc", W, W, B2, optimize=True)
    sum_Pu = yyu - wwB
    # distinct-triple sum of u
    uuu = _sum_outer3(U, U, U)
    UU = U.T @ U
    distinct = (np.einsum("a,b,c->abc", S1, S1, S1)
                - _perm3(np.einsum("ab,c->abc", UU, S1)) + 2.0 * uuu)
    b = alpha0 / (alpha0 + 2.0)
    c = 2.0 * alpha0**2 / ((alpha0 + 1.0) * (alpha0 + 2.0))
    T = (sum_t / N
         - b / (N * (N - 1.0)) * _perm3(np.einsum("ab,c->abc", S2, S1) - sum_Pu)
         + c / (N * (N - 1.0) * (N - 2.0)) * distinct)
    return _sym3(T)


# ===================================================================== spectral pieces
def _sign_convention(V: np.ndarray) -> np.ndarray:
    """Public, data-independent rule: every column gets Σ_j v_j³ ≥ 0."""
    s = np.sign(np.sum(V**3, axis=0))
    s[s == 0] = 1.0
    return V * s


def top_eigen(M2: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k eigenpairs (largest algebraic eigenvalues, descending) of symmetric M2."""
    vals, vecs = np.linalg.eigh(M2)
    idx = np.argsort(vals)[::-1][:k]
    return vals[idx], _sign_convention(vecs[:, idx])


def whitening(vals: np.ndarray, vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """W = U Λ^{-1/2}, (Wᵀ)† = U Λ^{1/2}, with eigenvalues floored at EIG_FLOOR·λ_1."""
    top = max(float(vals[0]), 1e-300)
    floor = EIG_FLOOR * top
    n_floored = int(np.count_nonzero(vals < floor))
    v = np.maximum(vals, floor)
    return vecs / np.sqrt(v), vecs * np.sqrt(v), n_floored


def procrustes(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Orthogonal R minimising ‖A R − B‖_F."""
    P, _, Qt = np.linalg.svd(A.T @ B)
    return P @ Qt


def decompose(T: np.ndarray, k: int, pm: PowerMethodConfig) -> tuple[np.ndarray, np.ndarray]:
    """Robust tensor power method with deflation; components sorted by λ, descending."""
    lam, V = robust_power_method(ExactOracle(_sym3(T)), k, pm)
    order = np.argsort(lam)[::-1]
    return lam[order], V[:, order]


def eigen_gap(lam: np.ndarray) -> float:
    """γ_s = min_{i∈[k]} (σ_i − σ_{i+1})/4 with σ sorted descending and σ_{k+1} = 0 (Theorem 6)."""
    s = np.sort(np.asarray(lam, float))[::-1]
    s = np.append(s, 0.0)
    return float(np.min(s[:-1] - s[1:]) / 4.0)


def alpha_from_lambda(lam: np.ndarray, alpha0: float) -> np.ndarray:
    """ᾱ_i = 2√((α0+1)α0)/((α0+2)√α_i)  ⇔  α_i = 4α0(α0+1)/((α0+2)² ᾱ_i²)."""
    lam = np.asarray(lam, float)
    with np.errstate(divide="ignore"):
        return 4.0 * alpha0 * (alpha0 + 1.0) / ((alpha0 + 2.0) ** 2 * lam**2)


def project_simplex(rows: np.ndarray) -> np.ndarray:
    """Euclidean projection of every row onto the probability simplex (Duchi et al. 2008)."""
    Vv = np.atleast_2d(np.asarray(rows, float))
    n, d = Vv.shape
    U = -np.sort(-Vv, axis=1)
    css = np.cumsum(U, axis=1) - 1.0
    ind = np.arange(1, d + 1)
    cond = U - css / ind > 0
    rho = d - 1 - np.argmax(cond[:, ::-1], axis=1)
    theta = css[np.arange(n), rho] / (rho + 1.0)
    out = np.maximum(Vv - theta[:, None], 0.0)
    bad = ~np.isfinite(out).all(axis=1) | (out.sum(axis=1) <= 0)
    out[bad] = 1.0 / d
    return out


# ================================================================== noise on M̂3 (Config. 1)
def whitened_m3_noise(W: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    """sym(G)(W, W, W) for G iid N(0, s²) on all d³ entries, drawn in k³: G(W,W,W) is Gaussian
    with covariance s² (WᵀW)^{⊗3} = s² (L Lᵀ)^{⊗3}, the law of H ×1 L ×2 L ×3 L, H iid N(0, s²)."""
    k = W.shape[1]
    L = np.linalg.cholesky(W.T @ W)
    H = rng.standard_normal((k, k, k)) * s
    return _sym3(np.einsum("pqr,ap,bq,cr->abc", H, L, L, L, optimize=True))


def dense_m3_noise(d: int, s: float, rng: np.random.Generator) -> np.ndarray:
    """The literal d³ noise: iid N(0, s²) on every entry of M̂3, symmetrised."""
    return _sym3(rng.standard_normal((d, d, d)) * s)


# ============================================================================ Procedure 1
def laplace_bound(value: float, scale: float, delta: float, rng: np.random.Generator, *,
                  side: str, tail_factor: float = 1.0) -> tuple[float, float]:
    """(noisy value, one-sided high-probability bound) of a Laplace(scale) release:
    lower = max(0, v̂ − f·b·log(1/(2δ))), upper = v̂ + f·b·log(1/(2δ)); f = 1 is exact
    (P[Lap > b log(1/(2δ))] = δ), f = 2 is what Procedure 1 writes."""
    noisy = float(value + rng.laplace(0.0, scale)) if math.isfinite(scale) else math.nan
    shift = tail_factor * scale * math.log(1.0 / (2.0 * delta))
    if side == "lower":
        return noisy, (max(0.0, noisy - shift) if math.isfinite(noisy) else 0.0)
    return noisy, (noisy + shift if math.isfinite(noisy) else math.inf)


# ============================================================================== budget
def _parts(configuration: int, calibration: str) -> tuple[list[str], list[str]]:
    p1 = {1: [], 2: ["p1_sigma_k"], 3: ["p1_sigma_k", "p1_gamma_s"],
          4: ["p1_sigma_k", "p1_gamma_s", "p1_sigma1_M2", "p1_sigma1_T"]}[configuration]
    if configuration == 4 and calibration == "section6":
        p1 = ["p1_sigma_k", "p1_gamma_s"]   # §6.4 plugs in the non-private σ1(M̂2)
    return p1, list(CONFIG_EDGES[configuration])


def default_split(configuration: int, calibration: str = "appendix",
                  p1_share: float = 0.1) -> dict[str, float]:
    p1, edges = _parts(configuration, calibration)
    out = {}
    rest = 1.0 - (p1_share if p1 else 0.0)
    for name in p1:
        out[name] = p1_share / len(p1)
    for e in edges:
        out[e] = rest / len(edges)
    return out


def _check_split(split: dict, names: list[str], what: str) -> dict[str, float]:
    if set(split) != set(names):
        raise ValueError(f"{what} must have exactly the keys {sorted(names)}, got {sorted(split)}")
    vals = {k: float(v) for k, v in split.items()}
    if any(not (v > 0 and math.isfinite(v)) for v in vals.values()):
        raise ValueError(f"{what} fractions must be positive, got {vals}")
    if abs(sum(vals.values()) - 1.0) > 1e-9:
        raise ValueError(f"{what} fractions must sum to 1, got {sum(vals.values())}")
    return vals


# ================================================================================= fit
def fit(counts, n_topics: int, *, epsilon: float | None, delta: float, seed: int,
        configuration: int, alpha0: float = 1.0, calibration: str = "appendix",
        gaussian: str | None = None, split: dict | None = None,
        delta_split: dict | None = None, n_restarts: int = 15, n_iter: int = 30,
        m3_noise: str = "whitened", dense_max_d: int = 120, **kw):
    """Fit the paper's spectral LDA with the noise of one configuration (1..4).

    Parameters beyond the common baseline API: ``calibration`` ("appendix" | "section6"),
    ``gaussian`` ("analytic" | "classical"; default analytic for appendix, classical for
    section6), ``split`` / ``delta_split`` (fractions of ε / δ per part, keys as
    :func:`default_split`), ``n_restarts`` / ``n_iter`` (power method), ``m3_noise``
    ("whitened" = exact-in-distribution k³ sampling of the d³ noise; "dense" = literal d³ noise,
    d ≤ ``dense_max_d``, Config. 1 only).
    """
    if kw:
        raise TypeError(f"unexpected keyword arguments: {sorted(kw)}")
    if configuration not in CONFIG_NAMES:
        raise ValueError(f"configuration must be 1..4, got {configuration!r}")
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    if m3_noise not in ("whitened", "dense"):
        raise ValueError(f"m3_noise must be 'whitened' or 'dense', got {m3_noise!r}")
    private = epsilon is not None
    if private and not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}")
    gaussian = gaussian or ("analytic" if calibration == "appendix" else "classical")
    t0 = time.perf_counter()
    k = int(n_topics)
    X = _prepare(counts)
    N, d = X.shape
    if N < 3 or k < 1 or k > d:
        raise ValueError(f"need >= 3 documents of length >= 3 and 1 <= k <= d (N={N}, k={k}, d={d})")
    rng = np.random.default_rng(seed)                       # noise (baseline: seeded, reproducible)
    pm = PowerMethodConfig(n_restarts=n_restarts, n_iter=n_iter, seed=int(seed) + 7919)

    p1_names, edge_names = _parts(configuration, calibration)
    names = p1_names + edge_names
    eps_part = _check_split(split or default_split(configuration, calibration), names, "split")
    dl_part = _check_split(delta_split or {n: 1.0 / len(names) for n in names}, names, "delta_split")
    if private:
        eps_of = {n: epsilon * f for n, f in eps_part.items()}
        dl_of = {n: delta * f for n, f in dl_part.items()}
    d2, d3 = delta2(N, alpha0), delta3(N, alpha0)
    appendix = calibration == "appendix"
    info: dict = {
        "method": "DeCarolis et al. 2020 spectral LDA (seed 000)",
        "configuration": configuration, "configuration_name": CONFIG_NAMES[configuration],
        "edges": CONFIG_EDGES[configuration], "calibration": calibration,
        "gaussian": gaussian if private else None, "private": private,
        "privacy": {
            "notion": "(epsilon, delta)-DP" if private else "none (epsilon=None: non-private)",
            "unit": "document", "neighbours": "replace one document (paper §3); N public",
            "epsilon": epsilon, "delta": delta if private else None,
            "composition": "basic: (sum of epsilon parts, sum of delta parts) — Prop. 19, Lemma 8",
            "epsilon_parts": eps_of if private else {}, "delta_parts": dl_of if private else {},
            "proven": bool(private and appendix),
            "caveat": ("appendix calibration: the paper's explicit bounds (App. H) with private "
                       "bounds for every data-dependent term; 'proven' means it follows from the "
                       "paper's Lemma 8 and Theorems 4-7 as stated — their proofs have gaps (eq. 61 "
                       "is not an identity; Lemma 28 / Theorem 6 assume the neighbour's whitening "
                       "and components are aligned with this corpus's)" if appendix else
                       "section6 calibration: O(.) forms with constant 1, non-private sigma_1(M2)"
                       " in config 4, Prop. 18 for any epsilon — NOT a proven guarantee"),
        },
        "n_docs": N, "vocab_size": d, "n_topics": k, "alpha0": alpha0,
        "sensitivities": {"Delta2_l1": d2, "Delta3_l1": d3},
        "noise_std": {}, "laplace_scale": {}, "procedure1": {},
        "refused": False, "fallback": None, "nonprivate_diagnostics": {},
    }
    diag = info["nonprivate_diagnostics"]   # data-dependent, NOT private: for experiments only

    def gauss(name: str, sens: float) -> float:
        s = gaussian_sigma(sens, eps_of[name], dl_of[name], gaussian)
        info["noise_std"][name] = s
        return s

    def refuse(reason: str):
        info["refused"] = True
        info["procedure1"]["result"] = "⊥"
        info["procedure1"]["reason"] = reason
        info["fallback"] = "uniform topics (nothing estimated; no non-private fallback)"
        info["alpha"] = None
        info["fit_seconds"] = time.perf_counter() - t0
        return np.full((k, d), 1.0 / d), info

    def sym_noise(shape, s):
        G = rng.standard_normal(shape) * s
        if len(shape) == 2:
            return 0.5 * (G + G.T)
        return _sym3(G)

    def pinv_t_from_noisy_m2(edge: str, W_ref: np.ndarray | None):
        """(Ŵ_DPᵀ)† from M̂2 + noise (edge e8); optionally Procrustes-aligned to W_ref."""
        s = gauss(edge, d2 if appendix else 1.0 / N)  # section6: std τ/N
        M2n = M2 + sym_noise((d, d), s)
        vals, vecs = top_eigen(M2n, k)
        W8, W8p, nf = whitening(vals, vecs)
        info.setdefault("n_eigs_floored", {})[edge] = nf
        if W_ref is not None:
            R = procrustes(W8, W_ref)
            W8p = W8p @ R
        return W8p

    # ---------------------------------------------------------------- noiseless pieces
    M1, M2 = second_moment(X, alpha0)
    vals, vecs = top_eigen(M2, k)
    all_vals = np.linalg.eigvalsh(M2)[::-1]
    sigma_k_true = float(vals[-1])
    diag.update(sigma_1_M2=float(vals[0]), sigma_k_M2=sigma_k_true,
                sigma_k1_M2=float(all_vals[k]) if k < d else 0.0)
    scale_out = math.sqrt(alpha0 * (alpha0 + 1.0))   # paper's μ → true μ (post-processing)
    C = unwhiten_coefficient_paper(alpha0)

    if not private:
        W, Wp, _ = whitening(vals, vecs)
        T = whitened_third_moment(X, W, alpha0)
        lam, V = decompose(T, k, pm)
        diag["gamma_s"] = eigen_gap(lam)
        mu = (C * lam[None, :] * (Wp @ V)).T * scale_out
        info["alpha"] = alpha_from_lambda(lam, alpha0)
        info["fit_seconds"] = time.perf_counter() - t0
        return project_simplex(mu), info

    # ------------------------------------------------------------------ Config. 1
    if configuration == 1:
        s4 = gauss("e4", d2 if appendix else 1.0 / N)
        vals4, vecs4 = top_eigen(M2 + sym_noise((d, d), s4), k)
        W4, _, nf = whitening(vals4, vecs4)
        info.setdefault("n_eigs_floored", {})["e4"] = nf
        s3 = gauss("e3", d3 if appendix else 1.0 / N)
        if m3_noise == "dense":
            if d > dense_max_d:
                raise ValueError(f"m3_noise='dense' forms d³ tensors; d={d} > dense_max_d={dense_max_d}")
            M3 = whitened_third_moment(X, np.eye(d), alpha0)
            M3n = M3 + dense_m3_noise(d, s3, rng)
            T = np.einsum("ijk,ia,jb,kc->abc", M3n, W4, W4, W4, optimize=True)
        else:
            T = whitened_third_moment(X, W4, alpha0) + whitened_m3_noise(W4, s3, rng)
        lam, V = decompose(T, k, pm)
        W8p = pinv_t_from_noisy_m2("e8", W4)
        mu = (C * lam[None, :] * (W8p @ V)).T * scale_out
        info["alpha"] = alpha_from_lambda(lam, alpha0)
        info["fit_seconds"] = time.perf_counter() - t0
        return project_simplex(mu), info

    # --------------------------------------------- Procedure 1: σ̃_k (configs 2, 3, 4)
    p1 = info["procedure1"]
    if appendix:
        b_sig = d2 / eps_of["p1_sigma_k"]
        sig_hat, sig_tilde = laplace_bound(sigma_k_true, b_sig, dl_of["p1_sigma_k"], rng, side="lower")
    else:
        b_sig = 1.0 / (N * eps_of["p1_sigma_k"])
        sig_hat, sig_tilde = laplace_bound(sigma_k_true, b_sig, dl_of["p1_sigma_k"], rng,
                                           side="lower", tail_factor=2.0)
    info["laplace_scale"]["p1_sigma_k"] = b_sig
    p1.update(sigma_k_hat=sig_hat, sigma_k_tilde=sig_tilde)
    if appendix:
        s_nb = sig_tilde - d2                    # Weyl: σ_k(M̂2') ≥ σ_k − Δ2 ≥ σ̃_k − Δ2
        if not s_nb > 0:
            return refuse(f"sigma_k lower bound {sig_tilde:.3g} <= Delta2 = {d2:.3g}: "
                          "local sensitivity bound is infinite")
        dT = delta_T(k, N, alpha0, sig_tilde, s_nb)
    else:
        if not sig_tilde > 0:
            return refuse("sigma_k lower bound is 0")
        s_nb = sig_tilde
        dT = k**1.5 / (N * sig_tilde**1.5)       # the O(.) form of Theorem 5, constant 1
    info["sensitivities"]["Delta_T_frobenius"] = dT

    W, Wp, _ = whitening(vals, vecs)
    T = whitened_third_moment(X, W, alpha0)

    # ------------------------------------------------------------------ Config. 2
    if configuration == 2:
        if appendix:
            s6 = gauss("e6", dT)
        else:
            s6 = section6_std(2, "e6", k=k, n_docs=N, sigma_k=sig_tilde,
                              tau=tau_classical(eps_of["e6"], dl_of["e6"]))
            info["noise_std"]["e6"] = s6
        lam, V = decompose(T + sym_noise((k, k, k), s6), k, pm)
        W8p = pinv_t_from_noisy_m2("e8", None)
        mu = (C * lam[None, :] * (W8p @ V)).T * scale_out
        info["alpha"] = alpha_from_lambda(lam, alpha0)
        info["fit_seconds"] = time.perf_counter() - t0
        return project_simplex(mu), info

    # --------------------------------------------- Procedure 1: γ̃_s (configs 3, 4)
    lam, V = decompose(T, k, pm)
    gamma_true = eigen_gap(lam)
    diag.update(gamma_s=gamma_true, sigma_1_T=float(lam[0]))
    if appendix:
        b_gam = (dT / 2.0) / eps_of["p1_gamma_s"]
        gam_hat, gam_tilde = laplace_bound(gamma_true, b_gam, dl_of["p1_gamma_s"], rng, side="lower")
    else:
        b_gam = 1.0 / (N * eps_of["p1_gamma_s"])
        gam_hat, gam_tilde = laplace_bound(gamma_true, b_gam, dl_of["p1_gamma_s"], rng,
                                           side="lower", tail_factor=2.0)
    info["laplace_scale"]["p1_gamma_s"] = b_gam
    p1.update(gamma_s_hat=gam_hat, gamma_s_tilde=gam_tilde)
    if not gam_tilde > 0:
        return refuse(f"eigen-gap lower bound gamma_s_tilde = 0 (noisy gamma_s = {gam_hat:.3g})")

    # ------------------------------------------------------------------ Config. 3
    if configuration == 3:
        if appendix:
            per = delta_mubar(k, dT, gam_tilde)
            sens = math.sqrt(2 * k) * per                  # k vectors μ̄_i and k scalars ᾱ_i
            info["sensitivities"].update(Delta_mubar_each=per, Delta_e7_joint_l2=sens)
            s7 = gauss("e7", sens)
        else:
            s7 = section6_std(3, "e7", k=k, n_docs=N, sigma_k=sig_tilde, gamma_s=gam_tilde,
                              tau=tau_classical(eps_of["e7"], dl_of["e7"]))
            info["noise_std"]["e7"] = s7
        Vn = V + rng.standard_normal(V.shape) * s7
        lamn = lam + rng.standard_normal(k) * s7
        W8p = pinv_t_from_noisy_m2("e8", None)
        mu = (C * lamn[None, :] * (W8p @ Vn)).T * scale_out
        info["alpha"] = alpha_from_lambda(lamn, alpha0)
        info["fit_seconds"] = time.perf_counter() - t0
        return project_simplex(mu), info

    # ------------------------------------------------------------------ Config. 4
    mu_paper = (C * lam[None, :] * (Wp @ V)).T          # (k, d): μ_i/√(α0(α0+1)), App. H.5
    alpha = alpha_from_lambda(lam, alpha0)
    if appendix:
        b1 = d2 / eps_of["p1_sigma1_M2"]
        s1_hat, s1_up = laplace_bound(float(vals[0]), b1, dl_of["p1_sigma1_M2"], rng, side="upper")
        bT = dT / eps_of["p1_sigma1_T"]
        t1_hat, t1_up = laplace_bound(float(lam[0]), bT, dl_of["p1_sigma1_T"], rng, side="upper")
        info["laplace_scale"].update(p1_sigma1_M2=b1, p1_sigma1_T=bT)
        p1.update(sigma1_M2_upper=s1_up, sigma1_T_upper=t1_up)
        if not (s1_up > 0 and t1_up > 0):
            return refuse("sigma_1 upper bounds not positive")
        per = delta_mu(k, N, alpha0, sigma_k=sig_tilde, sigma_k_neighbour=s_nb,
                       sigma1_m2=s1_up, sigma1_t=t1_up, gamma_s=gam_tilde)
        sens = math.sqrt(2 * k) * per                      # k topics μ_i and k α_i (Δα = Δμ, Thm 7)
        info["sensitivities"].update(Delta_mu_each=per, Delta_e9_joint_l2=sens)
        s9 = gauss("e9", sens)
    else:
        s9 = section6_std(4, "e9", k=k, n_docs=N, sigma_k=sig_tilde, gamma_s=gam_tilde,
                          sigma1_m2=float(vals[0]), tau=tau_classical(eps_of["e9"], dl_of["e9"]))
        info["noise_std"]["e9"] = s9
    mu_n = mu_paper + rng.standard_normal(mu_paper.shape) * s9
    info["alpha"] = alpha + rng.standard_normal(k) * s9
    info["fit_seconds"] = time.perf_counter() - t0
    return project_simplex(mu_n * scale_out), info
