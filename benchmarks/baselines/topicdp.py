"""TopicDP baseline: output perturbation of the topic-word matrix with a *sampled* sensitivity
(Wang, Sharma, Feng, Shu & Hong, "A Model-Agnostic Approach to Differentially Private Topic
Mining", KDD 2022 — seed 004).

**Guarantee: (ε, δ, γ)-random differential privacy, weaker than (ε, δ)-DP.** The (ε, δ) bound
holds with probability ≥ 1 − γ over a *random* neighbouring pair (D, D') drawn from a data
distribution P (and over the sensitivity sampling) — not for every pair. A document whose
removal moves the topics more than the sampled sensitivity (an outlier) is not protected at all.
Here P is the empirical distribution of the private documents themselves (the paper's
"Uniform()" over records, Algorithm 1 line 3), so the sampled sensitivity Δ_s is itself a
data-dependent quantity that is used without any privacy accounting. streamdp's guarantee
(worst-case (ε, δ)-DP per document) and this one are not comparable at equal ε.

**Unit.** The paper's unit is a *user* (all of a user's documents; Def. 1 and §2.2, e.g. all
emails of one Enron address). Our corpora carry no user ids, so the unit here is *one document*;
Algorithm 1's neighbouring pairs replace one record (lines 5–7), which is what we sample.

What the paper does and what we do (section / equation numbers of seed 004):

1. Train a non-private topic model on D and take its topic-word probability matrix W (§3.2
   steps 3, Algorithm 2 line 1). The paper's example is LDA; its model-agnostic comparison uses
   LSI and HDP, which with its LDA reference [1] points to gensim. ``base="gensim"`` runs gensim's
   ``LdaModel`` (online VB); the default ``base="online"`` is our vectorised implementation of the
   same online VB algorithm with gensim's defaults (``dpsvi.online_lda``: chunks of 2000,
   κ = 0.5, τ0 = 1, α = η = 1/k), ~7× faster; ``base="sklearn"`` uses scikit-learn's batch LDA.
   The training is deterministic given ``seed`` (fixed initialisation and document order), so
   f(D) − f(D') measures the data, not the optimiser's randomness. The paper releases only the
   top m topics × the union of their top n keywords (§2.1); we release the full k × V matrix
   over the public vocabulary (choosing keywords from the data would be a further leak).
2. Sensitivity sampling (Algorithm 1, from Rubinstein & Alda's "pain-free" random DP):
   h = ⌈log(1/ρ) / (2(γ − ρ)²)⌉ with ρ = exp(W₋₁(−γ/(2√e)) + 1/2), order statistic
   k = ⌈h(1 − γ + ρ + √(log(1/ρ)/(2h)))⌉ (Theorem 1, eqs. 3–4); h times draw N − 1 common
   documents and two extra ones from P, train on both neighbouring datasets and record
   Δ_i = ‖f(D) − f(D')‖_F; Δ_s is the k-th smallest. (Line 5's "D₁..N₋₁ ~ P^N" is read as
   P^{N−1}.) h grows fast as γ shrinks: γ = 0.1 (the paper's default) needs h = 285 pairs of
   trainings on N documents, γ = 0.3 needs 24. Our default is γ = 0.3 for speed;
   ``n_sensitivity_samples`` fixes h instead, and γ is then the smallest value Theorem 1
   certifies for that h. ``sensitivity=`` reuses a Δ_s computed earlier (the paper notes the
   sampling can run once, offline, §3.5); results are also cached in-process per dataset.
3. Noise (§3.4, Algorithm 2, Theorem 2): Gaussian with σ_R² = αΔ_s²/(2ε_R) on every entry,
   where ε_R is the Rényi-DP level of order α that yields the target (ε, δ) by Proposition 2:
   ε_R = max{ε − log(ζ_α/δ)/(α − 1), ε + log((e^ε − αδ)((δ − 1)/(δ − e^ε))^α + αδ)/(α − 1)},
   ζ_α = (1/α)(1 − 1/α)^(α−1). The paper fixes α = 2 (§3.4): ``calibration="paper"``. For
   small δ that is very conservative (at δ = 1e-6 the first branch is negative for ε < 12.4 and
   the second is ≈ 2δ(e^ε − 1), so σ_R ≈ Δ_s/√(2δ(e^ε − 1)): 539·Δ_s at ε = 1, 97·Δ_s at
   ε = 4, vs 4.2·Δ_s and 1.2·Δ_s for the exact Gaussian mechanism);
   ``calibration="optimal_order"`` picks α
   to minimise σ_R, as §2.2 suggests ("we treat α as a parameter in optimization").
   ``info["epsilon_gaussian_exact"]`` is the exact ε at δ (analytic Gaussian mechanism,
   dp_accounting) of the same noise for a pair whose sensitivity is ≤ Δ_s. Proposition 2 is
   printed as a DP → RDP statement ("ε_R ≥ max{…}"); we use it as the paper does, to pick ε_R.
   Its first branch is the standard RDP → DP conversion (Balle et al. 2020; Asoodeh et al.), a
   valid sufficient condition; when the second branch is the larger (always, for α = 2 and
   small δ) ``epsilon_gaussian_exact`` confirms the noise is ample (≈ 0.005 at ε = 1,
   δ = 1e-6). (§3.2's "σ² = 2Δ² log(1.25/ε)/ε²" is the classical Gaussian mechanism with δ.)
4. Release W' = W + noise, "normalized" (§3.2 step 5): negative entries set to 0, rows divided
   by their sums (a row with no positive entry becomes uniform).

Observed (synthetic LDA, V = 1000, k = 10, 100k documents, online base): the Δ_i are heavy-tailed
— median ≈ 5·10⁻⁶ but the largest of 24 ≈ 1.4·10⁻³ (one document occasionally moves the online
VB optimiser to a different path) — so Δ_s, hence the noise, is set by rare events and varies
several-fold with h and the seed.

Use::

    topic_word, info = fit(counts_csr, 10, epsilon=1.0, delta=1e-6, seed=0)
    info["guarantee"]   # the random-DP statement; info["sigma"], info["sensitivity"], ...
"""
from __future__ import annotations

