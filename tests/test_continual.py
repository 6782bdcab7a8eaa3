"""Continual release: timestamp epochs, the tree over sketch sums, accounting per document."""
import math

import numpy as np
import pytest

from streamdp import ClipBounds, EpochClock, StreamingSpectralLDA, WhitenedSketch
from streamdp.privacy.plan import PREMISE_SHARE
from streamdp.continual import ContinualRelease, EpochSketches, SketchNodeMechanism, zero_sums
from streamdp.privacy.accountant import Accountant, BudgetExhausted, LoadTally
from streamdp.refinement import topic_order
from streamdp.privacy.events import parse_partition
from streamdp.privacy.conversions import zcdp_rho
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.privacy.tree import HorizonExceeded
from streamdp.privacy.plan import BudgetSplit
from streamdp.release import decompose_sums, noise_sums
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.whitening.subspace import Subspace

from conftest import random_basis


@pytest.fixture(scope="module")
def corpus():
    model = make_lda_model(80, 3, alpha0=1.0, beta=0.1, seed=11)
    X = sample_documents(model, 6_000, mean_length=30, seed=12)
    return model, X


def _subspace(d, k, seed=0):
    return Subspace(random_basis(np.random.default_rng(seed), d, k))


# ------------------------------------------------------------------ epoch clock
def test_epoch_clock_cuts_by_timestamp_only():
    clock = EpochClock(stream_start=1000.0, epoch_seconds=60.0)
    ts = [0.0, 999.999, 1000.0, 1059.999, 1060.0, 1000.0 + 60 * 9 + 1]
    assert clock.epochs(ts).tolist() == [0, 0, 1, 1, 2, 10]
    assert clock.epoch_end(2) == 1120.0
    assert clock.closable_through(1119.9) == 1 and clock.closable_through(1120.0) == 2
    assert clock.closable_through(10.0) == 0
    with pytest.raises(ValueError, match="finite"):
        clock.epochs([float("nan")])
    with pytest.raises(ValueError, match="epoch_seconds"):
        EpochClock(0.0, 0.0)


def test_epoch_sketches_route_by_timestamp_and_drop_late_documents(rng, corpus):
    _, X = corpus
    sub = _subspace(X.shape[1], 6)
    clip = ClipBounds.unclipped()
    clock = EpochClock(0.0, 10.0)
    ts = rng.uniform(0.0, 30.0, size=600)        # epochs 1..3
    es = EpochSketches(sub, clip, clock)
    es.add(X[:600], ts)
    closed = es.pop_through(2)
    assert [e for e, _ in closed] == [1, 2]
    for e, sums in closed:
        rows = np.flatnonzero(clock.epochs(ts) == e)
        ref = WhitenedSketch(sub, clip).update(X[rows]).sums()
        np.testing.assert_allclose(sums.sketch.z, ref.z, rtol=1e-12, atol=1e-15)
        assert sums.sketch.count == ref.count
    # documents of closed epochs (and warm-up timestamps) are late: dropped, counted
    es.add(X[600:610], np.array([5.0] * 4 + [-1.0] * 2 + [25.0] * 4))
    assert es.late_documents == 6
    closed = es.pop_through(5)                   # epochs 4 and 5 saw nothing
    assert [e for e, _ in closed] == [3, 4, 5] and closed[1][1] is None and closed[2][1] is None
    ref3 = WhitenedSketch(sub, clip).update(X[np.r_[np.flatnonzero(clock.epochs(ts) == 3),
                                                    606, 607, 608, 609]]).sums()
    np.testing.assert_allclose(closed[0][1].sketch.s3, ref3.s3, rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------ the tree on sketches
def _epoch_sums(X, sub, clip, n_epochs):
    parts = np.array_split(np.arange(X.shape[0]), n_epochs)
    return [WhitenedSketch(sub, clip).update(X[p]).sums() for p in parts]


def test_non_private_continual_release_equals_one_shot_on_the_prefix(corpus):
    model, X = corpus
    sub = _subspace(X.shape[1], 6)
    clip = ClipBounds.unclipped()
    sums = _epoch_sums(X, sub, clip, 5)
    cr = ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=None, horizon=8)
    for t, s in enumerate(sums, start=1):
        snap = cr.close_epoch(s)
        total = sums[0]
        for x in sums[1:t]:
            total = total + x
        ref, _, _ = decompose_sums(noise_sums(total, [], None, sub.Q), sub, n_topics=3,
                                   alpha0=1.0, noise_sd=None)
        # the same topics, numbered as the snapshot published before (topic identity rule)
        np.testing.assert_allclose(snap.topic_word, ref[topic_order(ref, snap.topic_word)],
                                   atol=1e-12)
        assert snap.epoch == t and snap.privacy["epochs_covered"] == [1, t]
        assert snap.privacy["rho_per_document"] == 0.0


