"""Continual release of topics over timestamp epochs with the binary tree mechanism.

Each closed epoch's sketch sums are a leaf of a :class:`~streamdp.privacy.tree.TreeAggregator`;
a dyadic node of epochs is noised once, when complete, with the per-block Gaussian
plan of :func:`~streamdp.release.plan_release` at ρ_node = ρ_stream / depth; the
release at epoch t decomposes the sum of the ≤ ⌊log2 t⌋ + 1 noised nodes covering
[1, t] — post-processing, so it costs nothing beyond the nodes. A document (one
epoch) is in at most depth = ⌊log2 T⌋ + 1 nodes and costs depth·ρ_node = ρ_stream
over all T releases together (docs/privacy.md §Continual release).

Raw state: an epoch's raw sums live until the epoch is closed; afterwards only
the raw partial sums of *incomplete* higher nodes (≤ depth − 1 of them) and the
noised nodes are kept. Those partials are sensitive: checkpoints of this object
must be protected like raw data.
"""
from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np

from streamdp.documents import as_count_batch
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import SketchSums, WhitenedSketch
from streamdp.privacy.epochs import WARMUP_EPOCH, EpochClock
from streamdp.privacy.events import STREAM, BudgetSpender, GaussianEvent
from streamdp.privacy.noise import GaussianSampler
from streamdp.privacy.tree import TreeAggregator, covering_levels, tree_depth
from streamdp.release import (BudgetSplit, DenoiseConfig, decompose_sums, noise_scales,
                              noise_sums, plan_release)
from streamdp.snapshot import TopicSnapshot
from streamdp.tensor.power_method import PowerMethodConfig
from streamdp.whitening.subspace import Subspace


def zero_sums(subspace: Subspace) -> SketchSums:
    """The sums of an empty epoch (still closed and noised like any other)."""
    d, kp = subspace.d, subspace.dim
    return SketchSums(0.0, np.zeros(d), np.zeros((d, kp)), np.zeros(kp), np.zeros((kp, kp)),
                      np.zeros((kp, kp, kp)))


class SketchNodeMechanism:
    """Noises one tree node (a :class:`SketchSums`) with the per-block Gaussian plan.

    Every block gets ρ_node·share at sensitivity = its clip bound; s1/s2 are
    derived from the noised m1/z (post-processing), as in a one-shot release.
    """

    def __init__(self, subspace: Subspace, clip: ClipBounds, split: BudgetSplit, rho_node: float,
                 sampler: GaussianSampler) -> None:
        self.subspace, self.clip, self.split = subspace, clip, split
        self.rho_node, self.sampler = float(rho_node), sampler

    def plan(self, partition: str) -> list[GaussianEvent]:
        return plan_release(self.rho_node, self.clip, self.split, "tensor", partition=partition)

    def privatize(self, value: SketchSums, events) -> SketchSums:
        return noise_sums(value, list(events), self.sampler, self.subspace.Q)


