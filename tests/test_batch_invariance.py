"""Computed sums are a deterministic function of each sketch's own document sequence.

docs/privacy.md, "Floating point", "Sums that do not contain the document": the continual
proofs take the computed sums that do not contain an added document to be bit-identical in
the two neighbouring runs. That needs the rounding to be independent of how the documents were
cut into ``update`` calls (callers batch by count): chunks are counted in each sketch's own
sequence, the partial chunk waits as pending state (checkpointed), reading does not change it.
Everything here is compared with ``np.array_equal`` (bits), not allclose.
"""
import numpy as np
import pytest
import scipy.sparse as sp

from streamdp import ClipBounds, EpochClock, WhitenedSketch
from streamdp.continual import EpochSketches
from streamdp.refinement import RefinementModel, RefinementSketch
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

D, KP, K = 60, 5, 4
BLOCKS = ("count", "m1", "z", "s1", "s2", "s3")


def _documents(rng, n, d=D):
    """Varied lengths (some < 3: skipped by the sketches, still counted as rows), a few empty."""
    lengths = rng.choice([0, 1, 2, 3, 4, 8, 20, 60], size=n, p=[.02, .02, .02, .14, .2, .3, .2, .1])
    rows = [np.bincount(rng.integers(0, d, size=l), minlength=d) for l in lengths]
    return sp.csr_matrix(np.array(rows, dtype=float))


def _subspace(seed=0):
    return Subspace(np.linalg.qr(np.random.default_rng(seed).standard_normal((D, KP)))[0])


def _cuts(n, size):
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _random_cuts(rng, n):
    out, a = [], 0
    while a < n:
        b = min(n, a + int(rng.integers(1, 900)))
        out.append((a, b))
        a = b
    return out


def _feed_whitened(X, cuts, sub, clip, *, roundtrip_at=None, read_every=False):
    sk = WhitenedSketch(sub, clip)
    for i, (a, b) in enumerate(cuts):
        sk.update(X[a:b])
        if read_every and i % 5 == 0:
            sk.sums()                                     # reading must not change anything
        if roundtrip_at is not None and i == roundtrip_at:
            sk = WhitenedSketch.from_bytes(sk.to_bytes(), sub)
    return sk


def _assert_sums_equal(a, b):
    for name in BLOCKS:
        assert np.array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name))), name
    assert a.n_docs == b.n_docs


BATCHINGS = ["one", 1, 7, 1000, 4097, "random+checkpoint"]


def _batching(kind, n, rng):
    if kind == "one":
        return [(0, n)], None
    if kind == "random+checkpoint":
        cuts = _random_cuts(rng, n)
        return cuts, len(cuts) // 2
    return _cuts(n, kind), None


@pytest.fixture(scope="module")
def stream():
    rng = np.random.default_rng(11)
    return _documents(rng, 9000)          # > 2 chunks of 4096 long documents, then a partial one


@pytest.mark.parametrize("kind", BATCHINGS[1:])
def test_whitened_sums_do_not_depend_on_the_batching(stream, kind):
    """One batch vs batches of 1, 7, 1000, 4097 rows vs random batches with a checkpoint round
    trip in the middle: bit-identical sums (clipped bounds, so the clip factors are exercised)."""
    X, sub, clip = stream, _subspace(), ClipBounds.for_length(10)
    ref = _feed_whitened(X, [(0, X.shape[0])], sub, clip).sums()
    cuts, rt = _batching(kind, X.shape[0], np.random.default_rng(5))
    got = _feed_whitened(X, cuts, sub, clip, roundtrip_at=rt, read_every=(kind == 7))
    _assert_sums_equal(got.sums(), ref)
    assert got.n_docs == WhitenedSketch(sub, clip).update(X).n_docs


def test_reading_does_not_change_the_sketch(stream):
    """sums() twice, or sums() and then more documents: the same as one pass."""
    X, sub, clip = stream, _subspace(), ClipBounds.for_length(10)
    sk = WhitenedSketch(sub, clip).update(X[:5000])
    first = sk.sums()
    _assert_sums_equal(sk.sums(), first)
    sk.update(X[5000:])
    _assert_sums_equal(sk.sums(), WhitenedSketch(sub, clip).update(X).sums())
    assert sk.sums().n_docs == X.shape[0]          # the premise count includes pending rows
    # so does the clip count (diagnostics): the same as after processing every row
    assert 0 < sk.pending.n and sk.n_clipped > 0
    assert sk.n_clipped == WhitenedSketch(sub, clip).merge(sk).n_clipped
    w = WarmupSketch(D, KP, clip=0.05)
    w.update(X[:5000])
    assert 0 < w.pending.n and w.n_clipped == WarmupSketch(D, KP, clip=0.05).merge(w).n_clipped > 0


