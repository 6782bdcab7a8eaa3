"""Differentially private vocabulary selection (issue 11; proofs in docs/privacy.md).

Two mechanisms over the documents of the *selection slice* (a set of documents chosen by a rule
of each document alone, disjoint from the whitening warm-up and the stream, so it is its own
accounting atom ``"vocabulary"`` and composes in parallel with them):

1. **Candidates from a public list** (e.g. wordfreq's top 100,000): a document-frequency
   histogram over the candidates, where every document contributes 1 to at most
   ``max_words_per_doc`` = m distinct candidates (the first m distinct candidate words in the
   document's own order: a rule of that document alone). Adding or removing one document
   changes the histogram by a 0/1 vector with at most m ones, so its L2 sensitivity is √m.
   Gaussian noise N(0, σ²) on every candidate (the whole public list, present or not), ρ =
   m/(2σ²). The top ``size`` candidates by noisy count (above ``min_noisy_count_sd``·σ) are
   kept: post-processing of the noisy histogram.
2. **Words outside the public list** (domain words, product names): DP partition selection with
   OpenDP's ``make_gaussian_threshold`` (Rogers 2023; the vetted implementation) over the
   document frequencies of non-candidate words, each document contributing 1 to at most
   ``max_new_words_per_doc`` = m' distinct such words (its first m'). Its input distance under
   add/remove is (ℓ0 ≤ m', ℓ2 ≤ √m', ℓ∞ ≤ 1); OpenDP's privacy map gives (ρ', δ') approximate
   zCDP, recorded as a :class:`GaussianEvent` with ``delta=δ'`` on the ``"vocabulary"``
   partition (the accountant composes it: streamdp.privacy.accountant).

Everything is charged through a :class:`BudgetSpender` (reserve → draw → commit), as every
other release. The noise of (1) goes through the configured :class:`GaussianSampler`; (2) is
drawn by OpenDP itself.

For the release service, the histogram is **mergeable**: each sketcher counts its partitions in a
:class:`CandidateHistogram`, sends ``to_dict()`` (msgpack-friendly), and the release service adds
them (``CandidateHistogram.from_dict(a) + ...`` or :meth:`CandidateHistogram.merge`) and calls
:func:`select_vocabulary` once with the accountant (or a ``SpendSession``) and the sampler.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from streamdp.privacy.accountant import Accountant
from streamdp.privacy.conversions import zcdp_epsilon, zcdp_rho
from streamdp.privacy.events import VOCABULARY, BudgetSpender, GaussianEvent, sigma_for_rho
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.noise import GaussianSampler, make_sampler
from streamdp.privacy.spend import spend
from streamdp.text.public_vocab import public_vocabulary
from streamdp.text.vocabulary import Vocabulary

BLOCK_CANDIDATES = "vocabulary"
BLOCK_NEW_WORDS = "vocabulary_new_words"
MECHANISM_CANDIDATES = "vocabulary-gaussian-topk"
MECHANISM_NEW_WORDS = "opendp-gaussian-threshold"
SLICE_SALT = "streamdp-vocabulary-slice-v1"


class InsufficientSelection(ValueError):
    """Too few words survived the noise: the selection slice is too small for the budget."""


@dataclass(frozen=True)
class SelectionConfig:
    """Public parameters of the selection (every one of them is published in the report).

    size : int                    candidate words kept (top by noisy document frequency)
    max_words_per_doc : int       m, distinct candidates one document counts for (L2 √m)
    candidates : "noisy" | "public"
        "noisy": rank candidates by noisy document frequency (mechanism 1);
        "public": keep the first ``size`` candidates by their public rank (no spend; all of ρ
        goes to mechanism 2) — the "public ∪ DP-selected" vocabulary
    new_words : bool              run mechanism 2 (words outside the public list)
    max_new_words_per_doc : int   m', distinct non-candidate words one document counts for
    new_words_rho_share : float   share of the selection's ρ for mechanism 2 (with "noisy")
    new_words_delta_share : float share of the total δ spent by mechanism 2 (δ')
    max_new_words : int or None   keep at most this many new words (highest noisy counts)
    min_noisy_count_sd : float or None
                                  a candidate is kept only if its noisy count > this · σ;
                                  None: Φ⁻¹(1 − 1/n_candidates), so about one candidate that
                                  no document used passes by noise alone
    fill_from_public : bool       after the privately kept candidates, fill up to ``size``
                                  with the candidates in public rank order (post-processing
                                  with public data: no cost)
    min_words : int               fewer privately selected words (candidates above the cut
                                  plus new words) → :class:`InsufficientSelection`
    slice_share : float           share of the warm-up documents that form the selection slice
                                  (:func:`in_selection_slice`; used by ``streamdp.fit``)
    """

    size: int = 5000
    max_words_per_doc: int = 32
    candidates: str = "noisy"
    new_words: bool = True
    max_new_words_per_doc: int = 8
    new_words_rho_share: float = 0.25
    new_words_delta_share: float = 0.5
    max_new_words: int | None = 2000
    min_noisy_count_sd: float | None = None
    fill_from_public: bool = True
    min_words: int = 10
    slice_share: float = 0.25

    def __post_init__(self) -> None:
        for name in ("size", "max_words_per_doc", "max_new_words_per_doc", "min_words"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SelectionConfig.{name} must be a positive int, got {v!r}")
        if self.candidates not in ("noisy", "public"):
            raise ValueError(f"SelectionConfig.candidates must be 'noisy' or 'public', "
                             f"got {self.candidates!r}")
        if self.candidates == "public" and not self.new_words:
            raise ValueError("candidates='public' without new_words selects nothing privately: "
                             "use `streamdp vocab public` instead")
        for name in ("new_words_rho_share", "new_words_delta_share", "slice_share"):
            v = getattr(self, name)
            if not (0.0 < v < 1.0):
                raise ValueError(f"SelectionConfig.{name} must be in (0, 1), got {v!r}")
        if self.max_new_words is not None and (not isinstance(self.max_new_words, int)
                                               or self.max_new_words < 1):
            raise ValueError(f"SelectionConfig.max_new_words must be a positive int or None, "
                             f"got {self.max_new_words!r}")
        if self.min_noisy_count_sd is not None and not self.min_noisy_count_sd >= 0:
            raise ValueError("SelectionConfig.min_noisy_count_sd must be >= 0")

    @property
    def uses_delta(self) -> bool:
        return self.new_words

    def to_dict(self) -> dict:
        return asdict(self)


def in_selection_slice(key: str | bytes, share: float, *, salt: str = SLICE_SALT) -> bool:
    """Whether a document belongs to the selection slice: SHA-256(salt, key) < share.

    ``key`` must be a function of the document alone (its id, or its text/tokens), so the slice
    is a partition of documents by their own content (parallel composition, docs/privacy.md).
    """
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    h = hashlib.sha256(salt.encode("utf-8") + b"\x00" + data).digest()
    return int.from_bytes(h[:8], "big") < share * 2.0**64


def document_key(tokens: Sequence[str]) -> str:
    """The slice key of a token list (its tokens joined by U+001F)."""
    return "\x1f".join(tokens)


# ------------------------------------------------------------------------------ histogram
class CandidateHistogram:
    """Clipped document frequencies of one slice of documents; mergeable by addition.

    ``counts[j]``: documents that counted candidate ``j`` (each document counts at most
    ``max_words_per_doc`` distinct candidates: its first ones, in its own order);
    ``new_counts[w]``: documents that counted non-candidate word ``w`` (at most
    ``max_new_words_per_doc`` per document). The raw counts are private: only
    :func:`select_vocabulary` may publish anything derived from them.
    """

    def __init__(self, candidates: Vocabulary, *, max_words_per_doc: int,
                 max_new_words_per_doc: int, new_words: bool = True) -> None:
        self.candidates = candidates
        self.candidates_id = candidates.vocabulary_id
        self.max_words_per_doc = int(max_words_per_doc)
        self.max_new_words_per_doc = int(max_new_words_per_doc)
        self.new_words = bool(new_words)
        self.counts = np.zeros(len(candidates), dtype=np.int64)
        self.new_counts: Counter[str] = Counter()
        self.n_docs = 0

    @classmethod
    def for_config(cls, candidates: Vocabulary, config: SelectionConfig) -> "CandidateHistogram":
        return cls(candidates, max_words_per_doc=config.max_words_per_doc,
                   max_new_words_per_doc=config.max_new_words_per_doc, new_words=config.new_words)

    def add_document(self, tokens: Iterable[str]) -> None:
        if isinstance(tokens, str):
            raise TypeError("add_document takes a token list, not a str (tokenize first)")
        m, m_new = self.max_words_per_doc, self.max_new_words_per_doc
        n_cand = n_new = 0
        get = self.candidates.get
        for w in dict.fromkeys(tokens):            # distinct, in the document's own order
            j = get(w)
            if j is not None:
                if n_cand < m:
                    self.counts[j] += 1
                    n_cand += 1
            elif self.new_words and n_new < m_new:
                self.new_counts[w] += 1
                n_new += 1
            if n_cand >= m and (n_new >= m_new or not self.new_words):
                break
        self.n_docs += 1

    def add_documents(self, documents: Iterable[Iterable[str]]) -> "CandidateHistogram":
        for doc in documents:
            self.add_document(doc)
        return self

    def _check_compatible(self, other: "CandidateHistogram") -> None:
        if not isinstance(other, CandidateHistogram):
            raise TypeError(f"cannot merge a CandidateHistogram with {type(other).__name__}")
        mine = (self.candidates_id, self.max_words_per_doc, self.max_new_words_per_doc,
                self.new_words)
        theirs = (other.candidates_id, other.max_words_per_doc, other.max_new_words_per_doc,
                  other.new_words)
        if mine != theirs:
            raise ValueError(f"histograms differ in (candidates id, m, m', new_words): {mine} "
                             f"vs {theirs}; every counter must use the same public parameters")

    def merge(self, other: "CandidateHistogram") -> "CandidateHistogram":
        """Add ``other`` into this histogram (disjoint documents); returns self."""
        self._check_compatible(other)
        self.counts += other.counts
        self.new_counts.update(other.new_counts)
        self.n_docs += other.n_docs
        return self

    def __add__(self, other: "CandidateHistogram") -> "CandidateHistogram":
        out = CandidateHistogram(self.candidates, max_words_per_doc=self.max_words_per_doc,
                                 max_new_words_per_doc=self.max_new_words_per_doc,
                                 new_words=self.new_words)
        return out.merge(self).merge(other)

    def to_dict(self) -> dict[str, Any]:
        """msgpack/JSON-friendly (sparse: only non-zero candidate counts)."""
        nz = np.flatnonzero(self.counts)
        words = sorted(self.new_counts)
        return {"version": 1, "candidates_id": self.candidates_id,
                "n_candidates": len(self.candidates),
                "max_words_per_doc": self.max_words_per_doc,
                "max_new_words_per_doc": self.max_new_words_per_doc,
                "new_words": self.new_words, "n_docs": int(self.n_docs),
                "candidate_index": nz.tolist(), "candidate_count": self.counts[nz].tolist(),
                "new_word": words, "new_word_count": [int(self.new_counts[w]) for w in words]}

    @classmethod
    def from_dict(cls, obj: dict[str, Any], candidates: Vocabulary) -> "CandidateHistogram":
        if obj.get("version") != 1:
            raise ValueError(f"unknown CandidateHistogram version {obj.get('version')!r}")
        if obj["candidates_id"] != candidates.vocabulary_id:
            raise ValueError(f"histogram counts candidates {obj['candidates_id']}, not the given "
                             f"list {candidates.vocabulary_id}")
        h = cls(candidates, max_words_per_doc=obj["max_words_per_doc"],
                max_new_words_per_doc=obj["max_new_words_per_doc"], new_words=obj["new_words"])
        idx = np.asarray(obj["candidate_index"], dtype=np.int64)
        cnt = np.asarray(obj["candidate_count"], dtype=np.int64)
        if idx.shape != cnt.shape or (idx.size and (idx.min() < 0 or idx.max() >= len(candidates))) \
                or (cnt < 0).any():
            raise ValueError("corrupt CandidateHistogram: bad candidate indices or counts")
        np.add.at(h.counts, idx, cnt)
        if len(obj["new_word"]) != len(obj["new_word_count"]):
            raise ValueError("corrupt CandidateHistogram: new_word and new_word_count differ in length")
        h.new_counts.update(dict(zip(obj["new_word"], map(int, obj["new_word_count"]))))
        h.n_docs = int(obj["n_docs"])
        return h


# ------------------------------------------------------------------------------ planning
def _threshold_measurement(sigma: float, threshold: float):
    import opendp.prelude as dp
    dp.enable_features("contrib")
    domain = dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T=float, nan=False))
    metric = dp.l02inf_distance(dp.absolute_distance(T=float))
    return dp.m.make_gaussian_threshold(domain, metric, scale=float(sigma),
                                        threshold=float(threshold))


def _threshold_privacy(sigma: float, threshold: float, m_new: int) -> tuple[float, float]:
    """OpenDP's (ρ, δ) for a neighbour at distance (ℓ0 = m', ℓ2 = √m', ℓ∞ = 1)."""
    rho, delta = _threshold_measurement(sigma, threshold).map((m_new, math.sqrt(m_new), 1.0))
    return float(rho), float(delta)


def threshold_for_delta(sigma: float, m_new: int, delta: float) -> float:
    """Smallest threshold (to 1e-6 relative) whose OpenDP δ is ≤ ``delta``."""
    lo, hi = 1.0, 2.0
    while _threshold_privacy(sigma, hi, m_new)[1] > delta:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            raise ValueError(f"no threshold reaches δ={delta} at σ={sigma}")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _threshold_privacy(sigma, mid, m_new)[1] > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-6 * hi:
            break
    return hi


@dataclass(frozen=True)
class SelectionPlan:
    """The events (and parameters) of one selection, fixed before any count is looked at."""

    config: SelectionConfig
    rho: float                       # total ρ of the selection (vocabulary atom)
    delta_new_words: float           # δ' of the partition selection (0 without it)
    sigma_candidates: float | None
    sigma_new_words: float | None
    threshold_new_words: float | None
    events: tuple[GaussianEvent, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"rho": self.rho, "delta_new_words": self.delta_new_words,
                "sigma_candidates": self.sigma_candidates,
                "sigma_new_words": self.sigma_new_words,
                "threshold_new_words": self.threshold_new_words,
                "events": [e.to_dict() for e in self.events], "config": self.config.to_dict()}


def plan_selection(config: SelectionConfig, *, epsilon: float, delta: float,
                   rho: float | None = None) -> SelectionPlan:
    """Noise scales for ``config`` at the vocabulary atom's budget.

    With ``rho=None`` the selection gets its atom's whole budget: zcdp_rho(ε, δ − δ') where
    δ' = ``new_words_delta_share``·δ is what the partition selection spends (the slice is
    disjoint from every other atom, so it does not share ρ with them).
    """
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"a private selection needs ε > 0 and 0 < δ < 1, got ({epsilon}, {delta})")
    delta_new = config.new_words_delta_share * delta if config.new_words else 0.0
    if rho is None:
        rho = zcdp_rho(epsilon, delta - delta_new)
    if not rho > 0:
        raise ValueError(f"rho must be > 0, got {rho}")
    m, m_new = config.max_words_per_doc, config.max_new_words_per_doc
    events: list[GaussianEvent] = []
    sigma_c = sigma_n = thr = None
    if config.candidates == "noisy":
        rho_c = rho * (1.0 - config.new_words_rho_share) if config.new_words else rho
        sigma_c = sigma_for_rho(math.sqrt(m), rho_c)
        events.append(GaussianEvent(block=BLOCK_CANDIDATES, sensitivity=math.sqrt(m),
                                    sigma=sigma_c, partition=VOCABULARY,
                                    mechanism=MECHANISM_CANDIDATES))
    if config.new_words:
        rho_n = rho * config.new_words_rho_share if config.candidates == "noisy" else rho
        sigma_n = sigma_for_rho(math.sqrt(m_new), rho_n)
        thr = threshold_for_delta(sigma_n, m_new, delta_new)
        rho_map, delta_map = _threshold_privacy(sigma_n, thr, m_new)
        # OpenDP's map is the authority: record what it says (≈ ρ_n, ≤ δ').
        events.append(GaussianEvent(block=BLOCK_NEW_WORDS, sensitivity=math.sqrt(m_new),
                                    sigma=sigma_n, partition=VOCABULARY,
                                    mechanism=MECHANISM_NEW_WORDS, delta=delta_map))
        if rho_map > events[-1].rho * (1 + 1e-9):
            raise AssertionError(f"OpenDP's ρ {rho_map} exceeds the event's {events[-1].rho}")
        delta_new = delta_map
    return SelectionPlan(config, float(rho), float(delta_new), sigma_c, sigma_n, thr, tuple(events))