import hashlib
import math
import time

import numpy as np
import scipy.sparse as sp
from scipy.special import lambertw

try:                                   # package import (benchmarks on sys.path)
    from . import dpsvi as _dpsvi
except ImportError:                    # pragma: no cover - loaded as a plain module
    import dpsvi as _dpsvi  # type: ignore

__all__ = ["fit", "sampler_parameters", "renyi_epsilon", "noise_scale", "optimal_order",
           "sample_sensitivity", "base_topic_model", "CALIBRATIONS", "BASES"]

CALIBRATIONS = ("paper", "optimal_order")
BASES = ("online", "gensim", "sklearn")

GUARANTEE = ("(ε, δ, γ)-random DP (TopicDP Def. 4 / Theorem 4, after Rubinstein & Alda 2017): "
             "with probability ≥ 1 − γ over a random neighbouring pair drawn from P (here the "
             "empirical distribution of the private documents) and the sensitivity sampling, the "
             "release is (ε, δ)-indistinguishable on that pair. This is weaker than (ε, δ)-DP: "
             "there is no guarantee for every pair (outlier documents are unprotected), and the "
             "sampled sensitivity is computed from the private data without accounting.")

_SENSITIVITY_CACHE: dict[tuple, dict] = {}


# ----------------------------------------------------------------------------- Algorithm 1 sizes

def _gamma_for_h(h: int) -> tuple[float, float]:
    """Smallest γ Theorem 1 certifies with h samples (order statistic k = h): min over ρ of
    ρ + √(log(1/ρ)/(2h)). Returns (γ, ρ)."""
    from scipy.optimize import minimize_scalar
    g = lambda r: r + math.sqrt(math.log(1.0 / r) / (2.0 * h))   # noqa: E731
    res = minimize_scalar(lambda lr: g(math.exp(lr)), bounds=(math.log(1e-12), math.log(0.5)),
                          method="bounded", options={"xatol": 1e-10})
    rho = math.exp(res.x)
    return g(rho), rho


