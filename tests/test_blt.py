"""BLT matrix-factorization mechanism: the factorization against explicit matrices, its
accounting against the factorization's sensitivity, checkpoints and the spend protocol."""
import json
import math

import numpy as np
import pytest

import streamdp.serialization as ser
from streamdp import ClipBounds, WhitenedSketch
from streamdp.continual import ContinualRelease
from streamdp.privacy.accountant import Accountant, AlreadySpent, BudgetExhausted, LoadTally
from streamdp.privacy.blt import (BLTAggregator, BLTParams, GaussianArrayMechanism,
                                  _PARAMS_FILE, default_params, optimize_blt,
                                  sqrt_toeplitz_error_profile, tree_error_profile)
from streamdp.privacy.events import parse_partition, sigma_for_rho
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.privacy.spend import SpendSession
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.whitening.subspace import Subspace

from conftest import random_basis

PARAMS = BLTParams((0.97, 0.8, 0.35), (0.08, 0.15, 0.1))


def explicit_C(p: BLTParams, n: int) -> np.ndarray:
    """C built entry by entry from its definition c_0 = 1, c_j = Σ_i ω_i θ_i^{j−1}."""
    C = np.zeros((n, n))
    for i in range(n):
        C[i, i] = 1.0
        for j in range(i):
            C[i, j] = sum(w * th ** (i - j - 1) for th, w in zip(p.theta, p.omega))
    return C


class Recording:
    """A sampler that records every draw (to rebuild the noise by brute force)."""

    name = "recording"

    def __init__(self, seed):
        self.inner = CSPRNGGaussianSampler(seed)
        self.draws = []

    def sample(self, sigma, shape):
        x = self.inner.sample(sigma, shape)
        self.draws.append(np.array(x))
        return x

    def add_noise(self, value, sigma):
        x = np.asarray(value, dtype=np.float64)
        return x + self.sample(sigma, x.shape)


# ------------------------------------------------------------------ the factorization
def test_coefficients_inverse_and_variance_match_explicit_matrices():
    n = 40
    C = explicit_C(PARAMS, n)
    np.testing.assert_allclose(PARAMS.coefs(n), C[:, 0], rtol=1e-13)
    Cinv = np.linalg.inv(C)
    np.testing.assert_allclose(PARAMS.inverse_coefs(n), Cinv[:, 0], atol=1e-12)
    B = np.tril(np.ones((n, n))) @ Cinv                  # A = B·C
    np.testing.assert_allclose(B @ C, np.tril(np.ones((n, n))), atol=1e-10)
    np.testing.assert_allclose(PARAMS.noise_variance(n), (B ** 2).sum(axis=1), rtol=1e-10)
    # the sensitivity of C over n steps is its largest column norm (column 1, Toeplitz)
    col = np.sqrt((C ** 2).sum(axis=0))
    assert np.argmax(col) == 0
    assert PARAMS.sensitivity_squared(n) == pytest.approx(col.max() ** 2, rel=1e-12)
    # the infinite-horizon closed form is the limit of the finite sums
    assert PARAMS.sensitivity_squared(5000) == pytest.approx(PARAMS.sensitivity_squared(), rel=1e-12)
    assert PARAMS.sensitivity_squared(n) < PARAMS.sensitivity_squared()


def test_release_noise_is_exactly_B_times_the_draws():
    """The online recursion with nbuf buffers equals prefix(x) + A·C⁻¹·z computed densely."""
    n, shape = 25, (3, 2)
    sampler = Recording(3)
    mech = GaussianArrayMechanism(1.0, 0.7, sampler)
    agg = BLTAggregator(PARAMS, mech, keep_history=True)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(n,) + shape)
    for x in xs:
        agg.add_epoch(x)
    Z = np.stack([d.reshape(-1) for d in sampler.draws])       # n × 6
    B = np.tril(np.ones((n, n))) @ np.linalg.inv(explicit_C(PARAMS, n))
    expected = np.cumsum(xs.reshape(n, -1), axis=0) + B @ Z
    got = np.stack([agg.release(t).reshape(-1) for t in range(1, n + 1)])
    np.testing.assert_allclose(got, expected, atol=1e-10)
    assert agg.raw_partials == 0
    assert agg.noise_multiplier(n) == pytest.approx(math.sqrt((B[-1] ** 2).sum()))


def test_release_variance_matches_the_profile():
    """Empirical variance of the release noise at t vs σ²·Σ_{m<t} P_m² (many coordinates)."""
    p = default_params(64)
    mech = GaussianArrayMechanism(1.0, 1.0, CSPRNGGaussianSampler(5))
    agg = BLTAggregator(p, mech, keep_history=True)
    for _ in range(64):
        agg.add_epoch(np.zeros(20_000))
    prof = p.noise_variance(64)
    for t in (1, 2, 7, 33, 64):
        v = agg.release(t).var()
        assert v / prof[t - 1] == pytest.approx(1.0, abs=0.05), t


