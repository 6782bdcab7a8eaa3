"""The release service's plausibility checks on the sketchers' sums (issue 23 item 6,
streamdp.services.plausibility): honest sums of any clip pass; a partition whose sums were
scaled (a patched sketcher) is left out of the merge and named, the other partitions' sum is
exactly what it was without it."""
from __future__ import annotations

import numpy as np
import pytest

from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.refinement import RefinementModel, RefinementSketch
from streamdp.services import plausibility
from streamdp.services.partition_state import PartitionState
from streamdp.services.release_merge import (check_refine_sums, merge_epoch_sums,
                                             merge_refine_sums, merge_warmups)
from streamdp.whitening.warmup import WarmupSketch
from tests.test_release_modules import _docs, _subspace

N_MAX = 10**9


@pytest.mark.parametrize("length", [3, 5, 30, 200])
def test_honest_sums_pass_at_every_clip(length):
    rng = np.random.default_rng(length)
    d, k = 25, 4
    sub, clip = _subspace(d, k, 1), ClipBounds.for_length(length)
    for n in (0, 1, 40):
        s = WhitenedSketch(sub, clip).update(_docs(rng, n, d)).sums()
        assert plausibility.check_epoch_sums(s, clip, N_MAX, sub.Q) is None


@pytest.mark.parametrize("block", ["count", "m1", "s1", "z", "s2"])
def test_a_block_scaled_x100_is_refused(block):
    rng = np.random.default_rng(7)
    d, k = 25, 4
    sub, clip = _subspace(d, k, 1), ClipBounds.for_length(30)
    s = WhitenedSketch(sub, clip).update(_docs(rng, 40, d)).sums()
    bad = s.replace(**{block: getattr(s, block) * 100})
    why = plausibility.check_epoch_sums(bad, clip, N_MAX, sub.Q)
    assert why is not None and "block" in why
    # also caught without Q when the norm bound is broken (every block here)
    assert plausibility.check_epoch_sums(bad, clip, N_MAX) is not None


def test_s3_scaled_is_refused_when_it_breaks_the_norm_bound_and_nan_always():
    rng = np.random.default_rng(8)
    d, k = 25, 4
    sub, clip = _subspace(d, k, 1), ClipBounds.for_length(30)   # documents at the bound's length
    s = WhitenedSketch(sub, clip).update(_docs(rng, 40, d)).sums()
    assert plausibility.check_epoch_sums(s.replace(s3=s.s3 * 100), clip, N_MAX, sub.Q) is not None
    nan = s.s3.copy()
    nan.flat[0] = np.nan
    assert "s3" in plausibility.check_epoch_sums(s.replace(s3=nan), clip, N_MAX, sub.Q)
    # the documented limit: s3 has no identity to check, so a scaled s3 whose norm stays under
    # n·Δ passes (docs/privacy.md §Trust boundary: the checks are necessary, not sufficient)
    small = s.replace(s3=s.s3 * 1.5)
    assert plausibility.check_epoch_sums(small, clip, N_MAX, sub.Q) is None


def _parts(sub, clip, rng, d, scale_partition=None, block="z"):
    parts = []
    for p in range(3):
        st = PartitionState(topic="t", partition=p)
        st.epochs[5] = WhitenedSketch(sub, clip).update(_docs(rng, 20 + p, d))
        parts.append(st)
    return parts


class Scaled:
    """A sketch whose ``sums()`` scales one block (what a patched sketcher would write)."""

    def __init__(self, sk, block, factor):
        self.sk, self.block, self.factor = sk, block, factor
        self.subspace, self.clip = sk.subspace, sk.clip

    def sums(self):
        s = self.sk.sums()
        return s.replace(**{self.block: getattr(s, self.block) * self.factor})


def test_merge_leaves_an_implausible_partition_out_and_names_it():
    rng = np.random.default_rng(9)
    d, k = 25, 4
    sub, clip = _subspace(d, k, 1), ClipBounds.for_length(30)
    parts = _parts(sub, clip, rng, d)
    clean, n = merge_epoch_sums([parts[0], parts[2]], 5, sub, clip)
    parts[1].epochs[5] = Scaled(parts[1].epochs[5], "z", 100.0)
    refused = {}
    got, n_got = merge_epoch_sums(parts, 5, sub, clip, refused=refused, max_documents=N_MAX)
    assert list(refused) == [1] and "block z" in refused[1]
    assert n_got == n == 2
    for f in ("count", "m1", "z", "s1", "s2", "s3"):        # bit-identical to the clean merge
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(clean, f)))
    # without the checks (refused=None, the old behaviour) the scaled sums are merged
    unchecked, _ = merge_epoch_sums(parts, 5, sub, clip)
    assert np.linalg.norm(unchecked.z) > 10 * np.linalg.norm(clean.z)


def test_refinement_and_warmup_checks():
    rng = np.random.default_rng(10)
    d, k = 25, 3
    model = RefinementModel(rng.dirichlet(np.ones(d), size=k), rng.uniform(0.2, 1.0, size=k), "m")
    parts = []
    for p in range(2):
        st = PartitionState(topic="t", partition=p)
        st.refine[4] = RefinementSketch(k, d).update(_docs(rng, 15, d), model)
        parts.append(st)
    refused = {}
    check_refine_sums(parts, 4, N_MAX, refused)
    assert refused == {}
    honest = parts[0].refine[4].sums.copy()
    bad = parts[1].refine[4]                              # a patched fold-in: ×100
    bad._acc *= 100
    if bad.pending is not None:
        bad.pending *= 100
    check_refine_sums(parts, 4, N_MAX, refused)
    assert list(refused) == [1] and "topic_word" in refused[1]
    np.testing.assert_array_equal(merge_refine_sums(parts, 4, (k, d), skip=refused), honest)

    ws = []
    for p in range(3):
        w = WarmupSketch(d, 4, clip=0.5, seed=0).update(_docs(rng, 10, d))
        ws.append(PartitionState(topic="t", partition=p, warmup=w))
    refused = {}
    assert merge_warmups(ws, refused=refused, warmup_clip=0.5, max_documents=N_MAX).n_docs == 30
    assert refused == {}
    assert ws[0].warmup.n_docs == 10                      # the cached state is not merged into
    ws[1].warmup._flush_pending()                         # unclipped range sums: ×100
    ws[1].warmup.yacc *= 100
    ws[1].warmup.a2 *= 100
    ws[2].warmup.clip = 50.0                              # a sketch that claims its own clip
    merged = merge_warmups(ws, refused=refused, warmup_clip=0.5, max_documents=N_MAX)
    assert merged.n_docs == 10 and sorted(refused) == [1, 2]
    assert "warmup" in refused[1] and "warmup_clip" in refused[2]
