"""Binary tree mechanism: exact prefix sums, noise variance, accounting, horizon, checkpoints."""
from dataclasses import dataclass

import numpy as np
import pytest

from streamdp import serialization as ser
from streamdp.privacy.accountant import Accountant, BudgetExhausted, events_loads
from streamdp.privacy.events import EventLog, GaussianEvent, parse_partition, sigma_for_rho
from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.privacy.tree import (GaussianNodeMechanism, HorizonExceeded, TreeAggregator,
                                   completing_levels, covering_levels, tree_depth)


class Exact:
    """No noise (to test the bookkeeping); plans a unit-cost event per node."""

    def __init__(self, rho=0.01):
        self.rho = rho

    def plan(self, partition):
        return (GaussianEvent("x", 1.0, sigma_for_rho(1.0, self.rho), partition=partition),)

    def privatize(self, value, events):
        return value


class Marked(Exact):
    """Deterministic, node-dependent 'noise' so restored noised nodes are visible."""

    def privatize(self, value, events):
        a, b = parse_partition(events[0].partition).epochs
        return value + (1000.0 * a + b)


def test_tree_shape():
    assert [tree_depth(T) for T in (1, 2, 3, 4, 7, 8, 9, 1000)] == [1, 2, 2, 3, 3, 4, 4, 10]
    assert completing_levels(8, 8) == [0, 1, 2, 3]
    assert completing_levels(8, 7) == [0, 1, 2]            # only nodes ending ≤ horizon exist
    assert completing_levels(6, 16) == [0, 1]
    assert covering_levels(13) == [3, 2, 0]                # 13 = 8 + 4 + 1
    tr = TreeAggregator(16, Exact())
    assert tr.covering_nodes(13) == [(1, 8), (9, 12), (13, 13)]
    assert len(tr.covering_nodes(15)) == 4 == int(np.log2(15)) + 1
    with pytest.raises(ValueError):
        tree_depth(0)


@pytest.mark.parametrize("T", [1, 2, 7, 8, 13, 32])
def test_releases_are_exact_prefix_sums_and_raw_state_is_small(T):
    rng = np.random.default_rng(T)
    xs = rng.normal(size=(T, 3))
    tr = TreeAggregator(T, Exact(), keep_history=True)
    for t in range(1, T + 1):
        out = tr.add_epoch(xs[t - 1])
        np.testing.assert_allclose(out, xs[:t].sum(0), rtol=1e-12, atol=1e-12)
        assert tr.raw_partials <= tr.depth - 1
        if t & (t - 1) == 0 and t == T:
            assert tr.raw_partials == 0                     # everything noised at T = 2^m
    for t in range(1, T + 1):
        np.testing.assert_allclose(tr.release(t), xs[:t].sum(0), rtol=1e-12, atol=1e-12)
    # every node noised exactly once
    parts = [e.partition for e in tr.spender.events]
    assert len(parts) == len(set(parts)) == sum(len(completing_levels(t, T)) for t in range(1, T + 1))


def test_release_noise_variance_is_covering_nodes_times_sigma2():
    T, m, sigma = 13, 4000, 2.0
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(T, m)) * 10
    mech = GaussianNodeMechanism(sensitivity=1.0, sigma=sigma, sampler=CSPRNGGaussianSampler(seed=7))
    tr = TreeAggregator(T, mech)
    for t in range(1, T + 1):
        err = tr.add_epoch(xs[t - 1]) - xs[:t].sum(0)
        nodes = bin(t).count("1")
        assert nodes == len(tr.covering_nodes(t)) <= int(np.log2(t)) + 1
        var = err.var()
        # sample variance of m Gaussians: relative s.d. √(2/m) ≈ 2.2%; allow ±10%
        assert 0.9 * nodes * sigma**2 < var < 1.1 * nodes * sigma**2, (t, var)
        assert abs(err.mean()) < 5 * np.sqrt(nodes) * sigma / np.sqrt(m)


