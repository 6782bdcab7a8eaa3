"""PartitionState.add(..., refine_in_background=True): the refinement fold-in on a worker thread
while the calling thread updates the whitened sketch gives bit-identical partition states (and
checkpoints) to the sequential path, whatever the batches; errors of either side surface."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import random_basis
from streamdp.moments.clipping import ClipBounds
from streamdp.refinement import FoldInModels, RefinementModel, RefinementSketch
from streamdp.services.partition_state import PartitionState
from streamdp.whitening.subspace import Subspace

D, K = 60, 3


def _setup(rng):
    sub = Subspace(random_basis(rng, D, 2 * K))
    models = FoldInModels(lag=2)
    for e in (1, 2):
        tw = rng.dirichlet(np.full(D, 0.3), size=K)
        models.released(RefinementModel(tw, np.full(K, 0.5), f"m{e}", epoch=e))
    return sub, models


def _docs(rng, n):
    C = rng.poisson(0.15, size=(n, D)) * (rng.random((n, D)) < 0.6)
    C[:, rng.integers(0, D, 3)] += 1                 # most rows long enough
    return sp.csr_matrix(C.astype(float))


def _run(batches, sub, models, background):
    st = PartitionState("t", 0, closed_through=2)
    for X, routes in batches:
        st.add(X, routes, sub, ClipBounds.for_length(5.0), None, models=models,
               refine_in_background=background)
    return st


def test_background_refinement_is_bit_identical(rng):
    sub, models = _setup(rng)
    batches = []
    for n in (700, 1, 333, 2048, 517):           # across the chunk boundaries of both sketches
        X = _docs(rng, n)
        batches.append((X, np.sort(rng.integers(3, 5, n))))     # epochs 3 and 4 in one batch
    seq = _run(batches, sub, models, False)
    par = _run(batches, sub, models, True)
    assert seq.refine and seq.epochs and seq.counters == par.counters
    assert seq.to_bytes() == par.to_bytes()
    for e in seq.refine:
        assert seq.refine[e].n_docs > 0
        np.testing.assert_array_equal(seq.refine[e].sums, par.refine[e].sums)
        np.testing.assert_array_equal(seq.epochs[e].sums().s3, par.epochs[e].sums().s3)


def test_background_refinement_errors_surface(rng, monkeypatch):
    sub, models = _setup(rng)
    X, routes = _docs(rng, 50), np.full(50, 3)

    def broken(self, X, model, weights=None):
        raise RuntimeError("fold-in failed")
    monkeypatch.setattr(RefinementSketch, "update", broken)
    st = PartitionState("t", 0, closed_through=2)
    with pytest.raises(RuntimeError, match="fold-in failed"):
        st.add(X, routes, sub, ClipBounds.for_length(5.0), None, models=models, refine_in_background=True)
    assert st.counters["documents"] == 0