# ------------------------------------------------------------------ accounting
@pytest.mark.parametrize("n", [1, 5, 16])
def test_accounting_equals_the_factorizations_sensitivity(n):
    """After n epochs the accountant holds exactly ρ_unit × (max column norm of C_n)², the
    sensitivity of the factorization over n steps computed from the explicit matrix; every
    epoch's atom (whole-stream partition) carries the worst document's loss."""
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    rho = acc.rho_budget
    p = PARAMS
    sens, sigma = 1.3, sigma_for_rho(1.3, rho / p.sensitivity_squared())   # ρ_unit = ρ/‖c‖²
    seen = []

    class Spy:
        def reserve(self, events, *, label=""):
            seen.append(list(events))
            return acc.reserve(events, label=label)

        def commit(self, token):
            acc.commit(token)

    agg = BLTAggregator(p, GaussianArrayMechanism(sens, sigma, CSPRNGGaussianSampler(0)), Spy())
    for _ in range(n):
        agg.add_epoch(np.zeros(4))
    C = explicit_C(p, n)
    rho_unit = sens ** 2 / (2 * sigma ** 2)
    direct = rho_unit * np.max((C ** 2).sum(axis=0))
    assert acc.report()["rho_worst_case"] == pytest.approx(direct, rel=1e-9)
    assert agg.rho_per_document(n) == pytest.approx(direct, rel=1e-12)
    # per document, brute force: a document of epoch s is in y_t with weight C[t, s]
    tally = LoadTally()
    for evs in seen:
        for e in evs:
            tally.add(parse_partition(e.partition), e.rho)
    for s in range(n):
        doc_loss = rho_unit * float((C[:, s] ** 2).sum())
        assert doc_loss <= tally.atom(epoch=s + 1) * (1 + 1e-12)
    assert tally.atom(epoch=1) == pytest.approx(rho_unit * float((C[:, 0] ** 2).sum()), rel=1e-12)
    # the infinite-horizon limit is the stream budget, never exceeded
    assert rho_unit * p.sensitivity_squared() == pytest.approx(rho, rel=1e-12)
    assert acc.report()["rho_worst_case"] <= rho


def test_an_unbounded_stream_stays_within_the_budget():
    """Far past the optimisation horizon, the accounted ρ tends to (never exceeds) the budget."""
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    p = default_params(16)
    sigma = sigma_for_rho(1.0, acc.rho_budget / p.sensitivity_squared())
    agg = BLTAggregator(p, GaussianArrayMechanism(1.0, sigma, CSPRNGGaussianSampler(0)), acc)
    n = 4000
    for _ in range(n):
        agg.add_epoch(np.zeros(1))
    rep = acc.report()
    assert rep["rho_worst_case"] <= acc.rho_budget * (1 + 1e-9)
    assert rep["rho_worst_case"] == pytest.approx(acc.rho_budget * p.sensitivity_squared(n)
                                                  / p.sensitivity_squared(), rel=1e-9)
    assert rep["rho_worst_case"] > 0.999 * acc.rho_budget


def test_a_refused_epoch_changes_nothing():
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    # planned as if the budget were 1.2× larger: refused once Σ c_j² passes ‖c‖²/1.2
    sigma = sigma_for_rho(1.0, 1.2 * acc.rho_budget / PARAMS.sensitivity_squared())
    agg = BLTAggregator(PARAMS, GaussianArrayMechanism(1.0, sigma, CSPRNGGaussianSampler(0)), acc)
    with pytest.raises(BudgetExhausted):
        for _ in range(10_000):
            agg.add_epoch(np.ones(2))
    t = agg.epoch
    state = agg.state_dict(lambda v: v.tolist())
    assert PARAMS.sensitivity_squared(t) <= PARAMS.sensitivity_squared() / 1.2 < \
        PARAMS.sensitivity_squared(t + 1)
    with pytest.raises(BudgetExhausted):
        agg.add_epoch(np.ones(2))
    assert agg.state_dict(lambda v: v.tolist()) == state


# ------------------------------------------------------------------ checkpoints and crashes
def test_checkpoint_round_trip_continues_identically():
    p = default_params(32)
    mech = GaussianArrayMechanism(1.0, 0.5, CSPRNGGaussianSampler(1))
    a = BLTAggregator(p, mech)
    for t in range(7):
        a.add_epoch(np.full(5, float(t)))
    state = ser.loads(ser.dumps(a.state_dict(lambda v: v.tolist())))
    b = BLTAggregator.from_state(state, np.asarray,
                                 GaussianArrayMechanism(1.0, 0.5, CSPRNGGaussianSampler(2)))
    a.mechanism = GaussianArrayMechanism(1.0, 0.5, CSPRNGGaussianSampler(2))
    for t in range(7, 12):
        np.testing.assert_array_equal(a.add_epoch(np.full(5, 1.0 * t)), b.add_epoch(np.full(5, 1.0 * t)))
    with pytest.raises(ValueError, match="blt_aggregator"):
        BLTAggregator.from_state({**state, "kind": "tree_aggregator"}, np.asarray, mech)


