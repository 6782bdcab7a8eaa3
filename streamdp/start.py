"""How a one-shot refinement starts: the start choices, the public start, and THE start rule.

The refinement passes (:mod:`streamdp.refinement`) need a public model to fold documents into.
Three starts exist (issue 22, DESIGN §9):

* ``"tensor"``: the private spectral release (tensor power method) — exact on large streams;
* ``"cluster"``: the private clustering start in the warm-up subspace
  (:mod:`streamdp.cluster_start`) — k×k′ noisy sums instead of a k′³ tensor, so it works
  at 20–50k stream documents;
* a :class:`PublicStart`: topics the operator fitted without privacy on documents it
  declares public. It spends nothing and is recorded in the privacy report as public input.

``"auto"`` applies :func:`choose_start` to a noised document count (docs/privacy.md, "The
start rule"): the choice reads only that released value, ρ and the public shape (k, k′).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

START_CHOICES = ("auto", "tensor", "cluster")
#: share of the stream ρ the "auto" rule spends on its noised document count (taken from the
#: start's share): at ε = 1, δ = 10⁻⁶ its σ is ≈ 53 documents
AUTO_COUNT_SHARE = 0.01
#: the tensor start is chosen when its signal-to-noise index reaches this (measured:
#: synthetic LDA d = 1000, k = 10, 200k documents at ε = 1 has index ≈ 42, where the tensor
#: is near exact; Debian d = 5000, k = 20, 38.7k documents at ε = 4 has ≈ 5, where it is noise)
TENSOR_MIN_INDEX = 15.0


def tensor_index(n_docs: float, rho: float, k: int, k_prime: int) -> float:
    """ñ·√(2ρ) / (k·k′^{3/2}): the tensor start's signal-to-noise, up to a constant.

    The whitened third moment's signal per topic grows like n/k; the Gaussian noise on the
    k′×k′×k′ tensor has Frobenius norm σ·k′^{3/2} with σ ∝ 1/√(2ρ). Non-private (ρ None): ∞."""
    if rho is None:
        return math.inf
    return max(float(n_docs), 0.0) * math.sqrt(2.0 * rho) / (k * k_prime ** 1.5)


def choose_start(n_docs_noised: float, rho: float | None, k: int, k_prime: int) -> dict:
    """THE start rule: "tensor" when :func:`tensor_index` ≥ TENSOR_MIN_INDEX, else "cluster".
    Reads only a released (noised) count, the public ρ and the public shape."""
    idx = tensor_index(n_docs_noised, rho, k, k_prime)
    return {"start": "tensor" if idx >= TENSOR_MIN_INDEX else "cluster",
            "rule": f"tensor iff n_noised*sqrt(2 rho)/(k*k'^1.5) >= {TENSOR_MIN_INDEX:g}",
            "n_docs_noised": float(n_docs_noised), "index": idx if math.isfinite(idx) else None}


#: the continual selection rule publishes the spectral decomposition when the released
#: tensor's signal-to-noise index (streamdp.release.tensor_snr) reaches this: the noise's
#: spectral norm estimate is then below the scale of the smallest whitened signal eigenvalue
#: (≥ 2√(α0+1)/(α0+2) ≈ 0.94 at α0 = 1). Measured (docs/benchmarks.md, issue 22 item 4):
#: synthetic LDA d = 1000, k = 10, ε = 1 reaches 1 at ≈ 30k stream documents, where its spectral
#: decomposition is 3× closer to the truth than the refined release (0.029 vs 0.087 L2);
#: Debian descriptions (k = 10, d = 2000 and k = 20, d = 5000, ε = 4, up to 38.6k documents)
#: give 0: their k-th whitening eigenvalue is within the noise on K
SPECTRAL_MIN_SNR = 1.0


def choose_continual_topics(snr: float | None, fold_model_snr: float | None = None) -> dict:
    """THE continual selection rule (docs/privacy.md "The continual selection rule"; issue 22
    item 4): a refined continual release publishes the spectral decomposition of the same
    released sums when their whitened tensor's signal-to-noise index ``snr``
    (:func:`streamdp.release.tensor_snr`, released values only) reaches SPECTRAL_MIN_SNR
    **and** some of its refinement rows were folded into a model that was noise by the same
    index (``fold_model_snr``: the smallest index of the releases whose topics the refined
    epochs were folded into; ∞ for a public start, None: not known, taken as noise), and
    its refined topics otherwise: post-processing, no budget. Why both: the refinement sums
    are cumulative, so rows folded into a noise model bias every later refined release
    (synthetic LDA: refined 0.09 against spectral 0.03 at index 1), while rows folded into
    informative models make the refined release the better one even at a high index (the
    demo: folded into an index-3.9 model, refined 0.020 against spectral 0.062 at index 11.7).
    Without noise (``snr`` None) the refinement is kept (a non-private run's releases are as
    before)."""
    fold = 0.0 if fold_model_snr is None else float(fold_model_snr)
    informative = snr is not None and math.isfinite(snr) and snr >= SPECTRAL_MIN_SNR
    source = "spectral" if informative and fold < SPECTRAL_MIN_SNR else "refinement"
    return {"published": source, "snr": None if snr is None or not math.isfinite(snr) else float(snr),
            "fold_model_snr": fold if math.isfinite(fold) else None,
            "rule": f"spectral iff lambda_k(K)^1.5*N/(sigma_3*sqrt(k)) >= {SPECTRAL_MIN_SNR:g} "
                    f"and some refinement rows were folded into a model whose index was "
                    f"< {SPECTRAL_MIN_SNR:g} (private releases only)"}


#: the services' rule does not choose the tensor start when the warm-up subspace's noise-to-signal
#: (:func:`warmup_subspace_nts`) is above this: the tensor start's topics are Q·U, so a subspace
#: that misses the k-th topic direction makes them noise whatever the tensor's own index.
#: Measured (the demo, docs/services.md §The start): tensor better at 0.117 (137 words, ε = 1),
#: public better at 0.21 (20,000 words, ε = 4), 0.22 (137 words, ε = 0.5) and 0.77 (20,000, ε = 1)
WARMUP_MAX_NTS = 0.15


def warmup_subspace_nts(Y, sigma: float | None, k: int) -> float:
    """The warm-up subspace's released noise-to-signal: σ_w(√d + √k′) / ŝ_k.

    ``Y`` is the warm-up's noised range sum (d × k′, the draw Q = orth(Y) is taken from), σ_w its
    public noise sd. σ_w(√d + √k′) bounds the spectral norm of the d × k′ Gaussian noise, and
    ŝ_k² = λ_k(YᵀY) − σ_w²(√d + √k′)² estimates the k-th signal singular value; by Wedin's
    theorem the sine of the angle between Q and the k-th topic direction is about their ratio.
    It sees the vocabulary size d (the noise grows like √d, the signal does not). ∞ when the
    k-th direction is within the noise; 0 without noise (``sigma`` None). Post-processing of a
    released value: no budget."""
    if sigma is None:
        return 0.0
    Y = np.asarray(Y, dtype=np.float64)
    d, kp = Y.shape
    noise = float(sigma) * (math.sqrt(d) + math.sqrt(kp))
    eig = np.sort(np.linalg.eigvalsh(Y.T @ Y))[::-1]
    signal2 = float(eig[min(k, kp) - 1]) - noise ** 2
    return math.inf if signal2 <= 0 else noise / math.sqrt(signal2)


def choose_service_start(n_docs_noised: float | None, rho: float | None, k: int, k_prime: int,
                         *, public_available: bool, warmup_nts: float | None = None) -> dict:
    """THE start rule of the services (docs/privacy.md "The start in the services"; issue 22):
    the rule of :func:`choose_start` on the warm-up's noised document count (a released value:
    the total of its noised clip histogram, no extra budget), and "tensor" only where the
    warm-up subspace's released noise-to-signal ``warmup_nts`` (:func:`warmup_subspace_nts`,
    which sees d) is ≤ WARMUP_MAX_NTS; its "cluster" means the public start if the operator
    configured one (the services have no clustering start), else the tensor start.
    Non-private (``rho`` None, ``warmup_nts`` 0): tensor, as :func:`choose_start`."""
    got = choose_start(0.0 if n_docs_noised is None else n_docs_noised, rho, k, k_prime)
    rule_choice = got["start"]
    nts = 0.0 if warmup_nts is None else float(warmup_nts)
    if rule_choice == "tensor" and nts > WARMUP_MAX_NTS:
        rule_choice = "cluster"
    start = rule_choice
    if start == "cluster":
        start = "public" if public_available else "tensor"
    return {**got, "start": start, "rule_choice": rule_choice,
            "warmup_nts": nts if math.isfinite(nts) else None,
            "rule": got["rule"] + f" and warm-up subspace noise-to-signal <= {WARMUP_MAX_NTS:g}",
            "count": "warm-up noised clip histogram total"}


def warmup_noised_count(hist) -> float:
    """The warm-up's noised document count: the mean total of its noised norm histograms
    (each block's histogram counts every warm-up document once). Post-processing."""
    h = np.asarray(hist, dtype=np.float64)
    return float(np.mean(h.reshape(-1, h.shape[-1]).sum(axis=1))) if h.size else 0.0


@dataclass(frozen=True, eq=False)
class PublicStart:
    """Topics fitted without privacy on documents the operator declares public.

    topic_word : (k, d)   rows on the simplex (made strictly positive and renormalised)
    alpha : (k,)          Dirichlet weights
    source : str          what the public documents are (goes into the privacy report)
    n_public_docs : int   how many public documents (reported)

    Fitting one on public documents needs the whole estimator, which sits above this module:
    :class:`streamdp.public_start.PublicStart` (exported as ``streamdp.PublicStart``) adds
    ``fit``.
    """

    topic_word: np.ndarray
    alpha: np.ndarray
    source: str
    n_public_docs: int = 0
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        B = np.asarray(self.topic_word, dtype=np.float64)
        if B.ndim != 2 or not np.all(np.isfinite(B)) or (B < 0).any():
            raise ValueError("a public start's topic_word must be a finite, non-negative k × d array")
        B = B + 1e-12
        B = B / B.sum(axis=1, keepdims=True)
        a = np.asarray(self.alpha, dtype=np.float64).ravel()
        if a.shape != (B.shape[0],) or not np.all(np.isfinite(a)) or (a <= 0).any():
            raise ValueError(f"a public start's alpha must be {B.shape[0]} positive numbers")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError("a public start needs source='...': say which public documents it "
                             "was fitted on (it is recorded in every privacy report)")
        object.__setattr__(self, "topic_word", B)
        object.__setattr__(self, "alpha", a)

    @property
    def n_topics(self) -> int:
        return self.topic_word.shape[0]

    @property
    def start_id(self) -> str:
        return hashlib.sha256(self.topic_word.tobytes() + self.alpha.tobytes()).hexdigest()[:16]

    def report(self) -> dict:
        """What the privacy report records: public input, no budget."""
        return {"public_input": True, "rho": 0.0, "source": self.source,
                "n_public_docs": int(self.n_public_docs), "start_id": self.start_id,
                "note": "topics fitted without privacy on documents the operator declared "
                        "public; the operator vouches that they are public"}

    @classmethod
    def from_snapshot(cls, snap, *, source: str) -> "PublicStart":
        """A snapshot fitted on public documents (e.g. a non-private ``fit``) as a start."""
        return cls(snap.topic_word, snap.alpha, source, int(round(float(snap.n_docs))),
                   {"release_id": snap.release_id})


# ------------------------------------------------------------------ the public start file
#: the services' start choices (docs/configuration.md): "cluster" is the estimator's only
SERVICE_START_CHOICES = ("auto", "tensor", "cluster", "public")
PUBLIC_START_KIND, PUBLIC_START_VERSION = "public_start", 1


class PublicStartFileError(ValueError):
    """A public start file is missing, unreadable or does not fit the deployment."""


def save_public_start(start: PublicStart, path, vocabulary) -> None:
    """Write ``start`` as a public start file (JSON) for ``vocabulary`` (its words are the
    columns of ``topic_word``; the file records the vocabulary_id to be checked at start-up)."""
    import json
    if start.topic_word.shape[1] != len(vocabulary):
        raise ValueError(f"the public start has {start.topic_word.shape[1]} words, the vocabulary "
                         f"{len(vocabulary)}")
    obj = {"kind": PUBLIC_START_KIND, "v": PUBLIC_START_VERSION, "source": start.source,
           "n_public_docs": int(start.n_public_docs), "vocabulary_id": vocabulary.vocabulary_id,
           "n_topics": start.n_topics,
           "alpha": start.alpha.tolist(), "topic_word": start.topic_word.tolist()}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)


