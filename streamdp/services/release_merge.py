"""Merging the sketchers' partition states into what one release noises (pure, no Kafka).

Each documents partition's :class:`~streamdp.services.partition_state.PartitionState` holds
that partition's exact sums per open epoch (sketch sums, refinement sums), its warm-up sketch
and its vocabulary-selection histogram. A release merges them over partitions here; the release
service then noises the merged sums (:mod:`streamdp.services.release`).

Merges add compensated sums (:mod:`streamdp.privacy.rounding`), which is not associative: the
partitions are merged in partition order (the order :meth:`PartitionView.load` returns them
in), so every merged sum is a deterministic function of the partitions' own sequences.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import SketchSums
from streamdp.refinement import RefinementSketch
from streamdp.services import plausibility
from streamdp.services.partition_state import PartitionState
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch


class SketchMismatch(ValueError):
    """Partition sketches to be merged disagree on subspace or clip bounds."""


def merge_epoch_sums(parts: list[PartitionState], epoch: int, subspace: Subspace,
                     clip: ClipBounds, *, refused: dict[int, str] | None = None,
                     max_documents: int | None = None) -> tuple[SketchSums | None, int]:
    """Σ over partitions of epoch ``epoch``'s sketch sums, and how many partitions had one.

    Every sketch must be built on ``subspace`` with exactly ``clip`` (the bounds the
    noise is calibrated to): a sketch clipped with larger bounds has a larger
    sensitivity than the noise covers. Raises :class:`SketchMismatch` naming the partition.

    ``refused`` (the release service passes one): partitions already in it are left out, and
    a partition whose sums fail :func:`~streamdp.services.plausibility.check_epoch_sums`
    (premise ``max_documents``) is left out and added to it with the reason.
    """
    total, n = None, 0
    for st in parts:
        sk = st.epochs.get(epoch)
        if sk is None or (refused is not None and st.partition in refused):
            continue
        if sk.subspace.id != subspace.id:
            raise SketchMismatch(
                f"partition {st.partition} epoch {epoch}: sketch built on subspace {sk.subspace.id}, "
                f"the deployment's is {subspace.id}; refusing to merge")
        if sk.clip != clip:
            raise SketchMismatch(
                f"partition {st.partition} epoch {epoch}: sketch clipped with {sk.clip.to_dict()}, "
                f"the release is calibrated to {clip.to_dict()}; refusing to merge (its "
                "sensitivity is not the one the noise covers)")
        s = sk.sums()
        if refused is not None:
            why = plausibility.check_epoch_sums(s, clip, max_documents, subspace.Q)
            if why is not None:
                refused[st.partition] = why
                continue
        total = s if total is None else total + s
        n += 1
    return total, n


def check_refine_sums(parts: list[PartitionState], epoch: int, max_documents: int,
                      refused: dict[int, str]) -> None:
    """Add to ``refused`` each partition whose refinement sums of ``epoch`` are implausible
    (:func:`~streamdp.services.plausibility.check_refine_sums`)."""
    for st in parts:
        rs = st.refine.get(epoch)
        if rs is not None and st.partition not in refused:
            why = plausibility.check_refine_sums(rs.sums, rs.n_docs, max_documents)
            if why is not None:
                refused[st.partition] = why


def merge_refine_sums(parts: list[PartitionState], epoch: int, shape: tuple[int, int], *,
                      skip=()) -> np.ndarray | None:
    """Σ over partitions of epoch ``epoch``'s refinement sums (k × d), or None if no
    partition folded a document of that epoch into a model; partitions in ``skip`` are left out."""
    total = None
    for st in parts:
        rs = st.refine.get(epoch)
        if rs is None or st.partition in skip:
            continue
        if rs.shape != tuple(shape):
            raise SketchMismatch(f"partition {st.partition} epoch {epoch}: refinement sums of shape "
                                 f"{rs.shape}, the deployment's model is {tuple(shape)}; "
                                 "refusing to merge")
        if total is None:
            total = RefinementSketch(*rs.shape)
        total.merge(rs)                       # compensated (streamdp.privacy.rounding)
    return None if total is None else total.sums


def merge_warmups(parts: Iterable[PartitionState], *, refused: dict[int, str] | None = None,
                  warmup_clip: float | None = None,
                  max_documents: int | None = None) -> WarmupSketch | None:
    """The partitions' warm-up sketches merged, or None if no partition has a document in it
    (a warm-up sketch of zero documents counts as none).

    ``refused`` (the release service passes one, with the deployment's ``warmup_clip``): a
    partition whose warm-up fails :func:`~streamdp.services.plausibility.check_warmup` is left
    out and added to it with the reason."""
    sketches = []
    for p in parts:
        if p.warmup is None:
            continue
        if refused is not None:
            why = plausibility.check_warmup(p.warmup, warmup_clip, max_documents)
            if why is not None:
                refused[p.partition] = why
                continue
        sketches.append(p.warmup)
    if not sketches or sum(s.n_docs for s in sketches) == 0:
        return None
    merged = sketches[0].copy()          # merge() adds in place; the decoded states are cached
    for s in sketches[1:]:
        merged = merged.merge(s)
    return merged


def load_states(states: dict, subspace: Subspace | None) -> list[PartitionState]:
    """Decode partition → state record into states, in partition order (the merge order)."""
    return [PartitionState.from_bytes(states[p].payload, subspace) for p in sorted(states)]