def test_old_checkpoints_without_pending_rows_still_load(stream):
    sub = _subspace()
    sk = WhitenedSketch(sub).update(stream[:4200])
    obj = sk.to_dict()
    assert obj["pending"]["n"] == sk.pending.n > 0
    del obj["pending"]                               # a state written before pending rows:
    from streamdp import serialization as ser       # schema v1 (t3 over (a, pair b ≤ c))
    from streamdp.moments import symmetric3
    k = sub.dim
    j, kk = np.triu_indices(k)
    obj = dict(obj, v=1, acc=dict(obj["acc"], t3=ser.pack_array(symmetric3.expand(sk.t3, k)[:, j, kk])),
               comp=dict(obj["comp"], t3=ser.pack_array(symmetric3.expand(sk.comp["t3"], k)[:, j, kk])))
    old = WhitenedSketch.from_dict(obj, sub)
    assert old.pending.n == 0 and old.n_docs == sk.n_docs
    w = WarmupSketch(D, KP)
    w.update(stream[:100])
    wobj = ser.loads(w.to_bytes())
    del wobj["pending"]
    wobj["v"] = 1
    assert WarmupSketch.from_bytes(ser.dumps(wobj)).pending.n == 0


def test_merge_flushes_each_side_as_its_own_final_chunk(stream):
    """Merging (partitions) depends only on the two sequences and the order, not on batching."""
    X, sub, clip = stream, _subspace(), ClipBounds.for_length(10)
    A, B = X[:5000], X[5000:]
    rng = np.random.default_rng(8)
    results = []
    for cuts_a, cuts_b in [([(0, 5000)], [(0, 4000)]), (_random_cuts(rng, 5000), _cuts(4000, 7))]:
        a = _feed_whitened(A, cuts_a, sub, clip)
        b = _feed_whitened(B, cuts_b, sub, clip)
        b_before = b.sums()
        results.append(a.merge(b).sums())
        _assert_sums_equal(b.sums(), b_before)        # the other side is not changed
    _assert_sums_equal(results[0], results[1])


@pytest.mark.parametrize("kind", [7, 4097, "random+checkpoint"])
def test_warmup_range_sum_does_not_depend_on_the_batching(stream, kind):
    X = stream
    ref = WarmupSketch(D, KP, clip=0.05)
    ref.update(X)
    cuts, rt = _batching(kind, X.shape[0], np.random.default_rng(6))
    w = WarmupSketch(D, KP, clip=0.05)
    for i, (a, b) in enumerate(cuts):
        w.update(X[a:b])
        if i == rt:
            w = WarmupSketch.from_bytes(w.to_bytes())
    assert np.array_equal(w.range_sum(), ref.range_sum())
    assert np.array_equal(w.norm_hist, ref.norm_hist) and w.n_docs == ref.n_docs


# ------------------------------------------------------------------ refinement
def _model(seed, k=K, d=D):
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(d, 0.3), size=k)
    phi[0, :5] = 0.0                                  # words topic 0 cannot emit
    phi /= phi.sum(axis=1, keepdims=True)
    return RefinementModel(phi, rng.uniform(0.2, 1.0, size=k), f"m{seed}")


def _feed_refine(X, cuts, models, *, roundtrip_at=None, read_every=False):
    """``models``: per row, the model it is folded into (cuts must not split a model run)."""
    rs = RefinementSketch(K, D)
    for i, (a, b) in enumerate(cuts):
        rs.update(X[a:b], models[a])
        if read_every:
            rs.sums
        if roundtrip_at is not None and i == roundtrip_at:
            rs = RefinementSketch.from_dict(rs.to_dict())
    return rs


def _split_at(cuts, points):
    """Cut every batch also at the given row positions (model changes)."""
    out = []
    for a, b in cuts:
        inner = [p for p in points if a < p < b]
        edges = [a] + inner + [b]
        out += list(zip(edges[:-1], edges[1:]))
    return out