# ------------------------------------------------------------------------------ selection
@dataclass(frozen=True)
class VocabularySelection:
    """The published result: the vocabulary (with its content id), the events, the report."""

    vocabulary: Vocabulary
    events: tuple[GaussianEvent, ...]
    report: dict


def select_vocabulary(histogram: CandidateHistogram, plan: SelectionPlan, *,
                      spender: BudgetSpender, sampler: GaussianSampler,
                      label: str = "vocabulary") -> VocabularySelection:
    """Reserve the plan's events, draw the noise, keep the words, commit; see module docstring.

    Raises :class:`InsufficientSelection` (after spending: the noise was drawn) when fewer than
    ``config.min_words`` words are kept; the message gives the numbers and the fix.
    """
    cfg = plan.config
    cut_sd = cfg.min_noisy_count_sd
    if cut_sd is None:
        from scipy.special import ndtri
        cut_sd = float(ndtri(1.0 - 1.0 / max(len(histogram.candidates), 2)))
    if (histogram.max_words_per_doc, histogram.max_new_words_per_doc, histogram.new_words) != \
            (cfg.max_words_per_doc, cfg.max_new_words_per_doc, cfg.new_words):
        raise ValueError("the histogram was counted with other clip parameters (m, m', new_words) "
                         "than the plan's config: the sensitivity would not hold")
    cands = histogram.candidates

    def draw():
        # every draw of the selection (after the reservation is durable)
        kept_candidates: list[str] = []
        noisy_above = 0
        if cfg.candidates == "noisy":
            noisy = np.asarray(sampler.add_noise(histogram.counts.astype(np.float64),
                                                 plan.sigma_candidates), dtype=np.float64)
            cut = cut_sd * plan.sigma_candidates
            above = np.flatnonzero(noisy > cut)
            noisy_above = int(above.size)
            order = above[np.lexsort((above, -noisy[above]))][:cfg.size]
            kept_candidates = [cands[int(j)] for j in order]
            n_private = len(kept_candidates)
            if cfg.fill_from_public and len(kept_candidates) < cfg.size:
                chosen = set(kept_candidates)
                for w in cands.words:
                    if len(kept_candidates) >= cfg.size:
                        break
                    if w not in chosen:
                        kept_candidates.append(w)
        else:
            kept_candidates = list(cands.words[:cfg.size])
            n_private = 0
        new_words: list[str] = []
        if cfg.new_words:
            meas = _threshold_measurement(plan.sigma_new_words, plan.threshold_new_words)
            released = meas({w: float(c) for w, c in histogram.new_counts.items()}) \
                if histogram.new_counts else {}
            ranked = sorted(released.items(), key=lambda kv: (-kv[1], kv[0]))
            if cfg.max_new_words is not None:
                ranked = ranked[:cfg.max_new_words]
            new_words = [w for w, _ in ranked]
        return kept_candidates, n_private, noisy_above, new_words

    # reserve → draw → persist → commit: the one spend protocol (streamdp.privacy.spend)
    kept_candidates, n_private, noisy_above, new_words = spend(
        spender, plan.events, label=label, draw=draw)
    kept_candidates, new_words = list(kept_candidates), list(new_words)
    # ---- post-processing
    words = kept_candidates + [w for w in new_words if w not in set(kept_candidates)]
    if n_private + len(new_words) < cfg.min_words:
        n = histogram.n_docs
        raise InsufficientSelection(
            f"private vocabulary selection kept {n_private + len(new_words)} words "
            f"(< min_words={cfg.min_words}): "
            + (f"{noisy_above} candidates had a noisy document frequency above {cut_sd:g}σ = "
               f"{cut_sd * plan.sigma_candidates:.1f} and " if plan.sigma_candidates else "")
            + f"{len(new_words)} new words passed the threshold "
            f"{plan.threshold_new_words or 0:.1f}; the selection slice has {n} documents (this "
            f"count is private: do not publish it), ρ={plan.rho:.4g}. A word needs about "
            f"{(cut_sd * (plan.sigma_candidates or plan.sigma_new_words)):.0f} "
            "documents to be seen. Fix: give the selection more documents (a larger "
            "slice_share or a longer warm-up), a larger ε, or use a public vocabulary "
            "(`streamdp vocab public`), which costs nothing.")
    vocab = Vocabulary(words)
    events = tuple(plan.events)
    rho_total = float(sum(e.rho for e in events))
    report = {
        "vocabulary_id": vocab.vocabulary_id, "size": len(vocab),
        "selection": "private", "unit": "one document, add/remove",
        "partition": VOCABULARY,
        "candidates_id": histogram.candidates_id, "n_candidates": len(cands),
        "n_from_candidates": len(kept_candidates),
        "n_candidates_above_cut": n_private if cfg.candidates == "noisy" else None,
        "n_new_words": len(words) - len(kept_candidates),
        "candidates_mode": cfg.candidates,
        "min_noisy_count": None if plan.sigma_candidates is None
        else cut_sd * plan.sigma_candidates,
        "clip": {"max_words_per_doc": cfg.max_words_per_doc,
                 "max_new_words_per_doc": cfg.max_new_words_per_doc,
                 "rule": "first distinct words in the document's own order"},
        "rho": rho_total, "delta_approximate": float(sum(e.delta for e in events)),
        "plan": plan.to_dict(), "events": [e.to_dict() for e in events],
        "sampler": getattr(sampler, "name", None),
        "new_words_mechanism": "OpenDP make_gaussian_threshold (Rogers 2023)" if cfg.new_words
        else None,
    }
    return VocabularySelection(vocab, events, report)