def test_tree_release_is_the_exact_prefix_plus_node_noise(corpus):
    """Released sums = exact prefix + one draw per covering node, with the planned σ."""
    _, X = corpus
    sub = _subspace(X.shape[1], 5)
    clip = ClipBounds(m1=0.2, z=0.05, s3=0.02, warmup=1e-6)
    sums = _epoch_sums(X, sub, clip, 7)
    cr = ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=0.5, horizon=7,
                          sampler=CSPRNGGaussianSampler(5), aggregator="tree")
    sigma_z = {e.block: e.sigma for e in cr.mechanism.plan("stream")}["z"]
    for t, s in enumerate(sums, start=1):
        cr.close_epoch(s)
        released = cr.tree.prefix()
        exact = sums[0]
        for x in sums[1:t]:
            exact = exact + x
        nodes = bin(t).count("1")
        resid = (released.sketch.z - exact.z).ravel()
        # noise on z: nodes independent N(0, σ²) draws per entry (d·k' = 400 entries)
        ratio = resid.var() / (nodes * sigma_z**2)
        assert 0.75 < ratio < 1.3, (t, ratio)
        assert abs(resid.mean()) < 4 * math.sqrt(nodes / resid.size) * sigma_z


def test_every_document_costs_depth_times_rho_node_and_the_horizon_is_enforced(corpus):
    _, X = corpus
    sub = _subspace(X.shape[1], 5)
    clip = ClipBounds(m1=0.2, z=0.05, s3=0.02, warmup=1e-6)
    eps, delta, T = 1.0, 1e-6, 6
    acct = Accountant(eps, delta, MemoryLedger())
    rho = acct.rho_budget
    seen = []

    class Recording:
        def reserve(self, events, *, label=""):
            seen.extend(events)
            return acct.reserve(events, label=label)

        def commit(self, token):
            acct.commit(token)

    cr = ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=rho, horizon=T,
                          sampler=CSPRNGGaussianSampler(1), spender=Recording(), aggregator="tree")
    # the premise checks' share is carved out first (plan.premise_split); a document enters
    # ≤ depth checks, each at share·ρ/depth
    assert math.isclose(cr.release_rho, rho * (1 - PREMISE_SHARE))
    assert cr.depth == 3 and math.isclose(cr.rho_node, cr.release_rho / 3)
    assert math.isclose(cr.premise.rho, rho * PREMISE_SHARE / 3)
    sums = _epoch_sums(X, sub, clip, T)
    for t, s in enumerate(sums, start=1):
        snap = cr.close_epoch(s)
        assert snap.privacy["horizon"] == T and snap.privacy["tree_depth"] == 3
        assert snap.privacy["nodes_summed"] == [list(r) for r in cr.tree.covering_nodes(t)]
        assert math.isclose(snap.privacy["noise_sd"]["z"],
                            math.sqrt(bin(t).count("1")) *
                            {e.block: e.sigma for e in cr.mechanism.plan("stream")}["z"])
    rep = acct.report()
    # epochs 1..4 are in 3 noised nodes (leaf, pair, quad); 5, 6 in 2 (T = 6 < 8)
    assert math.isclose(rep["rho_worst_case"], rho, rel_tol=1e-9)
    assert rep["epsilon_worst_case"] <= eps * (1 + 1e-9)
    tally = LoadTally()
    for e in seen:
        tally.add(parse_partition(e.partition), e.rho)
    per_epoch = [tally.atom(epoch=e) for e in range(1, T + 1)]
    # premise checks count the largest completing node: epoch 1 is in those of t = 1, 2, 4,
    # epoch 2 in t = 2, 4, epoch 3 in t = 3, 4, epoch 4 in t = 4, epoch 5 in t = 5, 6, epoch 6 in 6
    checks = [3, 2, 2, 1, 2, 1]
    nodes = [3] * 4 + [2] * 2
    np.testing.assert_allclose(per_epoch, [n * cr.rho_node + c * cr.premise.rho
                                           for n, c in zip(nodes, checks)], rtol=1e-9)
    assert per_epoch[0] == pytest.approx(rho, rel=1e-9)
    with pytest.raises(HorizonExceeded):
        cr.close_epoch(sums[0])
    assert cr.epoch == T and acct.report()["reservations"] == rep["reservations"]


def test_a_refused_epoch_changes_nothing(corpus):
    _, X = corpus
    sub = _subspace(X.shape[1], 5)
    clip = ClipBounds(m1=0.2, z=0.05, s3=0.02, warmup=1e-6)
    acct = Accountant(1.0, 1e-6, MemoryLedger())
    # a tree planned for 1.5× the budget: ρ_node = 0.75 budget, so the pair node is refused
    cr = ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=1.5 * acct.rho_budget,
                          horizon=2, sampler=CSPRNGGaussianSampler(1), spender=acct, aggregator="tree")
    s1, s2 = _epoch_sums(X, sub, clip, 2)
    cr.close_epoch(s1)
    before = acct.report()
    with pytest.raises(BudgetExhausted):
        cr.close_epoch(s2)
    # nothing changes but epoch 2's premise check, drawn (and charged) before the nodes were
    # refused; it is kept: the next attempt of epoch 2 reuses it, never draws it again
    assert cr.epoch == 1 and cr.premise_kept["epoch"] == 2
    assert acct.report()["rho_worst_case"] == pytest.approx(
        before["rho_worst_case"] + cr.premise.rho, rel=1e-9)
    with pytest.raises(BudgetExhausted):
        cr.close_epoch(s2)
    assert acct.report()["rho_worst_case"] == pytest.approx(
        before["rho_worst_case"] + cr.premise.rho, rel=1e-9)