def test_spend_protocol_fulfils_a_lost_draw_and_never_recharges(tmp_path):
    """Kill between reserve and persist: the restarted aggregator (from the last persisted
    state) re-closes the epoch under the same key, fulfilling, not re-charging; the ledger
    ends exactly where a clean run ends."""
    p = default_params(16)
    path = tmp_path / "ledger.jsonl"
    acc = Accountant(1.0, 1e-6, path)
    sigma = sigma_for_rho(1.0, acc.rho_budget / p.sensitivity_squared())

    def mech(seed):
        return GaussianArrayMechanism(1.0, sigma, CSPRNGGaussianSampler(seed))

    session = SpendSession(acc)
    agg = BLTAggregator(p, mech(0), session, label="tree")
    persisted = None
    for _ in range(3):                                    # epochs 1-3: reserve, draw, persist, commit
        agg.add_epoch(np.ones(3))
        persisted = agg.state_dict(lambda v: v.tolist())
        session.persisted()
    agg.add_epoch(np.ones(3))                             # epoch 4 reserved + drawn ... kill -9
    loaded_at_crash = acc.report()["rho_worst_case"]

    acc2 = Accountant(1.0, 1e-6, path)                    # restart on the same ledger
    s2 = SpendSession(acc2)
    agg2 = BLTAggregator.from_state(persisted, np.asarray, mech(1), s2)
    assert s2.recover(lambda key: int(key.rsplit("=", 1)[1]) <= agg2.epoch) == ["tree:epoch=4"]
    agg2.add_epoch(np.ones(3))
    assert s2.pending[0].fulfilling
    s2.persisted()
    for _ in range(2):
        agg2.add_epoch(np.ones(3))
        s2.persisted()
    rep = acc2.report()
    assert rep["uncommitted"] == 0 and rep["reservations"] == 6
    assert loaded_at_crash == pytest.approx(acc.rho_budget * p.sensitivity_squared(4) / p.sensitivity_squared())
    clean = Accountant(1.0, 1e-6, MemoryLedger())
    ref = BLTAggregator(p, mech(2), clean)
    for _ in range(6):
        ref.add_epoch(np.ones(3))
    assert rep["rho_worst_case"] == pytest.approx(clean.report()["rho_worst_case"], rel=1e-12)
    # an incarnation from an older state would redraw a committed key: refused
    with pytest.raises(AlreadySpent):
        BLTAggregator.from_state(persisted, np.asarray, mech(3), SpendSession(acc2)).add_epoch(np.ones(3))


# ------------------------------------------------------------------ on sketch sums
@pytest.fixture(scope="module")
def corpus():
    model = make_lda_model(80, 3, alpha0=1.0, beta=0.1, seed=11)
    X = sample_documents(model, 4_000, mean_length=30, seed=12)
    return model, X


def test_continual_release_on_sketches_noise_and_derived_blocks(corpus):
    _, X = corpus
    sub = Subspace(random_basis(np.random.default_rng(0), X.shape[1], 5))
    clip = ClipBounds(m1=0.2, z=0.05, s3=0.02, warmup=1e-6)
    parts = np.array_split(np.arange(X.shape[0]), 6)
    sums = [WhitenedSketch(sub, clip).update(X[p]).sums() for p in parts]
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    cr = ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=acc.rho_budget, horizon=4,
                          sampler=CSPRNGGaussianSampler(4), spender=acc)
    assert cr.aggregator == "blt" and cr.epoch_limit == math.inf
    sigma_z = {e.block: e.sigma for e in cr.mechanism.plan("stream")}["z"]
    exact = None
    for t, s in enumerate(sums, start=1):            # 6 epochs: past the horizon of 4
        snap = cr.close_epoch(s)
        exact = s if exact is None else exact + s
        rel = cr.tree.prefix().sketch
        resid = (rel.z - exact.z).ravel()
        var = cr.blt_params.noise_variance(t)[t - 1]
        assert 0.75 < resid.var() / (var * sigma_z ** 2) < 1.3, t
        np.testing.assert_allclose(rel.s1, sub.Q.T @ rel.m1, atol=1e-12)   # derived, not noised
        np.testing.assert_allclose(rel.s2, rel.s2.T, atol=1e-12)
        assert snap.privacy["mechanism"] == "blt" and snap.mechanism == "blt"
        assert snap.privacy["noise_sd"]["z"] == pytest.approx(sigma_z * math.sqrt(var))
        assert snap.privacy["rho_spent_per_document"] == pytest.approx(
            acc.report()["rho_worst_case"], rel=1e-9)
    assert acc.report()["rho_worst_case"] <= acc.rho_budget
    # checkpoint: the configured aggregator must match the persisted one
    state = ser.loads(ser.dumps(cr.state_dict()))
    with pytest.raises(ValueError, match="aggregator"):
        ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=acc.rho_budget, horizon=4,
                         sampler=CSPRNGGaussianSampler(0), aggregator="tree").load_state(state)
    restored = ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=acc.rho_budget, horizon=4,
                                sampler=CSPRNGGaussianSampler(0)).load_state(state)
    assert restored.epoch == 6
    np.testing.assert_array_equal(restored.tree.prefix().sketch.z, cr.tree.prefix().sketch.z)


