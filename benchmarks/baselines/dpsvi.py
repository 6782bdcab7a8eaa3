"""DP-SVI baseline: private stochastic variational inference for LDA (Park, Foulds, Chaudhuri &
Welling, "Private topic modeling", seed 002 — "VIPS").

What the paper does (section and equation numbers of seed 002):

* LDA in the conjugate-exponential form (§3): the only data-dependent quantity in SVI is the
  expected sufficient statistic s̄_kv = Σ_d Σ_n φ^k_dn w^v_dn (§3, "In this case, the expected
  sufficient statistics ...") computed in the local (E-) step; privatising it privatises
  everything downstream (§2).
* Bounded contribution (§3, "Sensitivity analysis", eq. 4): every document is cut to at most N
  words by *randomly selecting N of its words*; since 0 ≤ φ ≤ 1, Σ_k φ^k_dn = 1 and each word is
  an indicator, one document's contribution to the (k × V) statistic has L1 norm ≤ N, hence L2
  norm ≤ N.
* Gaussian noise on every coordinate of the statistic at every iteration, negative values mapped
  to 0 (eq. 3).
* Algorithm 1: J iterations; mini-batch of S documents; local step per document (φ, γ updates);
  λ̂_k = η + D·s̃_k with s̃ the noised mini-batch mean; λ ← (1 − ρ_t) λ + ρ_t λ̂ with
  ρ_t = (τ0 + t)^(−κ) (Hoffman et al.'s online-VB step size; the paper gives no values).
* Accounting (eqs. 5–6): amplification by subsampling (Theorem 1, Li–Qardaji–Su, sampling rate
  ν = S/D) combined with zCDP composition over J iterations (Lemmas 1–2, Proposition 1).

What this module does, and where it departs:

* **Unit and neighbouring relation.** Unit: one document. Relation: *add/remove one document*.
  The paper defines DP for datasets "differing by a single entry" (§1) and derives eq. 4 as a
  max over two documents d, d' (replace-one), but its final bound N/D is the add/remove
  sensitivity (the replace-one L2 bound is √2·N/D: two documents with all N words on different
  single words). The amplification theorem it relies on (Li et al. 2012, Theorem 1) is for
  Bernoulli ("Poisson") sampling under add/remove. We therefore account under add/remove, where
  the sensitivity of the mini-batch *sum* is exactly the per-document bound N and the noise
  multiplier is z = σ_sum / N (this is `GaussianDpEvent`'s s / C convention; under
  ``REPLACE_ONE`` dp_accounting would mis-scale it by 2, google/differential-privacy issue 378,
  so we never use that relation). The implied replace-one guarantee is reported as well:
  (2ε, (1 + e^ε)δ) by group privacy (replace = remove + add).
* **Sampling.** Poisson sampling with probability q = ``batch_fraction`` per document per
  iteration (the model of the amplification theorem; the paper's fixed-size S is its
  expectation S = qD). The statistic is normalised by the *expected* batch size qD, never the
  realised one (which is private), so λ̂ = η + D·(Σ_batch + Y)/(qD) = η + (Σ_batch + Y)/q: the
  dataset size D cancels and is not needed.
* **Noise level.** The paper's eqs. 5–6 treat the subsampled (ε', δ') mechanism as a Gaussian
  mechanism of variance τ inside zCDP, which is not a valid step, and leave the split of δ open.
  We replace them by the Rényi-DP accountant of ``dp_accounting`` for the Poisson-subsampled
  Gaussian (Mironov, Talwar & Zhang 2019): the noise multiplier z is found by a bracketing
  (bisection-type) search so that
  ``RdpAccountant`` composing ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` J times gives
  ε ≤ target at the target δ (and ε ≥ (1 − rtol)·target). The release is the final λ (and its
  normalised rows), post-processing of the J noised statistics.
* **Eq. 3 scale.** The paper adds noise to the *mean* (1/S)Σ but states sensitivity N/D; for the
  mini-batch mean it is N/S. Noising the sum with σ = z·N is the consistent version.
* Local step: a fixed number of φ/γ iterations per document (``local_iterations``), γ started at
  1; λ starts at Gamma(100, 1/100) draws (Hoffman et al.), independent of the data.
* Noise is numpy's Gaussian (benchmark code: not floating-point hardened, unlike streamdp's
  OpenDP sampler).
* Defaults (the paper gives no values for τ0, κ, N; it uses S ≤ 400 of D = 400k): q = 0.1,
  J = 30 (3 expected epochs), N = 32, 20 local iterations, τ0 = 1, κ = 0.6. Chosen on a
  *separate* synthetic corpus (d = 1000, k = 10, 100k documents, model seed 7) among
  (q, J) ∈ {(0.01, 300), (0.05, 60), (0.1, 30), (0.2, 20), (0.5, 10), (1, 10)} and N ∈ {32, 64}:
  at ε ∈ {1, 4} all were within ≈ ±0.015 of each other in matched L2 error, the paper's small
  batches (q = 0.01) the worst. At a fixed ε the noise multiplier grows about linearly in q
  (amplification), so the signal-to-noise ratio of one step hardly depends on q and falls as
  √J; few, large steps help. The positive part of eq. 3 biases every noised coordinate upward
  (≈ σ/√(2π) ≈ 0.4σ per zero coordinate per step), which at V = 1000 dominates the error;
  ``clip="lambda"`` (an ablation, not the paper) feeds the unclipped noised statistic into the
  average and floors λ at η instead, which lowered the error by ≈ 25–35% there.

Use::

    topic_word, info = fit(counts_csr, 10, epsilon=1.0, delta=1e-6, seed=0)

``info``: ``noise_multiplier`` z, ``sigma_sum`` (= z·N, std of the noise on each coordinate of
the mini-batch sum), ``sensitivity`` N, ``q``, ``iterations``, ``epsilon_accounted`` (by
dp_accounting at ``delta``), the replace-one conversion, step-size settings, ``fit_seconds``.
``epsilon=None`` (or ``math.inf``) runs the same algorithm without noise (Hoffman et al.'s
online LDA with Poisson mini-batches and truncation), for reference.
"""
from __future__ import annotations