@pytest.mark.parametrize("kind", BATCHINGS[1:])
def test_refinement_sums_do_not_depend_on_the_batching(kind):
    """Same documents, same model per document (the model changes twice, mid-chunk): bit-
    identical sums and sums_lo for every batching, with or without a checkpoint."""
    rng = np.random.default_rng(12)
    n = 1700                                  # > 3 chunks of 512, then a partial one
    X = _documents(rng, n)
    m1, m2 = _model(1), _model(2)
    change = [700, 1300]
    models = [m1] * 700 + [m2] * 600 + [m1] * 400
    ref = _feed_refine(X, _split_at([(0, n)], change), models)
    cuts, rt = _batching(kind, n, np.random.default_rng(7))
    got = _feed_refine(X, _split_at(cuts, change), models, roundtrip_at=rt,
                       read_every=(kind == 7))
    assert np.array_equal(got.sums, ref.sums) and np.array_equal(got.sums_lo, ref.sums_lo)
    assert got.n_docs == ref.n_docs == int((np.diff(X.indptr) > 0).sum())


def test_refinement_merge_and_reading_are_deterministic():
    rng = np.random.default_rng(13)
    X = _documents(rng, 1400)
    m = _model(3)
    models = [m] * 1400
    outs = []
    for cuts_a, cuts_b in [([(0, 800)], [(0, 600)]), (_cuts(800, 7), _random_cuts(rng, 600))]:
        a = _feed_refine(X[:800], cuts_a, models)
        b = _feed_refine(X[800:], cuts_b, models)
        before = b.sums.copy()
        outs.append(a.merge(b))
        assert np.array_equal(b.sums, before)
    assert np.array_equal(outs[0].sums, outs[1].sums)
    assert np.array_equal(outs[0].sums_lo, outs[1].sums_lo)
    # an old checkpoint (no pending chunk) still loads
    obj = RefinementSketch(K, D).update(X[:10], m).to_dict()
    obj.pop("pending")
    assert RefinementSketch.from_dict(obj).pending_rows == 0


# ------------------------------------------------------------------ neighbouring epochs
def _epoch_run(X, ts, batch, sub, clip, model, n_epochs):
    """Every document arrives before any epoch closes: epochs 3, 4 wait for the models of
    snapshots 1, 2 (lag 2; here both ``model``), handed over as each epoch closes."""
    es = EpochSketches(sub, clip, EpochClock(0.0, 10.0), n_topics=K, model_lag=2)
    for a in range(0, X.shape[0], batch):          # count-based batches, like the sketcher's poll
        es.add(X[a:a + batch], ts[a:a + batch])
    out = {}
    for e in range(1, n_epochs + 1):
        out.update(es.pop_through(e))
        es.model_released(RefinementModel(model.topic_word, model.alpha, f"m{e}", epoch=e))
    return out


@pytest.mark.parametrize("where", ["first", "middle", "last", "chunk-edge"])
def test_one_added_document_leaves_every_other_epoch_bit_identical(where):
    """D vs D + x (x in epoch 3, inserted anywhere in the arrival order) with batches of a fixed
    count: x shifts the batch boundaries of every later document, yet every other epoch's
    spectral and refinement sums are bit-identical; epoch 3 differs (epochs 1, 2 have no
    refinement sums: lag 2)."""
    rng = np.random.default_rng(21)
    n, n_epochs = 12_000, 4
    X = _documents(rng, n)
    ts = rng.uniform(0.0, 10.0 * n_epochs, size=n)           # interleaved epochs 1..4
    sub, clip, model = _subspace(1), ClipBounds.for_length(10), _model(4)
    x = sp.csr_matrix(np.bincount(rng.integers(0, D, size=12), minlength=D).astype(float)[None, :])
    pos = {"first": 0, "middle": n // 2, "last": n,
           "chunk-edge": int(np.flatnonzero(EpochClock(0.0, 10.0).epochs(ts) == 1)[1500])}[where]
    Xp = sp.vstack([X[:pos], x, X[pos:]]).tocsr()
    tsp = np.concatenate([ts[:pos], [25.0], ts[pos:]])       # epoch 3
    for batch in (1000, 333):
        base = _epoch_run(X, ts, batch, sub, clip, model, n_epochs)
        neigh = _epoch_run(Xp, tsp, batch, sub, clip, model, n_epochs)
        for e in range(1, n_epochs + 1):
            same = all(np.array_equal(np.asarray(getattr(base[e].sketch, b)),
                                      np.asarray(getattr(neigh[e].sketch, b))) for b in BLOCKS)
            same_r = np.array_equal(base[e].refine, neigh[e].refine)
            if e <= 2:
                assert base[e].refine is None and neigh[e].refine is None   # no model (lag 2)
            if e == 3:
                assert not same and not same_r
            else:
                assert same and same_r, (e, batch)
                assert base[e].sketch.n_docs == neigh[e].sketch.n_docs
                assert np.array_equal(base[e].refine_lo, neigh[e].refine_lo)
