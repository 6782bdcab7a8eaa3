"""The noise of a continual release: :class:`SketchNodeMechanism` noises one tree node or one BLT
step (an :class:`~streamdp.epoch_sums.EpochSums`) with the per-block Gaussian plan."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamdp.epoch_sums import EpochSums, zero_sums
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import SketchSums
from streamdp.privacy.events import GaussianEvent
from streamdp.privacy.noise import GaussianSampler
from streamdp.privacy.plan import BudgetSplit, plan_release
from streamdp.privacy.rounding import (DEFAULT_MAX_DOCUMENTS_PER_SUM, per_document_magnitude,
                                       require_within_premise, rounding_bound)
from streamdp.privacy.sensitivity import BLOCK_CLIP
from streamdp.refinement import BLOCK as REFINE_BLOCK
from streamdp.refinement import plan_refinement
from streamdp.release import noise_sums
from streamdp.whitening.subspace import Subspace


class SketchNodeMechanism:
    """Noises one tree node (an :class:`EpochSums`) with the per-block Gaussian plan.

    Spectral blocks get ρ_node·(1 − r)·share at sensitivity = their clip bound (s1/s2
    derived from the noised m1/z when those are bought, as in a one-shot release); with
    refinement (share r) the k × d refinement sums get ρ_node·r at sensitivity 1.
    """

    def __init__(self, subspace: Subspace, clip: ClipBounds, split: BudgetSplit, rho_node: float,
                 sampler: GaussianSampler, refine_share: float | None = None, *,
                 max_documents: int = DEFAULT_MAX_DOCUMENTS_PER_SUM) -> None:
        self.subspace, self.clip, self.split = subspace, clip, split
        self.rho_node, self.sampler = float(rho_node), sampler
        self.refine_share = refine_share
        self.max_documents = max_documents
        # True once a noised, charged premise check decides each epoch (ContinualRelease): then
        # no exact document count may refuse a draw (docs/privacy.md "The premise check")
        self.premise_checked = False

    def plan(self, partition: str) -> list[GaussianEvent]:
        r = self.refine_share or 0.0
        events = plan_release(self.rho_node * (1 - r), self.clip, self.split, "tensor",
                              partition=partition, max_documents=self.max_documents)
        if self.refine_share:
            events.append(plan_refinement(self.rho_node * r, partition=partition,
                                          max_documents=self.max_documents))
        return events

    def privatize(self, value: EpochSums | SketchSums, events) -> EpochSums:
        if isinstance(value, SketchSums):
            value = EpochSums(value)
        events = list(events)
        spectral = [e for e in events if e.block != REFINE_BLOCK]
        # refuses (before any draw) a node of more than max_documents documents; the sketch's
        # n_docs counts every row of the node, so it covers the refinement sums too
        noised = noise_sums(value.sketch, spectral, self.sampler, self.subspace.Q,
                            max_documents=None if self.premise_checked else self.max_documents)
        refine = None
        if self.refine_share:
            e = next(e for e in events if e.block == REFINE_BLOCK)
            refine = self.sampler.add_noise(value.refine, e.sigma)
        return EpochSums(noised, refine)

    # ---- the BLT's noise interface (streamdp/privacy/blt.py: NoiseMechanism)
    def _raw_blocks(self, value: EpochSums | SketchSums, events) -> dict[str, np.ndarray]:
        if isinstance(value, SketchSums):
            value = EpochSums(value)
        return {e.block: (np.asarray(value.refine, dtype=np.float64) if e.block == REFINE_BLOCK
                          else np.atleast_1d(np.asarray(getattr(value.sketch, e.block),
                                                        dtype=np.float64)))
                for e in events}

    def layout(self, value: EpochSums | SketchSums, events) -> list:
        """Public (block, shape) of the noised blocks, in event order."""
        return [(b, list(v.shape)) for b, v in self._raw_blocks(value, events).items()]

    def flatten(self, value: EpochSums | SketchSums, events) -> np.ndarray:
        """The raw noised blocks (those with an event) as one flat vector: SECRET."""
        return np.concatenate([v.ravel() for v in self._raw_blocks(value, events).values()])

    def noise(self, value: EpochSums | SketchSums, flat: np.ndarray, events) -> np.ndarray:
        """Each block of ``flat`` (the BLT's (Cx)_t, secret data) through the sampler with its
        σ_b, after refusing (before any draw) an epoch of more than max_documents documents."""
        sk = value.sketch if isinstance(value, EpochSums) else value
        if not self.premise_checked:
            require_within_premise(sk.n_docs, self.max_documents, "continual epoch")
        raw = self._raw_blocks(value, events)
        where, at = {}, 0
        for b, v in raw.items():
            where[b] = (at, v.shape)
            at += v.size
        if at != flat.size:
            raise ValueError(f"flat value of size {flat.size}, the plan needs {at}")
        out = np.empty_like(flat)
        # draw in noise_sums' block order (then refinement), as a one-shot release does
        for e in sorted(events, key=lambda e: _DRAW_ORDER.index(e.block)):
            a, shape = where[e.block]
            size = int(np.prod(shape))
            out[a:a + size] = np.asarray(self.sampler.add_noise(flat[a:a + size].reshape(shape),
                                                                e.sigma), dtype=np.float64).ravel()
        return out

    def assemble(self, flat: np.ndarray, layout: list, events) -> EpochSums:
        """The released EpochSums from the flat noised blocks (post-processing): blocks without
        an event are derived (s1 = Qᵀm1, s2 = Qᵀz from the noised m1/z) or withheld (zero),
        s2 and s3 symmetrised — exactly as :func:`~streamdp.release.noise_sums` treats them."""
        blocks, at = {}, 0
        for b, shape in layout:
            size = int(np.prod(shape))
            blocks[b] = np.asarray(flat[at:at + size], dtype=np.float64).reshape(shape)
            at += size
        spectral = [e for e in events if e.block != REFINE_BLOCK]
        base = zero_sums(self.subspace)
        sk = base.replace(**{b: (float(v[0]) if b == "count" else v)
                             for b, v in blocks.items() if b != REFINE_BLOCK})
        # noise_sums with no draws for the given blocks: reuse its derived/withheld rules
        out = noise_sums(sk, [_Given(e.block) for e in spectral], _NO_DRAW, self.subspace.Q,
                         max_documents=10 ** 12)
        return EpochSums(out, blocks.get(REFINE_BLOCK))

    def magnitudes(self, events) -> list[float]:
        """X_b = N_max·M_b + R_b ≥ ‖computed epoch sum of block b‖_F (rounding.py)."""
        out = []
        for e in events:
            c = BLOCK_CLIP[e.block](self.clip)
            out.append(self.max_documents * per_document_magnitude(e.block, c)
                       + rounding_bound(e.block, c, self.max_documents))
        return out


_DRAW_ORDER = ("count", "m1", "z", "s1", "s2", "s3", REFINE_BLOCK)


@dataclass(frozen=True)
class _Given:
    """An 'event' for :func:`noise_sums` on already noised values (block name only)."""

    block: str
    sigma: float = 0.0


class _NoDraw:
    """A sampler that adds nothing: the values handed to it are already noised outputs."""

    def add_noise(self, value, sigma):
        return np.asarray(value, dtype=np.float64)


_NO_DRAW = _NoDraw()