import math
import time

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma

__all__ = ["fit", "accounted_epsilon", "calibrate_noise_multiplier", "truncate_documents",
           "local_step", "online_lda"]

#: Rényi orders for the accountant: dp_accounting's defaults (1.1 … 1024) plus 2048 and 4096.
_EXTRA_ORDERS = (2048.0, 4096.0)


# ----------------------------------------------------------------------------- accounting

def _orders() -> list[float]:
    from dp_accounting import rdp
    return sorted(set(map(float, rdp.RdpAccountant()._orders)) | set(_EXTRA_ORDERS))


def accounted_epsilon(noise_multiplier: float, q: float, iterations: int, delta: float) -> float:
    """ε at ``delta`` of ``iterations`` Poisson-subsampled (rate q) Gaussian mechanisms with
    noise multiplier z = σ / (add/remove L2 sensitivity), by dp_accounting's RDP accountant."""
    import dp_accounting
    from dp_accounting import rdp

    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    acc = rdp.RdpAccountant(_orders(), dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, int(iterations)))
    return float(acc.get_epsilon(delta))


def calibrate_noise_multiplier(epsilon: float, delta: float, q: float, iterations: int, *,
                               rtol: float = 0.01) -> tuple[float, float]:
    """Noise multiplier z whose accounted ε (``accounted_epsilon``) lies in
    [(1 − rtol)·``epsilon``, ``epsilon``]. Bracketing search on log z (ε decreases in z):
    double/halve to bracket, then interpolate log ε linearly in log z, safeguarded to the middle
    80% of the bracket (a bisection variant). Returns (z, accounted ε)."""
    _check_privacy(epsilon, delta)
    _check_sampling(q, iterations)
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol}")
    memo: dict[float, float] = {}

    def eps_of(z: float) -> float:
        if z not in memo:
            e = accounted_epsilon(z, q, iterations, delta)
            memo[z] = e if math.isfinite(e) else math.inf
        return memo[z]

    def good(e: float) -> bool:
        return (1.0 - rtol) * epsilon <= e <= epsilon

    z = 1.0
    if good(eps_of(z)):
        return z, eps_of(z)
    if eps_of(z) > epsilon:                        # bracket: lo not private enough, hi private
        lo = z
        hi = 2.0 * z
        while eps_of(hi) > epsilon:
            lo, hi = hi, 2.0 * hi
            if hi > 1e7:
                raise ValueError(f"cannot reach ε = {epsilon} at δ = {delta} with q = {q} and "
                                 f"{iterations} iterations (noise multiplier > 1e7)")
    else:
        hi = z
        lo = z / 2.0
        while eps_of(lo) <= epsilon:
            if good(eps_of(lo)):
                return lo, eps_of(lo)
            hi, lo = lo, lo / 2.0
            if lo < 1e-8:
                return hi, eps_of(hi)
    for _ in range(100):
        if good(eps_of(hi)) or hi / lo < 1.0 + 1e-9:
            break
        e_lo, e_hi = eps_of(lo), eps_of(hi)
        if math.isfinite(e_lo) and e_hi > 0:
            t = (math.log(e_lo) - math.log(epsilon * (1 - rtol / 2))) / (math.log(e_lo) - math.log(e_hi))
            t = min(max(t, 0.1), 0.9)
        else:
            t = 0.5
        mid = math.exp(math.log(lo) + t * (math.log(hi) - math.log(lo)))
        if eps_of(mid) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi, eps_of(hi)


