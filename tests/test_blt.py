"""BLT matrix-factorization mechanism: the factorization against explicit matrices, its
accounting against the factorization's sensitivity, checkpoints and the spend protocol."""
import json
import math
from fractions import Fraction

import numpy as np
import pytest

import streamdp.serialization as ser
from streamdp import ClipBounds, WhitenedSketch
from streamdp.continual import ContinualRelease
from streamdp.privacy.accountant import Accountant, AlreadySpent, BudgetExhausted, LoadTally
from streamdp.privacy.blt import (DEFAULT_MAX_EPOCHS, BLTAggregator, BLTParams,
                                  GaussianArrayMechanism, charged_weight,
                                  default_params, optimize_blt, sqrt_toeplitz_error_profile,
                                  strategy_rounding_bound, tree_error_profile)
from streamdp.privacy.blt_factorization import _PARAMS_FILE
from streamdp.privacy.rounding import UNIT_ROUNDOFF
from streamdp.privacy.tree import HorizonExceeded
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
        self.inputs = []          # the data values handed to the sampler: (C x)_t

    def sample(self, sigma, shape):
        x = self.inner.sample(sigma, shape)
        self.draws.append(np.array(x))
        return x

    def add_noise(self, value, sigma):
        x = np.asarray(value, dtype=np.float64)
        self.inputs.append(np.array(x))
        return x + self.sample(sigma, x.shape)


def eps_of(agg) -> float:
    """ε = 2F/Δ recomputed from the documented formula (independently of rounding_ratio)."""
    (e,) = agg.unit_events()
    X = agg.mechanism.magnitudes([e])[0]
    u = UNIT_ROUNDOFF
    th, om = np.array(agg.params.theta), np.array(agg.params.omega)
    D = 14 * u * u * X / (1 - th) ** 2
    K = 1.01 * (3 * len(th) * (len(th) + 2) + 3)
    t_abs = X + (1 + 2 * u) * np.sum(om * (X / (1 - th) + D))
    F = (u + 2 * K * u * u) * t_abs + np.sum(om * D) + 2.0 ** -1000 * (1 + np.sum(om / (1 - th)))
    return 2 * F / e.sensitivity


def calibrated_sigma(p, sens, rho, max_epochs=DEFAULT_MAX_EPOCHS):
    """σ for ρ_unit = ρ/W (W from the closed form, for a magnitude of 10⁹·sens)."""
    probe = BLTAggregator(p, GaussianArrayMechanism(sens, 1.0, None), max_epochs=max_epochs)
    return sigma_for_rho(sens, rho / probe.charge_weight())


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
    assert agg.raw_partials == PARAMS.nbuf
    assert agg.noise_multiplier(n) == pytest.approx(math.sqrt((B[-1] ** 2).sum()))