def sampler_parameters(gamma: float | None = 0.3, n_samples: int | None = None) -> dict:
    """Sample size h, order-statistic index k (1-based) and ρ of Algorithm 1 / Theorem 1.

    * ``gamma`` only: the paper's h(γ) with ρ = exp(W₋₁(−γ/(2√e)) + 1/2);
    * ``n_samples`` only: h as given, γ = the smallest value Theorem 1 certifies, k = h;
    * both: h as given; raises if h samples cannot certify this γ.
    """
    if gamma is None and n_samples is None:
        raise ValueError("give gamma or n_sensitivity_samples (or both)")
    if gamma is not None and not (isinstance(gamma, (int, float)) and 0 < gamma < 1):
        raise ValueError(f"gamma must be in (0, 1), got {gamma!r}")
    if n_samples is None:
        rho = float(np.exp(lambertw(-gamma / (2.0 * math.sqrt(math.e)), -1).real + 0.5))
        h = int(math.ceil(math.log(1.0 / rho) / (2.0 * (gamma - rho) ** 2)))
        k = int(math.ceil(h * (1.0 - gamma + rho + math.sqrt(math.log(1.0 / rho) / (2.0 * h)))
                          - 1e-9))
        return {"h": h, "k": min(k, h), "rho": rho, "gamma": float(gamma)}
    if not (isinstance(n_samples, (int, np.integer)) and n_samples >= 2):
        raise ValueError(f"n_sensitivity_samples must be an integer >= 2, got {n_samples!r}")
    h = int(n_samples)
    g_min, rho = _gamma_for_h(h)
    if gamma is None:
        return {"h": h, "k": h, "rho": rho, "gamma": g_min}
    if gamma < g_min - 1e-12:
        raise ValueError(f"{h} sensitivity samples certify γ ≥ {g_min:.4f} only (Theorem 1); "
                         f"got gamma = {gamma}: use more samples or a larger gamma")
    k = int(math.ceil(h * (1.0 - gamma + g_min) - 1e-9))
    return {"h": h, "k": max(1, min(k, h)), "rho": rho, "gamma": float(gamma)}


# ----------------------------------------------------------------------------- §3.4 noise