@pytest.mark.parametrize("T", [8, 13])
def test_each_document_costs_depth_times_rho_node(tmp_path, T):
    acc = Accountant(1.0, 1e-6, tmp_path / "ledger.jsonl")
    depth = tree_depth(T)
    rho_node = acc.rho_budget / depth
    tr = TreeAggregator(T, Exact(rho_node), acc)
    assert tr.rho_per_document() == pytest.approx(depth * rho_node)
    assert events_loads(tr.planned_events()).worst == pytest.approx(depth * rho_node)
    for t in range(1, T + 1):
        tr.add_epoch(np.ones(2))                            # the whole horizon fits the budget
    rep = acc.report()
    assert rep["rho_worst_case"] == pytest.approx(depth * rho_node)
    assert rep["epsilon_worst_case"] <= 1.0
    assert rep["uncommitted"] == 0 and rep["reservations"] == T
    # per epoch: the nodes covering it; epoch 1 is in exactly `depth` of them
    nodes = [parse_partition(p).epochs for p in rep["rho_spent_by_partition"]]
    per_epoch = [sum(a <= e <= b for a, b in nodes) for e in range(1, T + 1)]
    assert per_epoch[0] == depth and max(per_epoch) == depth


def test_refuses_past_horizon_without_spending(tmp_path):
    acc = Accountant(1.0, 1e-6, tmp_path / "ledger.jsonl")
    tr = TreeAggregator(5, Exact(1e-4), acc)
    for _ in range(5):
        tr.add_epoch(np.ones(1))
    before = acc.report()
    with pytest.raises(HorizonExceeded, match="horizon T=5"):
        tr.add_epoch(np.ones(1))
    assert tr.epoch == 5 and tr.prefix()[0] == 5
    assert acc.report()["reservations"] == before["reservations"]


def test_budget_refusal_leaves_the_tree_unchanged(tmp_path):
    acc = Accountant(1.0, 1e-6, tmp_path / "ledger.jsonl")
    rho_node = acc.rho_budget / 2.5                 # only 2 nodes may cover an epoch
    tr = TreeAggregator(8, Exact(rho_node), acc)
    for t in range(1, 4):
        tr.add_epoch(np.full(1, float(t)))
    state = tr.state_dict(ser.pack_array)
    with pytest.raises(BudgetExhausted, match="stream epoch"):
        tr.add_epoch(np.full(1, 4.0))               # node [1,4] would be epoch 1's third
    assert tr.state_dict(ser.pack_array) == state
    assert tr.epoch == 3 and tr.prefix()[0] == 6.0
    with pytest.raises(BudgetExhausted):            # stays refused
        tr.add_epoch(np.full(1, 4.0))


def test_checkpoint_round_trip_through_msgpack():
    T = 11
    xs = np.arange(1.0, T + 1)[:, None] * np.array([1.0, -2.0])
    a = TreeAggregator(T, Marked(), label="z")
    for t in range(1, 7):
        a.add_epoch(xs[t - 1])
    blob = ser.dumps(a.state_dict(ser.pack_array))
    b = TreeAggregator.from_state(ser.loads(blob), ser.unpack_array, Marked())
    assert (b.epoch, b.horizon, b.depth, b.label, b.raw_partials) == (6, T, 4, "z", a.raw_partials)
    np.testing.assert_array_equal(a.prefix(), b.prefix())
    for t in range(7, T + 1):
        np.testing.assert_array_equal(a.add_epoch(xs[t - 1]), b.add_epoch(xs[t - 1]))
    with pytest.raises(ValueError):
        TreeAggregator.from_state({"kind": "other", "v": 1}, ser.unpack_array, Marked())


def test_an_emptied_raw_partial_is_left_out_of_its_node():
    """What a failed premise check does (streamdp.aggregator_kinds.TreeKind.empty_completing):
    the completing node is drawn from the emptied partial plus this epoch, the other levels'
    partials are untouched, and a level holding no partial stays without one."""
    tr = TreeAggregator(4, Exact())                  # depth 3: levels 0, 1, 2
    tr.add_epoch(1.0)
    assert (tr.raw_partial(1), tr.raw_partial(2)) == (1.0, 1.0)
    tr.empty_raw_partial(1, 0.0)
    assert tr.add_epoch(2.0) == 2.0                  # node (1, 2) = 0 + 2, not 1 + 2
    assert (tr.raw_partial(1), tr.raw_partial(2)) == (None, 3.0)  # (1, 2) noised; (1-4) kept
    tr.empty_raw_partial(1, 0.0)
    assert tr.raw_partial(1) is None and tr.raw_partials == 1


def test_mechanism_must_tag_events_with_the_node_partition():
    class Wrong(Exact):
        def plan(self, partition):
            return (GaussianEvent("x", 1.0, 1.0, partition="stream"),)

    log = EventLog()
    tr = TreeAggregator(4, Wrong(), log)
    with pytest.raises(ValueError, match="stream:epochs=1-1"):
        tr.add_epoch(np.ones(1))
    assert tr.epoch == 0 and log.events == []