def test_checkpoint_round_trip_continues_identically(corpus):
    """Restore from a msgpack checkpoint after epoch 3; continuing gives the same releases."""
    import streamdp.serialization as ser
    _, X = corpus
    sub = _subspace(X.shape[1], 5)
    clip = ClipBounds(m1=0.2, z=0.05, s3=0.02, warmup=1e-6)
    sums = _epoch_sums(X, sub, clip, 6)

    def fresh(seed):
        return ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=0.3, horizon=8,
                                sampler=CSPRNGGaussianSampler(seed), aggregator="tree")

    original = fresh(9)
    for s in sums[:3]:
        original.close_epoch(s)
    state = ser.loads(ser.dumps(original.state_dict()))
    assert original.tree.raw_partials == 3          # nodes (3-4), (1-4), (1-8) incomplete
    restored = fresh(77).load_state(state)
    original.mechanism.sampler = CSPRNGGaussianSampler(77)   # same future noise for both
    for s in sums[3:]:
        a, b = original.close_epoch(s), restored.close_epoch(s)
        np.testing.assert_array_equal(a.topic_word, b.topic_word)
        assert a.epoch == b.epoch
    with pytest.raises(ValueError, match="horizon"):
        ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=0.3, horizon=16,
                         sampler=CSPRNGGaussianSampler(0), aggregator="tree").load_state(state)


def test_node_mechanism_plans_every_block_on_the_node_partition():
    sub = _subspace(30, 4)
    clip = ClipBounds(m1=0.2, z=0.05, s3=0.02, warmup=1e-6)
    mech = SketchNodeMechanism(sub, clip, BudgetSplit(), 0.1, CSPRNGGaussianSampler(0))
    events = mech.plan("stream:epochs=5-8")
    assert {e.partition for e in events} == {"stream:epochs=5-8"}
    assert math.isclose(sum(e.rho for e in events), 0.1)
    noised = mech.privatize(zero_sums(sub), events)
    noised = noised.sketch
    np.testing.assert_allclose(noised.s1, sub.Q.T @ noised.m1)   # derived, not re-noised


# ------------------------------------------------------------------ the estimator
@pytest.mark.parametrize("aggregator", ["tree", "blt"])
def test_estimator_continual_mode_spends_at_most_the_budget_over_the_horizon(corpus, aggregator):
    model, X = corpus
    clock = EpochClock(stream_start=100.0, epoch_seconds=10.0)
    est = StreamingSpectralLDA(3, 1.0, epsilon=1.0, delta=1e-6, seed=0, noise_seed=3,
                               epochs=clock, horizon=4, continual_aggregator=aggregator)
    est.warmup(X[:3000])
    rng = np.random.default_rng(0)
    ts = np.sort(rng.uniform(100.0, 140.0, size=3000))
    est.partial_fit(X[3000:4500], ts[:1500])
    snaps = est.close_epochs(120.0)
    assert [s.epoch for s in snaps] == [1, 2]
    est.partial_fit(X[4500:], ts[1500:])
    assert est.late_documents_ == int((ts[1500:] < 120.0).sum())
    snaps += est.close_epochs(140.0)
    assert [s.epoch for s in snaps] == [1, 2, 3, 4]
    last = snaps[-1].privacy
    assert last["epochs_covered"] == [1, 4] and last["horizon"] == 4
    assert last["accountant"]["epsilon_worst_case"] <= 1.0 + 1e-9
    assert last["accountant"]["rho_worst_case"] <= zcdp_rho(1.0, 1e-6) * (1 + 1e-9)
    assert np.allclose(snaps[-1].topic_word.sum(1), 1.0)
    if aggregator == "tree":
        with pytest.raises(HorizonExceeded):
            est.close_epochs(150.0)
    else:                               # BLT: past the horizon, same budget
        more = est.close_epochs(170.0)
        assert [s.epoch for s in more] == [5, 6, 7]
        acc = more[-1].privacy["accountant"]
        assert acc["rho_worst_case"] <= zcdp_rho(1.0, 1e-6) * (1 + 1e-9)
        assert acc["epsilon_worst_case"] <= 1.0 + 1e-9
    with pytest.raises(ValueError, match="close_epochs"):
        est.release()
    with pytest.raises(ValueError, match="timestamps"):
        est.partial_fit(X[:10])


def test_continual_mode_needs_both_clock_and_horizon():
    with pytest.raises(ValueError, match="horizon"):
        StreamingSpectralLDA(3, epsilon=1.0, epochs=EpochClock(0.0, 1.0))
    with pytest.raises(ValueError, match="tensor"):
        StreamingSpectralLDA(3, epsilon=1.0, epochs=EpochClock(0.0, 1.0), horizon=4,
                             mechanism="iterative")