def test_raw_and_public_buffers_match_explicit_matrices():
    """What the sampler sees is (C x)_t (raw buffers, data only); the released increments are
    C⁻¹ of the sampler's outputs (public buffers); the raw buffers are Σ_s θ^{t−1−s} x_s."""
    n, shape = 30, (4,)
    sampler = Recording(7)
    agg = BLTAggregator(PARAMS, GaussianArrayMechanism(1.0, 0.9, sampler), keep_history=True)
    xs = np.random.default_rng(1).normal(size=(n,) + shape)
    for x in xs:
        agg.add_epoch(x)
    C = explicit_C(PARAMS, n)
    V = np.stack(sampler.inputs)                              # inputs of the sampler
    np.testing.assert_allclose(V, C @ xs, rtol=1e-13, atol=1e-13)
    Y = V + np.stack(sampler.draws)                           # its outputs (public)
    steps = np.diff(np.stack([np.zeros(shape)] + [agg.release(t) for t in range(1, n + 1)]), axis=0)
    np.testing.assert_allclose(C @ steps, Y, atol=1e-11)
    th = np.array(PARAMS.theta)
    R = np.stack([sum(th ** (n - 1 - s) * xs[s][0] for s in range(n))])[0]   # R_{i,n+1}, coordinate 0
    np.testing.assert_allclose(agg._raw_hi[:, 0] + agg._raw_lo[:, 0], R, rtol=1e-14)
    P = sum(th ** (n - 1 - s) * steps[s][0] for s in range(n))
    np.testing.assert_allclose(agg._public[:, 0], P, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ rounding
def _exact_strategy(p: BLTParams, xs: np.ndarray) -> list[list[Fraction]]:
    """(C x)_t in exact rational arithmetic from the float inputs and float θ, ω."""
    th, om = [Fraction(v) for v in p.theta], [Fraction(v) for v in p.omega]
    c = [Fraction(1)] + [sum(w * a ** (j - 1) for a, w in zip(th, om)) for j in range(1, len(xs))]
    return [[sum(c[t - s] * Fraction(float(xs[s][k])) for s in range(t + 1))
             for k in range(xs.shape[1])] for t in range(len(xs))]


def _dist(v: np.ndarray, exact: list[Fraction]) -> float:
    return math.sqrt(sum(float(Fraction(float(a)) - b) ** 2 for a, b in zip(v, exact)))


def _naive_strategy(p: BLTParams, xs: np.ndarray) -> list[np.ndarray]:
    """Plain float64 buffers (what the bound must NOT be claimed for)."""
    th, om = np.array(p.theta), np.array(p.omega)
    R, out = np.zeros((p.nbuf, xs.shape[1])), []
    for x in xs:
        out.append(x + om @ R)
        R = th[:, None] * R + x[None, :]
    return out


@pytest.mark.parametrize("s0", [1, 4, 17])
def test_neighbouring_epoch_sequences_move_each_step_within_the_declared_sensitivity(s0):
    """Adversarial rounding: large cancelling epoch sums (±10¹⁰, the magnitude of 10⁹ documents),
    one document added in epoch s0. Against exact rationals, every computed (C x)_t is within F
    of the exact value; neighbours differ by ≤ c_{t−s0}·‖x'_{s0} − x_{s0}‖ + 2F, i.e. ≤ the
    charged Δ·(c_{t−1} + ε) at the worst s0 = 1; nothing before s0. Plain float64 buffers break F."""
    n, M = 40, 1e10
    rng = np.random.default_rng(s0)
    signs = np.array([1.0, -1.0, 1.0, -1.0])
    xs = np.stack([M * (1 + rng.integers(0, 2 ** 20, size=4) / 2 ** 20 * 1e-3) * signs
                   + rng.normal(size=4) for _ in range(n)])
    doc = np.array([0.6, -0.8, 0.0, 0.0]) * (1 - 1e-12)      # one document, norm ≤ Δ = 1
    xs2 = xs.copy()
    xs2[s0 - 1] = xs[s0 - 1] + doc
    X = max(max(np.linalg.norm(x) for x in xs), max(np.linalg.norm(x) for x in xs2))
    F = strategy_rounding_bound(PARAMS, X)
    inputs = []
    for seq in (xs, xs2):
        rec = Recording(0)
        agg = BLTAggregator(PARAMS, GaussianArrayMechanism(1.0, 1.0, rec, magnitude=X))
        for x in seq:
            agg.add_epoch(x)
        inputs.append(np.stack(rec.inputs))
        exact = _exact_strategy(PARAMS, seq)
        errors = [_dist(v, e) for v, e in zip(rec.inputs, exact)]
        assert max(errors) <= F, (max(errors), F)
    eps = agg.rounding_ratio()
    assert eps == pytest.approx(2 * F / 1.0, rel=1e-12)
    c = PARAMS.coefs(n)
    moved = np.linalg.norm(xs2[s0 - 1] - xs[s0 - 1])
    for t in range(1, n + 1):
        diff = np.linalg.norm(inputs[1][t - 1] - inputs[0][t - 1])
        if t < s0:
            assert diff == 0.0
        else:
            assert diff <= c[t - s0] * moved + 2 * F, t
            assert diff <= agg.step_factor(t - s0 + 1) * 1.0   # Δ·(c_{t−s0} + ε)
    # the bound is needed: plain float64 buffers exceed it on the same input
    naive = _naive_strategy(PARAMS, xs)
    assert max(_dist(v, e) for v, e in zip(naive, _exact_strategy(PARAMS, xs))) > F


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
def test_accounting_equals_the_factorizations_sensitivity_plus_rounding(n):
    """After n epochs the accountant holds exactly ρ_unit·Σ_t (C[t,0] + ε)², the column norm of
    the explicit matrix with the per-step rounding term ε = 2F/Δ added to every step; every
    epoch's atom (whole-stream partition) carries at least each document's loss."""
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    rho = acc.rho_budget
    p = PARAMS
    sens = 1.3
    sigma = calibrated_sigma(p, sens, rho)
    seen = []

    class Spy:
        def reserve(self, events, *, label=""):
            seen.append(list(events))
            return acc.reserve(events, label=label)

        def commit(self, token):
            acc.commit(token)

    agg = BLTAggregator(p, GaussianArrayMechanism(sens, sigma, CSPRNGGaussianSampler(0)), Spy())
    eps = eps_of(agg)
    assert agg.rounding_ratio() == pytest.approx(eps, rel=1e-12)
    assert 1e-7 < eps < 1e-5          # u·‖c‖₁·10⁹·2: small, but charged
    for _ in range(n):
        agg.add_epoch(np.zeros(4))
    C = explicit_C(p, n)
    rho_unit = sens ** 2 / (2 * sigma ** 2)
    direct = rho_unit * float(np.sum((C[:, 0] + eps) ** 2))
    assert acc.report()["rho_worst_case"] == pytest.approx(direct, rel=1e-9)
    assert agg.rho_per_document(n) == pytest.approx(direct, rel=1e-12)
    # per document, brute force: a document of epoch s moves step t by ≤ Δ·(C[t, s] + ε)
    tally = LoadTally()
    for evs in seen:
        for e in evs:
            tally.add(parse_partition(e.partition), e.rho)
    for s in range(n):
        doc_loss = rho_unit * float(np.sum((C[s:, s] + eps) ** 2))
        assert doc_loss <= tally.atom(epoch=s + 1) * (1 + 1e-12)
    # calibration: through T_max epochs the charge stays within ρ (closed form ≥ exact sum)
    W = charged_weight(p, eps, DEFAULT_MAX_EPOCHS)
    assert rho_unit * W == pytest.approx(rho, rel=1e-12)
    c = p.coefs(DEFAULT_MAX_EPOCHS)
    assert float(np.sum((c + eps) ** 2)) <= W
    assert agg.rho_per_document() == pytest.approx(rho, rel=1e-12)
    # its cost: W/‖c‖² − 1 (σ grows by √ of this)
    assert 0 < W / p.sensitivity_squared() - 1 < 1e-3


def test_a_long_stream_stays_within_the_budget_and_stops_at_max_epochs():
    """σ calibrated for T_max: the accounted ρ after T_max epochs is ≤ the budget, and epoch
    T_max + 1 is refused before anything is reserved (data-independent)."""
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    p = default_params(16)
    T = 3000
    sigma = calibrated_sigma(p, 1.0, acc.rho_budget, max_epochs=T)
    agg = BLTAggregator(p, GaussianArrayMechanism(1.0, sigma, CSPRNGGaussianSampler(0)), acc,
                        max_epochs=T)
    for _ in range(T):
        agg.add_epoch(np.zeros(1))
    rep = acc.report()
    assert rep["rho_worst_case"] <= acc.rho_budget * (1 + 1e-9)
    assert rep["rho_worst_case"] > 0.999 * acc.rho_budget
    eps = agg.rounding_ratio()
    assert rep["rho_worst_case"] == pytest.approx(
        acc.rho_budget * float(np.sum((p.coefs(T) + eps) ** 2)) / agg.charge_weight(), rel=1e-9)
    state = agg.state_dict()
    with pytest.raises(HorizonExceeded, match="max_epochs"):
        agg.add_epoch(np.zeros(1))
    assert agg.state_dict() == state and acc.report()["reservations"] == T


def test_a_refused_epoch_changes_nothing():
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    # planned as if the budget were 1.2× larger: refused once Σ(c_j + ε)² passes W/1.2
    sigma = calibrated_sigma(PARAMS, 1.0, 1.2 * acc.rho_budget)
    agg = BLTAggregator(PARAMS, GaussianArrayMechanism(1.0, sigma, CSPRNGGaussianSampler(0)), acc)
    with pytest.raises(BudgetExhausted):
        for _ in range(10_000):
            agg.add_epoch(np.ones(2))
    t = agg.epoch
    state = agg.state_dict()
    eps = agg.rounding_ratio()
    W = agg.charge_weight()
    assert float(np.sum((PARAMS.coefs(t) + eps) ** 2)) <= W / 1.2 < \
        float(np.sum((PARAMS.coefs(t + 1) + eps) ** 2))
    with pytest.raises(BudgetExhausted):
        agg.add_epoch(np.ones(2))
    assert agg.state_dict() == state


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
    np.testing.assert_array_equal(b.prefix(), a.prefix())
    a.mechanism = GaussianArrayMechanism(1.0, 0.5, CSPRNGGaussianSampler(2))
    for t in range(7, 12):
        np.testing.assert_array_equal(a.add_epoch(np.full(5, 1.0 * t)), b.add_epoch(np.full(5, 1.0 * t)))
    with pytest.raises(ValueError, match="blt_aggregator"):
        BLTAggregator.from_state({**state, "kind": "tree_aggregator"}, np.asarray, mech)
    # a v1 state (secret noise buffers) is refused with what to do
    old = {"kind": "blt_aggregator", "v": 1, "params": p.to_dict(), "epoch": 3, "label": "blt",
           "keep_history": False, "buffers": state["raw_hi"], "prefix": [0.0] * 5, "history": []}
    with pytest.raises(ValueError, match="schema v1.*start a new stream"):
        BLTAggregator.from_state(old, np.asarray, mech)
    with pytest.raises(ValueError, match="raw_lo of shape"):
        BLTAggregator.from_state({**state, "raw_lo": ser.pack_array(np.zeros((2, 5)))}, np.asarray, mech)


def test_spend_protocol_fulfils_a_lost_draw_and_never_recharges(tmp_path):
    """Kill between reserve and persist: the restarted aggregator (from the last persisted
    state) re-closes the epoch under the same key, fulfilling, not re-charging; the ledger
    ends exactly where a clean run ends."""
    p = default_params(16)
    path = tmp_path / "ledger.jsonl"
    acc = Accountant(1.0, 1e-6, path)
    sigma = calibrated_sigma(p, 1.0, acc.rho_budget)

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
    probe = mech(0)
    eps = BLTAggregator(p, probe).rounding_ratio()
    W = BLTAggregator(p, probe).charge_weight()
    assert loaded_at_crash == pytest.approx(acc.rho_budget * float(np.sum((p.coefs(4) + eps) ** 2)) / W)
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
    assert cr.aggregator == "blt" and cr.epoch_limit == DEFAULT_MAX_EPOCHS
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
    from streamdp.privacy.plan import BudgetSplit
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


def test_calibration_charges_the_samplers_rounding_and_still_reaches_max_epochs():
    """Every event is charged count·(c̃Δ/σ + s)²/2 (s = ROUNDING_SLACK, the samplers' input
    rounding, which does not scale with c̃). Calibrating the unit plan at ρ/W, as the BLT did
    before, over-plans by ≈ 2s·(σ/Δ)·‖c‖₁/W: at σ/Δ ≈ 1,000 the accountant refused the last
    epochs before T_max. calibrate_unit_rho charges every epoch to T_max within ρ."""
    from streamdp.privacy.blt import calibrate_unit_rho, charged_total
    from streamdp.privacy.events import ROUNDING_SLACK

    p, T = default_params(16), 3000

    def run(unit_rho: float):
        acc = Accountant(0.005, 1e-6, MemoryLedger())
        agg = BLTAggregator(p, GaussianArrayMechanism(1.0, sigma_for_rho(1.0, unit_rho),
                                                      CSPRNGGaussianSampler(0)), acc, max_epochs=T)
        try:
            for _ in range(T):
                agg.add_epoch(np.zeros(1))
        except BudgetExhausted:
            pass
        return agg, acc.report()

    rho = Accountant(0.005, 1e-6, MemoryLedger()).rho_budget

    def agg_for(r):
        return BLTAggregator(p, GaussianArrayMechanism(1.0, sigma_for_rho(1.0, r), None), max_epochs=T)

    naive = rho / agg_for(rho).charge_weight()
    assert sigma_for_rho(1.0, naive) > 800                         # the regime where it shows
    old, old_report = run(naive)
    assert old.epoch < T, "the ρ/W plan should run out before T_max at this σ"
    unit = calibrate_unit_rho(rho, agg_for)
    assert unit < naive and unit / naive > 1 - 1e-8               # σ grows by < 10⁻⁸
    new, report = run(unit)
    assert new.epoch == T
    assert report["rho_worst_case"] <= report["rho_budget"] * (1 + 1e-12)
    # the charge the accountant saw is the closed form, and the bound covers it
    c = p.coefs(T) + new.rounding_ratio()
    exact = charged_total(new.unit_events(), float(c.sum()), float((c * c).sum()), T)
    assert report["rho_worst_case"] == pytest.approx(exact, rel=1e-9)
    assert exact <= new.charged_rho_bound() <= rho
    assert new.rho_per_document(T) == pytest.approx(exact, rel=1e-12)
    (e,) = new.unit_events()
    assert e.rho == pytest.approx((1.0 / e.sigma + ROUNDING_SLACK) ** 2 / 2, rel=1e-15)
