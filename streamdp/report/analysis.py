"""What the report shows, computed from snapshots alone (post-processing of public values).

* :func:`order_releases` — one entry per release (a re-publication has the same release id),
  in release order;
* :func:`follow_topics` — topics followed across consecutive releases: snapshots carry no topic
  id, so identity comes from the refinement where it holds (a refined release's topic i is the
  refinement of topic i of its model, docs/estimator.md) and from Hungarian matching of the
  topic-word rows (:func:`streamdp.evaluation.matching.match_topics`) elsewhere; both are
  computed for every link so the report can say where they disagree;
* :func:`budget_series` — the accountant's spend per release against the budget;
* :func:`noise_level` — a topic's noise-to-signal estimate in words.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from streamdp.evaluation.matching import match_topics
from streamdp.privacy.conversions import zcdp_epsilon
from streamdp.report.load import ReportInputError
from streamdp.snapshot import TopicSnapshot

#: noise-to-signal ratios below LOW read as "low", below 1 as "moderate", else noise-dominated
NOISE_LOW = 0.3
#: most ρ → ε conversions for the budget chart's stream line
MAX_CONVERSIONS = 100


def order_releases(snapshots: list[TopicSnapshot]) -> tuple[list[TopicSnapshot], int]:
    """Distinct releases by ``release_id`` in release order (epoch, then creation time), and the
    number of re-publications dropped (the release service republishes after a restart)."""
    seen: dict[str, TopicSnapshot] = {}
    for s in snapshots:
        seen.setdefault(s.release_id, s)
    ordered = sorted(seen.values(), key=lambda s: (s.epoch is None, s.epoch or 0, s.created_at))
    return ordered, len(snapshots) - len(seen)


def check_vocabulary(snapshots: list[TopicSnapshot], vocabulary) -> None:
    """Every snapshot's columns are ``vocabulary``'s words (size, and id where it has one)."""
    for s in snapshots:
        if s.vocabulary_id is not None and s.vocabulary_id != vocabulary.id:
            raise ReportInputError(f"release {s.release_id} (epoch {s.epoch}) uses vocabulary "
                                   f"{s.vocabulary_id}, the vocabulary file is {vocabulary.id}: "
                                   "pass the vocabulary the snapshots were released with")
        if s.topic_word.shape[1] != len(vocabulary):
            raise ReportInputError(f"release {s.release_id} has {s.topic_word.shape[1]} words per "
                                   f"topic, the vocabulary file {len(vocabulary)}: pass the "
                                   "vocabulary the snapshots were released with")


def release_label(s: TopicSnapshot, index: int) -> str:
    return f"epoch {s.epoch}" if s.epoch is not None else f"release {index + 1}"


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """½‖p − q‖₁: the share of probability mass that moved (0 = same topic, 1 = disjoint)."""
    return 0.5 * float(np.abs(np.asarray(p, float) - np.asarray(q, float)).sum())


@dataclass
class Link:
    """How the topics of one release continue those of the release before it.

    ``previous[i]`` is the index, in the earlier release, of the topic that topic i continues
    (None: not followed). ``method``: "refinement" (identity by index along a refined chain),
    "matched" (Hungarian matching) or None (different number of topics or words)."""
    method: str | None
    previous: list[int] | None
    matched: list[int] | None          # what matching alone would say (for the cross-check)
    reason: str

    @property
    def disagreements(self) -> list[int]:
        if self.previous is None or self.matched is None:
            return []
        return [i for i, (a, b) in enumerate(zip(self.previous, self.matched)) if a != b]


def link_releases(prev: TopicSnapshot, cur: TopicSnapshot) -> Link:
    if prev.topic_word.shape != cur.topic_word.shape:
        return Link(None, None, None, f"the model changed shape ({prev.topic_word.shape[0]} → "
                                      f"{cur.topic_word.shape[0]} topics, "
                                      f"{prev.topic_word.shape[1]} → {cur.topic_word.shape[1]} words)")
    p = match_topics(prev.topic_word, cur.topic_word)      # cur[p[i]] is matched to prev[i]
    matched = [int(j) for j in np.argsort(p)]              # cur topic j ↔ prev topic matched[j]
    if cur.stage == "refined" and cur.subspace_id == prev.subspace_id:
        return Link("refinement", list(range(cur.n_topics)), matched,
                    "refined release: topic i is the refinement of topic i of its model")
    return Link("matched", matched, matched,
                f"{cur.stage} release: topics matched to the previous release (minimum total L2 "
                "distance, Hungarian)")


@dataclass
class HistoryStep:
    label: str
    x: float
    topic: int
    alpha: float
    noise_to_signal: float | None
    top_words: list[tuple[str, float]]
    drift: float | None = None               # total variation to the previous step
    entered: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    method: str | None = None                # how this step was linked to the previous one
    previous_p: list[float] | None = None    # this step's top words' probabilities one step back


@dataclass
class TopicHistory:
    topic: int                               # index in the latest release
    steps: list[HistoryStep]                 # oldest first; the last is the latest release


def _x(s: TopicSnapshot, index: int) -> float:
    return float(s.epoch) if s.epoch is not None else float(index + 1)


def _nts(s: TopicSnapshot, i: int) -> float | None:
    return None if s.noise_to_signal is None else float(s.noise_to_signal[i])


def follow_topics(releases: list[TopicSnapshot], words, n_words: int = 10
                  ) -> tuple[list[Link], list[TopicHistory]]:
    """Links between consecutive releases, and each latest topic's history back to where it
    can be followed (every earlier release while the model keeps its shape)."""
    links = [link_releases(a, b) for a, b in zip(releases, releases[1:])]
    latest = releases[-1]
    histories = []
    for i in range(latest.n_topics):
        chain = [(len(releases) - 1, i)]
        for r in range(len(releases) - 1, 0, -1):
            link = links[r - 1]
            if link.previous is None:
                break
            chain.append((r - 1, link.previous[chain[-1][1]]))
        chain.reverse()
        steps = []
        for r, t in chain:
            s = releases[r]
            steps.append(HistoryStep(label=release_label(s, r), x=_x(s, r), topic=t,
                                     alpha=float(s.alpha[t]), noise_to_signal=_nts(s, t),
                                     top_words=_top(s.topic_word[t], words, n_words)))
            if len(steps) > 1:
                prev_step, prev_r = steps[-2], chain[len(steps) - 2][0]
                step = steps[-1]
                step.drift = total_variation(releases[prev_r].topic_word[prev_step.topic],
                                             s.topic_word[t])
                before = [w for w, _ in prev_step.top_words]
                now = [w for w, _ in step.top_words]
                step.entered = [w for w in now if w not in before]
                step.left = [w for w in before if w not in now]
                step.method = links[r - 1].method
                prev_row = releases[prev_r].topic_word[prev_step.topic]
                step.previous_p = [float(prev_row[j]) for j in
                                   np.argsort(-s.topic_word[t], kind="stable")[:n_words]]
        histories.append(TopicHistory(topic=i, steps=steps))
    return links, histories


def _top(row: np.ndarray, words, n: int) -> list[tuple[str, float]]:
    idx = np.argsort(-row, kind="stable")[:n]
    return [(words[j], float(row[j])) for j in idx]


@dataclass
class BudgetPoint:
    label: str
    x: float
    rho_budget: float
    rho_spent: float                          # worst case over the atoms (what a document loses)
    rho_by_atom: dict[str, float]             # warm-up, stream (worst epoch), vocabulary
    epsilon: float
    epsilon_spent: float | None
    delta: float
    epsilon_stream: float | None = None       # the stream group's ρ as ε at δ (None: not computed)


ATOM_NAMES = {"warmup": "warm-up documents", "stream_worst_epoch_rho": "stream documents (worst epoch)",
              "vocabulary": "vocabulary-selection documents"}


def budget_series(releases: list[TopicSnapshot]) -> list[BudgetPoint]:
    """The accountant's report of every private release, in release order."""
    out = []
    for r, s in enumerate(releases):
        acc = s.privacy.get("accountant") if isinstance(s.privacy, dict) else None
        if not isinstance(acc, dict) or acc.get("rho_budget") is None:
            continue
        by_atom = acc.get("rho_by_atom") or {}
        atoms = {name: float(by_atom[key]) for key, name in ATOM_NAMES.items()
                 if isinstance(by_atom.get(key), (int, float))}
        eps_spent = acc.get("epsilon_worst_case")
        out.append(BudgetPoint(label=release_label(s, r), x=_x(s, r),
                               rho_budget=float(acc["rho_budget"]),
                               rho_spent=float(acc.get("rho_worst_case", float("nan"))),
                               rho_by_atom=atoms, epsilon=float(acc.get("epsilon", s.privacy.get("epsilon"))),
                               epsilon_spent=None if eps_spent is None else float(eps_spent),
                               delta=float(acc.get("delta", s.privacy.get("delta")))))
    # the stream group's ε (OpenDP's conversion, ≈ 30 ms each): for at most MAX_CONVERSIONS
    # evenly spread releases and the last; the chart joins the gaps
    stream = ATOM_NAMES["stream_worst_epoch_rho"]
    idx = [i for i, p in enumerate(out) if stream in p.rho_by_atom]
    step = max(1, math.ceil(len(idx) / MAX_CONVERSIONS))
    for i in set(idx[::step] + idx[-1:]):
        out[i].epsilon_stream = zcdp_epsilon(out[i].rho_by_atom[stream], out[i].delta)
    return out


def noise_level(ratio: float | None) -> tuple[str, str]:
    """(words, css class) for a topic's estimated noise-to-signal ratio."""
    if ratio is None:
        return "not estimated (spectral release: the estimate comes with refinement)", "unknown"
    if not math.isfinite(ratio):
        return "noise explains all of this topic", "high"
    if ratio < NOISE_LOW:
        return f"low: noise ≈ {ratio:.0%} of the signal", "low"
    if ratio < 1.0:
        return f"moderate: noise ≈ {ratio:.0%} of the signal", "moderate"
    return f"noise-dominated: noise ≈ {ratio:.1f}× the signal", "high"