# ------------------------------------------------------------------ parameters
def test_shipped_parameters_are_rederived():
    """The shipped table is what the optimiser finds (loss to 1e-6); spot-check three n."""
    table = json.loads(_PARAMS_FILE.read_text())["params"]
    assert table, "no shipped BLT parameters"
    for key in ("n=16,nbuf=4,objective=max", "n=256,nbuf=4,objective=max",
                "n=1024,nbuf=4,objective=max"):
        shipped = BLTParams.from_dict(table[key])
        n = int(key.split(",")[0][2:])
        again = optimize_blt(n, 4, "max")
        assert shipped.error_profile(n)[-1] == pytest.approx(again.error_profile(n)[-1], rel=1e-6)
        assert default_params(n) == shipped


def test_optimised_blt_beats_the_tree_at_every_epoch_and_nears_sqrt_toeplitz():
    n = 1024
    blt, tree, sq = default_params(n).error_profile(n), tree_error_profile(n), sqrt_toeplitz_error_profile(n)
    assert np.all(blt <= tree)
    assert blt.max() <= 0.1 * tree.max() and blt.mean() <= 0.2 * tree.mean()
    assert blt.max() <= 1.03 * sq.max()


def test_bad_parameters_and_config_are_refused():
    with pytest.raises(ValueError, match="θ"):
        BLTParams((1.0,), (0.1,))
    with pytest.raises(ValueError, match="θ"):
        BLTParams((0.5,), (-0.1,))
    with pytest.raises(ValueError, match="aggregator"):
        ContinualRelease(Subspace(random_basis(np.random.default_rng(0), 10, 2)),
                         ClipBounds.unclipped(), n_topics=2, alpha0=1.0, rho=None, horizon=4,
                         aggregator="smooth")
    from streamdp.services.config import ConfigError, ServiceConfig
    with pytest.raises(ConfigError, match="continual_aggregator"):
        ServiceConfig(vocabulary="v.txt", continual_aggregator="binary")


def test_blt_with_opendp_and_refinement_sums(corpus):
    """The default sampler (OpenDP) and the refinement block: released = exact prefix +
    correlated noise whose variance follows the profile, on the spectral and refinement sums."""
    from streamdp.continual import EpochSums
    from streamdp.privacy.noise import OpenDPGaussianSampler
    from streamdp.refinement import BLOCK as REFINE_BLOCK
    from streamdp.refinement import RefinementConfig
    from streamdp.release import BudgetSplit
    _, X = corpus
    sub = Subspace(random_basis(np.random.default_rng(1), X.shape[1], 4))
    clip = ClipBounds(m1=0.2, z=0.05, s3=0.02, warmup=1e-6)
    parts = np.array_split(np.arange(1200), 4)
    rng = np.random.default_rng(2)
    sums = [EpochSums(WhitenedSketch(sub, clip).update(X[p]).sums(), rng.random((3, X.shape[1])))
            for p in parts]
    cr = ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=0.5, horizon=4,
                          sampler=OpenDPGaussianSampler(), refinement=RefinementConfig(),
                          split=BudgetSplit.spectral_start())
    sd = {e.block: e.sigma for e in cr.mechanism.plan("stream")}
    exact = None
    for t, s in enumerate(sums, start=1):
        snap = cr.close_epoch(s, refined=t > 1)
        exact = s if exact is None else exact + s
        rel = cr.tree.prefix()
        var = cr.blt_params.noise_variance(t)[t - 1]
        resid = (rel.refine - exact.refine).ravel()
        assert 0.6 < resid.var() / (var * sd[REFINE_BLOCK] ** 2) < 1.5, t
        assert snap.privacy["noise_sd"][REFINE_BLOCK] == pytest.approx(sd[REFINE_BLOCK] * math.sqrt(var))
        assert snap.privacy["sampler"] == OpenDPGaussianSampler.name
    np.testing.assert_allclose(rel.sketch.z, 0.0)        # withheld by the spectral start split