def _check_privacy(epsilon, delta) -> None:
    if not (isinstance(epsilon, (int, float)) and epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number > 0 (or None for no privacy), got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _check_sampling(q, iterations) -> None:
    if not (isinstance(q, (int, float)) and 0 < q <= 1):
        raise ValueError(f"batch_fraction (sampling probability q) must be in (0, 1], got {q!r}")
    if not (isinstance(iterations, (int, np.integer)) and iterations >= 1):
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")


# ----------------------------------------------------------------------------- data

def _as_counts(counts) -> sp.csr_matrix:
    if not sp.issparse(counts):
        counts = np.asarray(counts)
        if counts.ndim != 2:
            raise ValueError(f"counts must be a 2-D (n_docs, vocab) matrix, got shape {counts.shape}")
    X = sp.csr_matrix(counts, dtype=np.float64)
    X.sum_duplicates()
    if X.shape[0] < 1 or X.shape[1] < 2:
        raise ValueError(f"need at least 1 document and 2 words, got shape {X.shape}")
    if X.nnz and (X.data.min() < 0 or not np.all(np.isfinite(X.data))
                  or not np.all(X.data == np.round(X.data))):
        raise ValueError("counts must be finite non-negative integers")
    X.eliminate_zeros()
    return X


def truncate_documents(X: sp.csr_matrix, max_length: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Keep a uniformly random subset of ``max_length`` of the tokens of every longer document
    (seed 002 §3, "randomly selecting N words"); shorter documents are unchanged.

    Vectorised: every token of a long document gets a uniform key; the ``max_length`` tokens with
    the smallest keys in their document are kept (a uniform subset without replacement).
    """
    lengths = np.asarray(X.sum(axis=1)).ravel()
    long_rows = np.flatnonzero(lengths > max_length)
    if long_rows.size == 0:
        return X
    X = X.copy()
    starts, ends = X.indptr[long_rows], X.indptr[long_rows + 1]
    nz_per_row = ends - starts
    nz = np.repeat(starts - np.cumsum(np.r_[0, nz_per_row[:-1]]), nz_per_row) + np.arange(nz_per_row.sum())
    counts = X.data[nz].astype(np.int64)
    tok_nz = np.repeat(nz, counts)                               # token -> its nonzero entry
    tok_doc = np.repeat(np.repeat(np.arange(long_rows.size), nz_per_row), counts)
    order = np.argsort(tok_doc + rng.random(tok_doc.size), kind="stable")
    doc_len = np.bincount(tok_doc, minlength=long_rows.size)
    rank = np.arange(tok_doc.size) - np.repeat(np.cumsum(doc_len) - doc_len, doc_len)
    kept = tok_nz[order[rank < max_length]]
    new = np.bincount(kept, minlength=X.data.size)[nz]
    X.data[nz] = new
    X.eliminate_zeros()
    return X


# ----------------------------------------------------------------------------- variational steps

def _exp_dirichlet_expectation(a: np.ndarray) -> np.ndarray:
    """exp(E[log x]) for x ~ Dirichlet(a), row-wise."""
    return np.exp(digamma(a) - digamma(a.sum(axis=1, keepdims=True)))


def local_step(X: sp.csr_matrix, exp_elog_beta: np.ndarray, alpha: float, n_iter: int):
    """Per-document variational step for a batch (vectorised over documents, float32 inside).

    φ_dvk ∝ exp(E log θ_dk) exp(E log β_kv), γ_d = α + Σ_v n_dv φ_dv· , ``n_iter`` times from
    γ = 1. Returns (γ (n, k), sufficient statistic S (k, d) = Σ_d Σ_v n_dv φ_dv· e_v, float64).
    """
    n, d = X.shape
    k = exp_elog_beta.shape[0]
    if n == 0 or X.nnz == 0:
        return np.full((n, k), float(alpha)), np.zeros((k, d))
    per_row = np.diff(X.indptr)
    eb = np.ascontiguousarray(exp_elog_beta, dtype=np.float32)
    ebT = np.ascontiguousarray(eb.T)
    B = ebT[X.indices]                                            # (nnz, k), fixed in the loop
    data = X.data.astype(np.float32)
    gamma = np.ones((n, k), dtype=np.float32)
    a = np.float32(alpha)
    for it in range(n_iter + 1):
        et = _exp_dirichlet_expectation(gamma).astype(np.float32, copy=False)
        norm = np.einsum("ij,ij->i", np.repeat(et, per_row, axis=0), B) + np.float32(1e-30)
        Xs = sp.csr_matrix((data / norm, X.indices, X.indptr), shape=(n, d))
        if it == n_iter:
            break
        gamma = a + et * (Xs @ ebT)
    S = exp_elog_beta * np.asarray(Xs.T @ et, dtype=np.float64).T   # (k, d)
    return gamma.astype(np.float64), S


def _step_size(t: int, tau0: float, kappa: float) -> float:
    return (tau0 + t) ** (-kappa)


def _init_lambda(k: int, d: int, rng: np.random.Generator) -> np.ndarray:
    return rng.gamma(100.0, 1.0 / 100.0, size=(k, d))


def _check_n_topics(n_topics) -> None:
    if not (isinstance(n_topics, (int, np.integer)) and n_topics >= 1):
        raise ValueError(f"n_topics must be an integer >= 1, got {n_topics!r}")


def _check_common(n_topics, alpha, eta, tau0, kappa, local_iterations):
    _check_n_topics(n_topics)
    if not alpha > 0 or not eta > 0:
        raise ValueError(f"alpha and eta must be > 0, got {alpha}, {eta}")
    if not tau0 >= 0:
        raise ValueError(f"tau0 must be >= 0, got {tau0}")
    if not 0.5 <= kappa <= 1:
        raise ValueError(f"kappa must be in [0.5, 1] (Robbins–Monro; gensim's default is 0.5), "
                         f"got {kappa}")
    if not (isinstance(local_iterations, (int, np.integer)) and local_iterations >= 1):
        raise ValueError(f"local_iterations must be an integer >= 1, got {local_iterations!r}")


def online_lda(counts, n_topics: int, *, seed: int, alpha: float | None = None,
               eta: float | None = None, batch_size: int = 2000, passes: int = 1,
               local_iterations: int = 50, tau0: float = 1.0, kappa: float = 0.5,
               shuffle: bool = True) -> np.ndarray:
    """Non-private online VB for LDA (Hoffman, Blei & Bach 2010), deterministic given ``seed``:
    consecutive mini-batches of a seeded permutation of the documents, ``passes`` passes.

    Defaults follow gensim's ``LdaModel`` (chunksize 2000, decay κ = 0.5, offset τ0 = 1,
    50 local iterations, α = η = 1/k). Returns the (k, d) topic-word matrix (normalised λ).
    Used as TopicDP's base topic model (``topicdp.py``).
    """
    X = _as_counts(counts)
    n, d = X.shape
    _check_n_topics(n_topics)
    alpha = 1.0 / n_topics if alpha is None else float(alpha)
    eta = 1.0 / n_topics if eta is None else float(eta)
    _check_common(n_topics, alpha, eta, tau0, kappa, local_iterations)
    rng = np.random.default_rng(seed)
    lam = _init_lambda(n_topics, d, rng)
    order = rng.permutation(n) if shuffle else np.arange(n)
    t = 0
    for _ in range(passes):
        for s in range(0, n, batch_size):
            idx = order[s:s + batch_size]
            t += 1
            _, S = local_step(X[idx], _exp_dirichlet_expectation(lam), alpha, local_iterations)
            rho = _step_size(t, tau0, kappa)
            lam = (1.0 - rho) * lam + rho * (eta + (n / idx.size) * S)
    return lam / lam.sum(axis=1, keepdims=True)


# ----------------------------------------------------------------------------- the private fit

def fit(counts, n_topics: int, *, epsilon: float | None, delta: float, seed: int,
        alpha: float | None = None, eta: float | None = None, batch_fraction: float = 0.1,
        iterations: int = 30, max_doc_length: int = 32, local_iterations: int = 20,
        tau0: float = 1.0, kappa: float = 0.6, rtol: float = 0.01,
        noise_multiplier: float | None = None, clip: str = "statistic", **kw):
    """Differentially private SVI for LDA (seed 002, Algorithm 1) with RDP accounting.

    Parameters
    ----------
    counts : (D, V) document-word counts (CSR or dense); V is the public vocabulary.
    n_topics : K.
    epsilon, delta : target (ε, δ) per document, add/remove; ``epsilon=None`` → no noise.
    seed : seeds λ's initialisation, the Poisson sampling, the truncation and the noise.
    alpha, eta : Dirichlet hyperparameters of θ_d and β_k (default 1/K each).
    batch_fraction : q, the Poisson sampling probability per iteration (expected batch qD).
    iterations : J, the number of noisy SVI steps (each one charged to the budget).
    max_doc_length : N, the public length cap (longer documents are randomly cut to N words);
        the L2 sensitivity of the mini-batch statistic.
    local_iterations : fixed number of φ/γ iterations per document.
    tau0, kappa : step size ρ_t = (τ0 + t)^(−κ).
    rtol : calibration tolerance: accounted ε ∈ [(1 − rtol)ε, ε].
    noise_multiplier : use this z instead of calibrating (its ε is still accounted).
    clip : "statistic" (the paper, eq. 3: each noised statistic is clipped at 0 before the
        update — biased upward) or "lambda" (not in the paper; an ablation: the noised statistic
        enters the update unclipped and λ is floored at η afterwards — post-processing, same
        privacy, less bias).
    """
    if kw:
        raise TypeError(f"fit() got unexpected keyword arguments: {sorted(kw)}")
    t0 = time.perf_counter()
    X = _as_counts(counts)
    D, V = X.shape
    _check_n_topics(n_topics)
    alpha = 1.0 / n_topics if alpha is None else float(alpha)
    eta = 1.0 / n_topics if eta is None else float(eta)
    _check_common(n_topics, alpha, eta, tau0, kappa, local_iterations)
    _check_sampling(batch_fraction, iterations)
    if not (isinstance(max_doc_length, (int, np.integer)) and max_doc_length >= 1):
        raise ValueError(f"max_doc_length must be an integer >= 1, got {max_doc_length!r}")
    if clip not in ("statistic", "lambda"):
        raise ValueError(f"clip must be 'statistic' (the paper) or 'lambda', got {clip!r}")
    private = epsilon is not None and not (isinstance(epsilon, float) and math.isinf(epsilon))
    q, J, N = float(batch_fraction), int(iterations), int(max_doc_length)

    if private:
        _check_privacy(epsilon, delta)
        if noise_multiplier is None:
            z, eps_acc = calibrate_noise_multiplier(epsilon, delta, q, J, rtol=rtol)
        else:
            if not noise_multiplier > 0:
                raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
            z = float(noise_multiplier)
            eps_acc = accounted_epsilon(z, q, J, delta)
            if eps_acc > epsilon:
                raise ValueError(f"noise_multiplier {z} gives ε = {eps_acc:.4g} > target {epsilon}")
    else:
        z, eps_acc = 0.0, math.inf
    t_cal = time.perf_counter() - t0
    sigma_sum = z * N

    rng = np.random.default_rng(seed)
    lam = _init_lambda(n_topics, V, rng)
    batch_sizes = np.empty(J, dtype=np.int64)
    for t in range(1, J + 1):
        idx = np.flatnonzero(rng.random(D) < q)                   # Poisson sampling
        batch_sizes[t - 1] = idx.size
        Xb = truncate_documents(X[idx], N, rng)
        _, S = local_step(Xb, _exp_dirichlet_expectation(lam), alpha, local_iterations)
        if private:
            S = S + rng.normal(0.0, sigma_sum, size=S.shape)
            if clip == "statistic":
                S = np.maximum(S, 0.0)                              # eq. 3
        lam_hat = eta + S / q                                       # η + D · (Σ + Y)/(qD)
        rho = _step_size(t, tau0, kappa)
        lam = (1.0 - rho) * lam + rho * lam_hat
        if clip == "lambda":
            lam = np.maximum(lam, eta)
    topic_word = lam / lam.sum(axis=1, keepdims=True)
    seconds = time.perf_counter() - t0

    info = {
        "method": "DP-SVI (Park, Foulds, Chaudhuri & Welling; seed 002 Algorithm 1)",
        "private": private,
        "unit": "one document",
        "neighbouring": "add/remove one document",
        "epsilon": epsilon, "delta": delta,
        "epsilon_accounted": eps_acc,
        "accountant": "dp_accounting RdpAccountant, PoissonSampledDpEvent(q, GaussianDpEvent(z)) "
                      "self-composed J times, ADD_OR_REMOVE_ONE",
        "replace_one_epsilon": 2 * eps_acc if private else math.inf,
        "replace_one_delta": (1 + math.exp(eps_acc)) * delta if private and eps_acc < 700 else None,
        "noise_multiplier": z,
        "sensitivity": N,
        "sigma_sum": sigma_sum,
        "noise_std_lambda_hat": sigma_sum / q,
        "q": q, "iterations": J, "expected_batch": q * D,
        "mean_batch": float(batch_sizes.mean()),
        "epochs": q * J,
        "max_doc_length": N,
        "clip": clip,
        "docs_truncated_fraction": float(np.mean(np.asarray(X.sum(axis=1)).ravel() > N)),
        "local_iterations": local_iterations, "tau0": tau0, "kappa": kappa,
        "alpha": alpha, "eta": eta,
        "calibration_seconds": t_cal,
        "fit_seconds": seconds,
        "docs_per_s": D / seconds,                       # corpus size / fit time
        "docs_processed_per_s": float(batch_sizes.sum()) / seconds,
    }
    return topic_word, info