class ContinualRelease:
    """Topic snapshots at every epoch close, under one ρ budget for the whole horizon.

    Parameters
    ----------
    subspace : Subspace         the public whitening basis Q (d × k')
    clip : ClipBounds           stream clip bounds (sensitivities)
    n_topics, alpha0            as in the estimator
    rho : float or None         ρ for all stream epochs together; None = exact
                                (non-private) cumulative sums
    horizon : int               T, the most epochs this tree may close
    split, sampler, spender, power, denoise
                                as in :func:`streamdp.release.release_topics`

    Attributes
    ----------
    epoch : int                 epochs closed so far
    depth : int                 ⌊log2 T⌋ + 1
    rho_node : float            ρ of one node = rho / depth
    """

    def __init__(self, subspace: Subspace, clip: ClipBounds, *, n_topics: int, alpha0: float,
                 rho: float | None, horizon: int, split: BudgetSplit = BudgetSplit(),
                 sampler: GaussianSampler | None = None, spender: BudgetSpender | None = None,
                 power: PowerMethodConfig = PowerMethodConfig(),
                 denoise: DenoiseConfig = DenoiseConfig(), label: str = "tree") -> None:
        self.subspace, self.clip = subspace, clip
        self.n_topics, self.alpha0 = int(n_topics), float(alpha0)
        self.horizon, self.depth = int(horizon), tree_depth(horizon)
        self.split, self.power, self.denoise = split, power, denoise
        self.rho = rho
        self.sampler = sampler
        if rho is not None:
            if not (rho > 0 and math.isfinite(rho)):
                raise ValueError(f"rho must be a finite number > 0 or None, got {rho!r}")
            if sampler is None:
                raise ValueError("a private continual release needs a noise sampler")
            self.rho_node = rho / self.depth
            self.mechanism = SketchNodeMechanism(subspace, clip, split, self.rho_node, sampler)
            self.tree: TreeAggregator | None = TreeAggregator(horizon, self.mechanism, spender,
                                                              label=label)
        else:
            self.rho_node, self.mechanism, self.tree = None, None, None
            self._exact: SketchSums | None = None
            self._exact_epoch = 0

    @property
    def epoch(self) -> int:
        return self.tree.epoch if self.tree is not None else self._exact_epoch

    def close_epoch(self, sums: SketchSums | None) -> TopicSnapshot:
        """Close the next epoch with its raw sums (None = no documents) and release.

        Raises HorizonExceeded past the horizon and BudgetExhausted if the
        accountant refuses the epoch's nodes; in both cases nothing changes.
        """
        if sums is None:
            sums = zero_sums(self.subspace)
        if self.tree is None:
            if self._exact_epoch >= self.horizon:
                from streamdp.privacy.tree import HorizonExceeded
                raise HorizonExceeded(f"epoch {self._exact_epoch + 1} is past the horizon "
                                      f"T={self.horizon}")
            self._exact = sums if self._exact is None else self._exact + sums
            self._exact_epoch += 1
            released = noise_sums(self._exact, [], None, self.subspace.Q)
            sd = None
        else:
            released = self.tree.add_epoch(sums)
            nodes = len(covering_levels(self.tree.epoch))
            sd = noise_scales(self.mechanism.plan(STREAM), math.sqrt(nodes))
        return self._snapshot(released, sd)

    def _snapshot(self, released: SketchSums, sd: dict | None) -> TopicSnapshot:
        t = self.epoch
        topic_word, alpha, lambdas = decompose_sums(
            released, self.subspace, n_topics=self.n_topics, alpha0=self.alpha0, noise_sd=sd,
            power=self.power, denoise=self.denoise)
        private = self.tree is not None
        node_events = self.tree.node_events(1, 1) if private else []
        privacy = {
            "unit": "one document",
            "neighbouring": "add/remove one document",
            "mechanism": "tree" if private else "none",
            "epochs_covered": [1, t],
            "horizon": self.horizon,
            "tree_depth": self.depth,
            "nodes_summed": ([list(r) for r in self.tree.covering_nodes(t)] if private else []),
            "rho_node": self.rho_node,
            "rho_per_document": (self.depth * self.rho_node) if private else 0.0,
            "node_events": [e.to_dict() for e in node_events],
            "noise_sd": sd or {},
            "clip_bounds": self.clip.to_dict(),
            "budget_split": self.split.as_dict() if private else None,
            "sampler": getattr(self.sampler, "name", None) if private else None,
            "power_method": asdict(self.power),
            "denoise_threshold": self.denoise.threshold if private else 0.0,
        }
        return TopicSnapshot(topic_word=topic_word, alpha=alpha, eigenvalues=lambdas,
                             n_docs=float(released.count), privacy=privacy,
                             mechanism="tree" if private else "none",
                             subspace_id=self.subspace.id, epoch=t)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """msgpack-friendly state. Contains raw partial sums: protect like raw data."""
        if self.tree is None:
            return {"kind": "continual_exact", "v": 1, "epoch": self._exact_epoch,
                    "sums": None if self._exact is None else self._exact.to_dict()}
        return self.tree.state_dict(lambda s: s.to_dict())

    def load_state(self, state: dict) -> "ContinualRelease":
        if self.tree is None:
            if state.get("kind") != "continual_exact":
                raise ValueError("state is not from a non-private continual release")
            self._exact_epoch = int(state["epoch"])
            self._exact = None if state["sums"] is None else SketchSums.from_dict(state["sums"])
            return self
        if int(state.get("horizon", -1)) != self.horizon:
            raise ValueError(f"tree state has horizon {state.get('horizon')}, configured "
                             f"{self.horizon}: the accounting of a tree cannot change mid-way")
        self.tree = TreeAggregator.from_state(state, SketchSums.from_dict, self.mechanism,
                                              self.tree.spender)
        return self


class EpochSketches:
    """Open per-epoch sketches: stream documents routed by their own timestamp.

    Documents whose epoch is already closed are *late*: dropped and counted in
    ``late_documents`` (moving them to another epoch would change their atom).
    Warm-up-timestamped documents arriving here are late too.
    """

    def __init__(self, subspace: Subspace, clip: ClipBounds, clock: EpochClock) -> None:
        self.subspace, self.clip, self.clock = subspace, clip, clock
        self.open: dict[int, WhitenedSketch] = {}
        self.closed_through = 0
        self.late_documents = 0

    def add(self, X, timestamps) -> "EpochSketches":
        X = as_count_batch(X, self.subspace.d)
        ts = np.asarray(timestamps, dtype=np.float64).ravel()
        if ts.shape[0] != X.shape[0]:
            raise ValueError(f"{X.shape[0]} documents but {ts.shape[0]} timestamps")
        epochs = self.clock.epochs(ts)
        for e in np.unique(epochs):
            rows = np.flatnonzero(epochs == e)
            if e == WARMUP_EPOCH or e <= self.closed_through:
                self.late_documents += rows.size
                continue
            sk = self.open.get(int(e))
            if sk is None:
                sk = self.open[int(e)] = WhitenedSketch(self.subspace, self.clip)
            sk.update(X[rows])
        return self

    def pop_through(self, epoch: int) -> list[tuple[int, SketchSums | None]]:
        """Close epochs closed_through+1 … epoch in order; empty ones give None."""
        out = []
        for e in range(self.closed_through + 1, int(epoch) + 1):
            sk = self.open.pop(e, None)
            out.append((e, None if sk is None else sk.sums()))
        self.closed_through = max(self.closed_through, int(epoch))
        return out