def renyi_epsilon(epsilon: float, delta: float, order: float = 2.0) -> float:
    """ε_R of Proposition 2 (seed 004 §3.4): the Rényi-DP level of order α whose Gaussian
    mechanism the paper uses for (ε, δ) — the larger of its two branches (log-space)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    a = float(order)
    if not a > 1:
        raise ValueError(f"Rényi order must be > 1, got {order!r}")
    if not a * delta < 1:
        raise ValueError(f"Proposition 2 needs α·δ < 1, got α = {a}, δ = {delta}")
    log_zeta = -math.log(a) + (a - 1.0) * math.log1p(-1.0 / a)
    first = epsilon - (log_zeta - math.log(delta)) / (a - 1.0)
    # log[(e^ε − αδ)·((1 − δ)/(e^ε − δ))^α + αδ], stable for large ε and α
    log_em = epsilon + math.log1p(-a * delta * math.exp(-epsilon))
    log_r = math.log1p(-delta) - epsilon - math.log1p(-delta * math.exp(-epsilon))
    second = epsilon + np.logaddexp(log_em + a * log_r, math.log(a * delta)) / (a - 1.0)
    return float(max(first, second))


def noise_scale(sensitivity: float, epsilon: float, delta: float, order: float = 2.0) -> tuple[float, float]:
    """(σ_R, ε_R): σ_R² = α Δ_s² / (2 ε_R) (Theorem 2, Algorithm 2 line 3)."""
    if not (sensitivity >= 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
    eps_r = renyi_epsilon(epsilon, delta, order)
    if not eps_r > 0:
        raise ValueError(f"Proposition 2 gives ε_R = {eps_r:.4g} <= 0 at α = {order}")
    return math.sqrt(order * sensitivity ** 2 / (2.0 * eps_r)), eps_r


def optimal_order(epsilon: float, delta: float) -> float:
    """The Rényi order α minimising σ_R (i.e. α / ε_R(α)) on a fine log grid, α·δ < 1."""
    hi = min(1e5, 0.999 / delta)
    grid = np.exp(np.linspace(math.log(1.0 + 1e-3), math.log(hi), 4000))
    best, best_a = math.inf, 2.0
    for a in grid:
        er = renyi_epsilon(epsilon, delta, float(a))
        if er > 0 and a / er < best:
            best, best_a = a / er, float(a)
    return best_a


# ----------------------------------------------------------------------------- base model

def base_topic_model(X: sp.csr_matrix, n_topics: int, *, seed: int, base: str = "online",
                     alpha: float | None = None, eta: float | None = None, **kw) -> np.ndarray:
    """The non-private topic model f(D) -> (k, V) topic-word probabilities (deterministic)."""
    alpha = 1.0 / n_topics if alpha is None else float(alpha)
    eta = 1.0 / n_topics if eta is None else float(eta)
    if base == "online":
        opts = {"batch_size": 2000, "passes": 1, "local_iterations": 20, "tau0": 1.0,
                "kappa": 0.5, **kw}
        return _dpsvi.online_lda(X, n_topics, seed=seed, alpha=alpha, eta=eta, **opts)
    if base == "gensim":
        from gensim.matutils import Sparse2Corpus
        from gensim.models import LdaModel
        n = X.shape[0]
        order = np.random.default_rng(seed).permutation(n)        # same position for D and D'
        opts = {"chunksize": 2000, "passes": 1, "iterations": 50, "decay": 0.5, "offset": 1.0, **kw}
        model = LdaModel(corpus=Sparse2Corpus(X[order], documents_columns=False),
                         num_topics=n_topics, id2word={j: str(j) for j in range(X.shape[1])},
                         update_every=1, alpha=np.full(n_topics, alpha), eta=eta,
                         eval_every=None, random_state=seed, dtype=np.float64, **opts)
        W = np.clip(model.get_topics(), 0.0, None)
        return W / W.sum(axis=1, keepdims=True)
    if base == "sklearn":
        from sklearn.decomposition import LatentDirichletAllocation
        opts = {"learning_method": "batch", "max_iter": 10, **kw}
        model = LatentDirichletAllocation(n_components=n_topics, doc_topic_prior=alpha,
                                          topic_word_prior=eta, random_state=seed, **opts)
        model.fit(X)
        W = model.components_
        return W / W.sum(axis=1, keepdims=True)
    raise ValueError(f"base must be one of {BASES}, got {base!r}")


# ----------------------------------------------------------------------------- Algorithm 1

def sample_sensitivity(X: sp.csr_matrix, n_topics: int, *, h: int, k: int, seed: int,
                       rng: np.random.Generator, n_docs: int | None = None, base: str = "online",
                       alpha=None, eta=None, base_kwargs: dict | None = None) -> tuple[float, np.ndarray]:
    """Algorithm 1: h neighbouring pairs sampled from the documents of X (with replacement),
    Δ_i = ‖f(D) − f(D')‖_F with the same deterministic f (same ``seed``); returns (Δ_(k), Δ's)."""
    n = X.shape[0]
    m = n if n_docs is None else int(n_docs)
    if not 2 <= m:
        raise ValueError(f"sensitivity_n_docs must be >= 2, got {m}")
    deltas = np.empty(h)
    for i in range(h):
        common = rng.integers(0, n, size=m - 1)
        extra = rng.integers(0, n, size=2)
        D = X[np.r_[common, extra[0]]]
        Dp = X[np.r_[common, extra[1]]]
        W = base_topic_model(D, n_topics, seed=seed, base=base, alpha=alpha, eta=eta,
                             **(base_kwargs or {}))
        Wp = base_topic_model(Dp, n_topics, seed=seed, base=base, alpha=alpha, eta=eta,
                              **(base_kwargs or {}))
        deltas[i] = np.linalg.norm(W - Wp)
    return float(np.sort(deltas)[k - 1]), deltas


def _fingerprint(X: sp.csr_matrix) -> str:
    hsh = hashlib.blake2b(digest_size=16)
    for a in (np.asarray(X.shape), X.indptr, X.indices, X.data):
        hsh.update(np.ascontiguousarray(a).tobytes())
    return hsh.hexdigest()


# ----------------------------------------------------------------------------- the release

def fit(counts, n_topics: int, *, epsilon: float | None, delta: float, seed: int,
        alpha: float | None = None, eta: float | None = None, gamma: float | None = 0.3,
        n_sensitivity_samples: int | None = None, calibration: str = "paper",
        renyi_order: float = 2.0, sensitivity: float | None = None,
        sensitivity_n_docs: int | None = None, base: str = "online",
        base_kwargs: dict | None = None, cache: bool = True, **kw):
    """TopicDP (seed 004): non-private base model + Gaussian output perturbation with a sampled
    sensitivity. Returns (topic_word (k, V) on the simplex, info).

    gamma / n_sensitivity_samples : random-DP confidence γ and/or sample count h (see
        :func:`sampler_parameters`); default γ = 0.3 (h = 24). The paper's default γ = 0.1
        needs h = 285.
    calibration : "paper" (Rényi order ``renyi_order``, 2 in the paper) or "optimal_order".
    sensitivity : a precomputed Δ_s (skips Algorithm 1).
    sensitivity_n_docs : size of the sampled neighbouring datasets (default: N, as the paper).
    base, base_kwargs : the base topic model (see :func:`base_topic_model`).
    ``epsilon=None`` returns the base model's topics without noise.
    """
    if kw:
        raise TypeError(f"fit() got unexpected keyword arguments: {sorted(kw)}")
    t0 = time.perf_counter()
    X = _dpsvi._as_counts(counts)
    n, V = X.shape
    _dpsvi._check_n_topics(n_topics)
    if alpha is not None and not alpha > 0 or eta is not None and not eta > 0:
        raise ValueError(f"alpha and eta must be > 0, got {alpha}, {eta}")
    if base not in BASES:
        raise ValueError(f"base must be one of {BASES}, got {base!r}")
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    private = epsilon is not None and not (isinstance(epsilon, float) and math.isinf(epsilon))
    if private:
        _dpsvi._check_privacy(epsilon, delta)
        order = optimal_order(epsilon, delta) if calibration == "optimal_order" else float(renyi_order)
        renyi_epsilon(epsilon, delta, order)                       # validates before training
    if sensitivity is not None and not (sensitivity >= 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
    params = sampler_parameters(gamma, n_sensitivity_samples)

    W = base_topic_model(X, n_topics, seed=seed, base=base, alpha=alpha, eta=eta,
                         **(base_kwargs or {}))
    t_base = time.perf_counter() - t0
    info = {"method": "TopicDP (Wang et al., KDD 2022; seed 004) output perturbation",
            "private": private, "base": base, "base_seconds": t_base,
            "unit": "one document (the paper's unit is one user; no user ids here)",
            "neighbouring": "replace one document, pairs drawn at random from P (random DP)",
            "guarantee": GUARANTEE if private else "none (epsilon=None: base model only)",
            "delta": delta, "epsilon": epsilon}
    if not private:
        info["fit_seconds"] = time.perf_counter() - t0
        return W, info

    t1 = time.perf_counter()
    deltas = None
    if sensitivity is None:
        key = (_fingerprint(X), n_topics, seed, params["h"], params["k"], sensitivity_n_docs, base,
               alpha, eta, tuple(sorted((base_kwargs or {}).items())))
        hit = _SENSITIVITY_CACHE.get(key) if cache else None
        if hit is None:
            rng = np.random.default_rng([seed, 1])
            ds, deltas = sample_sensitivity(X, n_topics, h=params["h"], k=params["k"], seed=seed,
                                            rng=rng, n_docs=sensitivity_n_docs, base=base,
                                            alpha=alpha, eta=eta, base_kwargs=base_kwargs)
            hit = {"sensitivity": ds, "samples": deltas, "seconds": time.perf_counter() - t1}
            if cache:
                _SENSITIVITY_CACHE[key] = hit
            info["sensitivity_cached"] = False
        else:
            info["sensitivity_cached"] = True
        sensitivity, deltas = hit["sensitivity"], hit["samples"]
        info["sensitivity_seconds"] = hit["seconds"]
        info["sensitivity_source"] = "Algorithm 1 (sampled from the documents)"
    else:
        info["sensitivity_source"] = "given"
    sigma, eps_r = noise_scale(sensitivity, epsilon, delta, order)

    rng = np.random.default_rng([seed, 2])
    noisy = W + rng.normal(0.0, sigma, size=W.shape) if sigma > 0 else W.copy()
    noisy = np.clip(noisy, 0.0, None)
    sums = noisy.sum(axis=1, keepdims=True)
    empty = sums[:, 0] <= 0
    noisy[empty] = 1.0
    sums[empty] = V
    topic_word = noisy / sums

    if sensitivity > 0:
        import dp_accounting
        eps_exact = float(dp_accounting.get_epsilon_gaussian(sigma / sensitivity, delta))
    else:
        eps_exact = 0.0
    info.update({
        "sensitivity": float(sensitivity),
        "sensitivity_samples": None if deltas is None else [float(x) for x in deltas],
        "h": params["h"], "k_index": params["k"], "rho": params["rho"], "gamma": params["gamma"],
        "sensitivity_n_docs": n if sensitivity_n_docs is None else int(sensitivity_n_docs),
        "calibration": calibration, "renyi_order": order, "epsilon_renyi": eps_r,
        "sigma": sigma, "noise_multiplier": sigma / sensitivity if sensitivity > 0 else math.inf,
        "expected_noise_amplitude": 2.0 * sigma / math.sqrt(2.0 * math.pi),   # Theorem 5
        "epsilon_gaussian_exact": eps_exact,
        "rows_reset_to_uniform": int(empty.sum()),
        "fit_seconds": time.perf_counter() - t0,
    })
    return topic_word, info