def load_public_start(path, *, vocabulary_id: str | None, n_topics: int) -> PublicStart:
    """Read a public start file and check it fits the deployment: its vocabulary_id (None: not
    known yet, not checked) and its number of topics. PublicStartFileError says what to fix."""
    import json
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except FileNotFoundError:
        raise PublicStartFileError(f"no file at {str(path)!r}") from None
    except (OSError, ValueError) as exc:
        raise PublicStartFileError(f"cannot read {str(path)!r} as a public start file (JSON "
                                   f"written by `streamdp public-start`): {exc}") from None
    if not isinstance(obj, dict) or obj.get("kind") != PUBLIC_START_KIND:
        raise PublicStartFileError(f"{str(path)!r} is not a public start file (kind "
                                   f"{PUBLIC_START_KIND!r}); write one with `streamdp public-start`")
    if obj.get("v") != PUBLIC_START_VERSION:
        raise PublicStartFileError(f"{str(path)!r} has version {obj.get('v')!r}, this streamdp "
                                   f"reads version {PUBLIC_START_VERSION}")
    if vocabulary_id is not None and obj.get("vocabulary_id") != vocabulary_id:
        raise PublicStartFileError(f"{str(path)!r} was fitted on vocabulary "
                                   f"{obj.get('vocabulary_id')}, the deployment's vocabulary is "
                                   f"{vocabulary_id}: fit it again on the deployment's vocabulary "
                                   "(`streamdp public-start --vocabulary ...`)")
    try:
        start = PublicStart(np.asarray(obj["topic_word"], dtype=np.float64),
                            np.asarray(obj["alpha"], dtype=np.float64), str(obj.get("source") or ""),
                            int(obj.get("n_public_docs") or 0),
                            {"vocabulary_id": obj.get("vocabulary_id")})
    except (KeyError, TypeError, ValueError) as exc:
        raise PublicStartFileError(f"{str(path)!r}: {exc}") from None
    if start.n_topics != n_topics:
        raise PublicStartFileError(f"{str(path)!r} has {start.n_topics} topics, the deployment's "
                                   f"n_topics is {n_topics}: fit it again with --topics {n_topics}")
    return start


def check_start(start):
    if isinstance(start, PublicStart):
        return start
    if start not in START_CHOICES:
        raise ValueError(f"start must be one of {START_CHOICES} or a streamdp.PublicStart, "
                         f"got {start!r}")
    return start