@dataclass(frozen=True)
class Blocks:
    """A dataclass of arrays, like the engine's block sums."""

    z: np.ndarray
    s3: np.ndarray

    def __add__(self, other):
        return Blocks(self.z + other.z, self.s3 + other.s3)


class BlocksMechanism:
    def __init__(self, sampler):
        self.sampler = sampler

    def plan(self, partition):
        return (GaussianEvent("z", 0.1, 1.0, partition=partition),
                GaussianEvent("s3", 0.05, 0.5, partition=partition))

    def privatize(self, value, events):
        ez, es3 = events
        return Blocks(value.z + self.sampler.sample(ez.sigma, value.z.shape),
                      value.s3 + self.sampler.sample(es3.sigma, value.s3.shape))


def test_generic_values_and_one_reservation_per_epoch():
    log = EventLog()
    tr = TreeAggregator(4, BlocksMechanism(CSPRNGGaussianSampler(seed=3)), log)
    for t in range(1, 5):
        out = tr.add_epoch(Blocks(np.ones((3, 2)), np.ones((2, 2, 2))))
        assert isinstance(out, Blocks) and out.z.shape == (3, 2)
    assert len(log.events) == 2 * 7                 # 7 nodes for T = 4, two blocks each
    assert events_loads(log.events).worst == pytest.approx(3 * (0.5 * 0.01 + 0.5 * 0.01))


def test_spend_protocol_fulfils_a_lost_draw_and_never_recharges(tmp_path):
    """Tree + SpendSession (streamdp/privacy/spend.py): a crash after reserve/draw and before
    persist is fulfilled by a fresh draw under the same key; a persisted one is committed; a
    committed key is never drawn again."""
    from streamdp.privacy.accountant import AlreadySpent
    from streamdp.privacy.spend import SpendSession

    path = tmp_path / "ledger.jsonl"
    acc = Accountant(1.0, 1e-6, path)
    node_rho = acc.rho_budget / 3                         # horizon 4: depth 3
    sens = 1.0
    mech = GaussianNodeMechanism(sens, sigma_for_rho(sens, node_rho), CSPRNGGaussianSampler())
    tree = TreeAggregator(4, mech, SpendSession(acc))
    before = tree.state_dict(lambda v: v.tolist())
    tree.add_epoch(np.ones(3))                           # reserve + draw; never persisted: "crash"
    rho_after_crash = acc.report()["rho_worst_case"]
    assert rho_after_crash == pytest.approx(node_rho)

    # restart: a new accountant and session on the same ledger, the tree from the persisted state
    acc2 = Accountant(1.0, 1e-6, path)
    session = SpendSession(acc2)
    assert session.recover(lambda key: False) == ["tree:epoch=1"]
    tree2 = TreeAggregator.from_state(before, np.asarray, mech, session)
    out = tree2.add_epoch(np.ones(3))                    # fulfils tree:epoch=1, no new charge
    assert out.shape == (3,)
    assert session.pending and session.pending[0].fulfilling
    session.persisted()                                  # the state write succeeded: commit
    rep = acc2.report()
    assert rep["rho_worst_case"] == pytest.approx(node_rho) and rep["uncommitted"] == 0
    assert rep["reservations"] == 1

    # a third incarnation from the *old* state would redraw a committed key: refused
    tree3 = TreeAggregator.from_state(before, np.asarray, mech, SpendSession(acc2))
    with pytest.raises(AlreadySpent):
        tree3.add_epoch(np.ones(3))
    # a crash after persist: recover() commits instead of leaving the key to fulfil
    state1 = tree2.state_dict(lambda v: v.tolist())
    s4 = SpendSession(acc2)
    tree4 = TreeAggregator.from_state(state1, np.asarray, mech, s4)
    tree4.add_epoch(np.ones(3))                          # epoch 2 reserved + drawn, "persisted", crash
    assert SpendSession(acc2).recover(lambda key: key == "tree:epoch=2") == []
    rep = acc2.report()
    assert rep["uncommitted"] == 0 and rep["reservations"] == 2
    assert rep["rho_worst_case"] == pytest.approx(2 * node_rho)   # epoch 2: nodes [2,2] and [1,2]