def selection_epsilon(plan: SelectionPlan, delta: float) -> float:
    """ε of a selection-slice document at total δ (δ − δ' left for the zCDP conversion)."""
    return zcdp_epsilon(float(sum(e.rho for e in plan.events)), delta - plan.delta_new_words)


# ------------------------------------------------------------------------------ one call
DEFAULT_CANDIDATES = 100_000


def default_candidates(tokenizer=None, *, lang: str = "en", size: int = DEFAULT_CANDIDATES) -> Vocabulary:
    """The public candidate list: the ``size`` most frequent wordfreq words (public_vocab)."""
    return public_vocabulary(lang, size=size, tokenizer=tokenizer)[0]


def select_from_documents(documents: Iterable[Sequence[str]], *, epsilon: float, delta: float,
                          config: SelectionConfig | None = None,
                          candidates: Vocabulary | None = None, spender: BudgetSpender | None = None,
                          sampler: GaussianSampler | None = None,
                          label: str = "vocabulary") -> VocabularySelection:
    """Count ``documents`` (token lists, all of them in the selection slice) and select.

    ``spender`` defaults to a fresh in-memory :class:`~streamdp.privacy.Accountant` with
    (ε, δ); ``sampler`` to OpenDP's; ``candidates`` to :func:`default_candidates`.
    """
    cfg = config if config is not None else SelectionConfig()
    cands = candidates if candidates is not None else default_candidates()
    hist = CandidateHistogram.for_config(cands, cfg).add_documents(documents)
    plan = plan_selection(cfg, epsilon=epsilon, delta=delta)
    spender = spender if spender is not None else Accountant(epsilon, delta, MemoryLedger())
    sampler = sampler if sampler is not None else make_sampler()
    sel = select_vocabulary(hist, plan, spender=spender, sampler=sampler, label=label)
    sel.report["epsilon_of_selection_documents"] = selection_epsilon(plan, delta)
    return sel
