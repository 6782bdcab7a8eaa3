"""User-level unit (issue 16): weights that depend only on the user's own documents, attacked.

Each attack removes one whole user and measures the change of every block against its bound
(docs/privacy.md, "The user-level unit")."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

import streamdp
from streamdp.continual import EpochSketches
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.blt import default_params
from streamdp.privacy.epochs import EpochClock
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.user_bounding import (FIRST_K_SHARE, MissingUser, UserBounder,
                                            weight_schedule)
from streamdp.refinement import RefinementModel, RefinementSketch
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

D, KP = 40, 4
BLOCKS = ("count", "m1", "z", "s1", "s2", "s3")


def _subspace(seed=0):
    """A public orthonormal basis whose first column is word 0 (the attacker's word), so the
    attacker's whitened blocks keep their full norm: the worst case for the bounds."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((D, KP))
    A[:, 0] = 0.0
    A[0, 0] = 1.0
    A[0, 1:] = 0.0
    Q, _ = np.linalg.qr(A)
    return Subspace(Q)


def _corpus(n, seed=1):
    return sample_documents(make_lda_model(D, 3, seed=seed), n, mean_length=12, seed=seed)


def _attacker_docs(n):
    """n copies of the worst document for the tight blocks: one word three times (every block
    norm is maximal and all copies point the same way, so the triangle inequality is tight)."""
    return sp.csr_matrix((np.full(n, 3.0), (np.arange(n), np.zeros(n, dtype=int))), shape=(n, D))


def _block_change(a, b):
    return {k: float(np.linalg.norm(np.asarray(getattr(a, k)) - np.asarray(getattr(b, k))))
            for k in BLOCKS}


def _bounds(clip):
    s = block_sensitivities(clip)
    return {"count": s["count"], "m1": s["m1"], "s1": s["s1"], "z": s["z"], "s2": s["s2"],
            "s3": s["s3"]}


# ----------------------------------------------------------------------- the weights
@pytest.mark.parametrize("schedule", ["uniform", "decaying"])
def test_weight_schedule_sums_to_at_most_one_in_float(schedule):
    for M in list(range(1, 60)) + [97, 1000, 12345]:
        w = weight_schedule(schedule, M)
        assert w.shape == (M,) and np.all(w > 0)
        assert math.fsum(w) <= 1.0
        assert math.fsum(w) > 1 - 1e-12
        assert np.all(np.diff(w) <= 0)
    assert weight_schedule("decaying", 5)[0] > 0.6 > weight_schedule("uniform", 5)[0]
    with pytest.raises(ValueError, match="schedule"):
        weight_schedule("zipf", 3)


def test_bounder_caps_per_epoch_and_lifetime_in_arrival_order():
    b = UserBounder(max_docs_per_epoch=2, max_docs=3, key=b"k")
    users = ["a", "a", "a", "b", "a", "a", "a"]
    epochs = [1, 1, 1, 1, 2, 2, 3]
    w, r = b.assign(users, epochs)
    table = weight_schedule("uniform", 3)
    # a: epoch 1 keeps 2 (3rd dropped), epoch 2 keeps 1 more (lifetime 3), then nothing
    assert r.tolist() == [1, 2, 0, 1, 3, 0, 0]
    assert w.tolist() == [table[0], table[1], 0.0, table[0], table[2], 0.0, 0.0]
    # out of order: an earlier epoch after a later one still has its own per-epoch count
    b2 = UserBounder(max_docs_per_epoch=1, max_docs=10, key=b"k")
    _, r2 = b2.assign(["u"] * 5, [3, 1, 3, 2, 1])
    assert r2.tolist() == [1, 2, 0, 3, 0]


def test_weights_of_a_user_do_not_depend_on_other_users():
    """Brute force: every user's weight sequence is the same with or without any other user."""
    rng = np.random.default_rng(3)
    users = rng.integers(0, 30, 600).astype(str).tolist()
    epochs = np.sort(rng.integers(1, 6, 600))
    full = UserBounder(max_docs_per_epoch=3, max_docs=7, schedule="decaying", key=b"x")
    w_full, _ = full.assign(users, epochs)
    for removed in ("0", "7", "29"):
        keep = [i for i, u in enumerate(users) if u != removed]
        alone = UserBounder(max_docs_per_epoch=3, max_docs=7, schedule="decaying", key=b"x")
        w_alone, _ = alone.assign([users[i] for i in keep], epochs[keep])
        assert np.array_equal(w_alone, w_full[keep])
    for u in set(users):
        assert math.fsum(w_full[[i for i, v in enumerate(users) if v == u]]) <= 1.0


def test_first_k_admission_never_refuses_and_stores_only_the_first_k_users():
    """max_users = K: the first K distinct users are admitted (at half weight), a later user's
    documents get weight 0 and the user is not stored; nothing raises, nothing is evicted."""
    b = UserBounder(max_docs_per_epoch=2, max_docs=2, max_users=3, key=b"k")
    w, r = b.assign(["a", "b", "c", "a"])
    assert w.tolist() == [0.25, 0.25, 0.25, 0.25] and r.tolist() == [1, 1, 1, 2]
    w, r = b.assign(["d", "b", "e", "d"])           # d and e: past the first 3 users
    assert w.tolist() == [0.0, 0.25, 0.0, 0.0] and r.tolist() == [0, 2, 0, 0]
    assert b.n_users == 3 and b.not_admitted == 3
    assert b.last_admitted.tolist() == [False, True, False, False]
    assert b.to_dict()["users"] == UserBounder.from_dict(b.to_dict()).to_dict()["users"]
    assert UserBounder.from_dict(b.to_dict()).max_users == 3
    assert b.config()["weight_sum"] == FIRST_K_SHARE and "first-K" in b.config()["user_admission"]
    with pytest.raises(MissingUser):
        b.assign(["a", None])
    with pytest.raises(MissingUser):
        b.assign([""])
    # the default admits every user at full weight; its memory grows with the users
    everyone = UserBounder(max_docs_per_epoch=1, max_docs=1, key=b"k")
    w, _ = everyone.assign([f"u{i}" for i in range(5000)])
    assert everyone.max_users is None and np.all(w == 1.0) and everyone.n_users == 5000
    assert everyone.config()["user_admission"] == "all users"


def test_a_v1_bounder_state_reads_as_admit_all():
    """Checkpoints before first-K admission (v1) held a fail-closed memory cap: every user they
    stored was admitted at full weight. They restore as max_users=None, weights unchanged."""
    b = UserBounder(max_docs_per_epoch=2, max_docs=2, key=b"k")
    b.assign(["a", "b"])
    old = {**b.to_dict(), "v": 1, "max_users": 1_000_000}
    r = UserBounder.from_dict(old)
    assert r.max_users is None and r.share == 1.0
    assert r.assign(["a"])[0].tolist() == [0.5]
    with pytest.raises(ValueError, match="cannot change mid-stream"):
        r.check_compatible(max_docs_per_epoch=2, max_docs=2, schedule="uniform", max_users=10)


def test_first_k_displacement_moves_the_sums_by_at_most_the_bound_and_needs_the_halving():
    """The neighbouring pair of first-K admission: D has users u1…uK (K = max_users); D′ adds
    user p whose first document comes before uK's, so p is admitted and uK is displaced.
    The sums move by p's contribution minus uK's: ≤ Δ_b with the halved weights; and more
    than C_b/2 in a block where p and uK are orthogonal (s3, the binding block of these
    one-word documents: q_0 ⊥ q_1 in this subspace, so q_0^{⊗3} ⊥ q_1^{⊗3}), so without
    the halving (full weights) the same pair would move it by more than C_b — the sensitivity
    must double, which the factor 1/2 on every weight does."""
    K = 4
    clip = ClipBounds.for_length(6)
    # a public basis whose first two columns are words 0 and 1: p's word 0 and uK's word 1
    # keep their full whitened norms, in orthogonal directions
    A = np.random.default_rng(0).standard_normal((D, KP))
    A[:2, :] = 0.0
    A[:, :2] = 0.0
    A[0, 0] = A[1, 1] = 1.0
    sub = Subspace(np.linalg.qr(A)[0])
    bound = _bounds(clip)
    # user j: five documents of one word three times (aligned); uK's word is 1, never 0
    words = np.repeat([2 + j for j in range(K - 1)] + [1], 5)
    others = sp.csr_matrix((np.full(K * 5, 3.0), (np.arange(K * 5), words)), shape=(K * 5, D))
    users = [f"u{j}" for j in range(K) for _ in range(5)]
    p_docs = _attacker_docs(5)                           # word 0
    # D: u1…uK in order; D′: p's documents just before uK's first document
    first_uk = users.index(f"u{K - 1}")
    X_p = sp.vstack([others[:first_uk], p_docs, others[first_uk:]], format="csr")
    users_p = users[:first_uk] + ["p"] * 5 + users[first_uk:]
    changes = {}
    for share_off in (False, True):
        def sums(X, us):
            b = UserBounder(max_docs_per_epoch=5, max_docs=5, max_users=K, key=b"k")
            w, _ = b.assign(us)
            if share_off:
                w = w / FIRST_K_SHARE           # what first-K would give without the halving
            return WhitenedSketch(sub, clip).update(X, weights=w).sums(), b
        s_d, b_d = sums(others, users)
        s_dp, b_dp = sums(X_p, users_p)
        assert b_d.not_admitted == 0 and b_dp.not_admitted == 5      # uK displaced
        changes[share_off] = _block_change(s_dp, s_d)
    for k in BLOCKS:
        assert changes[False][k] <= bound[k], (k, changes[False][k], bound[k])
    # p (+C/2) and the displaced uK (−C/2), orthogonal: √2·C/2 ≈ 0.707 C_s3
    assert changes[False]["s3"] > 0.7 * clip.s3
    assert changes[True]["s3"] > 1.4 * clip.s3 > bound["s3"]   # full weights: over the bound


def test_epoch_expiry_keeps_lifetime_counts():
    b = UserBounder(max_docs_per_epoch=1, max_docs=2, key=b"k")
    b.assign(["a"], [1])
    b.close_through(1)
    assert b.to_dict()["users"][0][1:] == [1, []]
    w, r = b.assign(["a", "a", "a"], [2, 3, 4])
    assert r.tolist() == [2, 0, 0]


def test_restore_in_the_middle_of_a_users_documents_equals_a_clean_run():
    """Crash mid-user: the bounder state and the sketch (pending rows with their weights) are
    checkpointed and restored; the result is bit-identical to an uninterrupted run (no reset of
    the user's numbering to j = 1)."""
    X = _corpus(3000, seed=5)
    users = (["heavy"] * 1500 + [f"u{i % 200}" for i in range(1500)])
    order = np.random.default_rng(0).permutation(3000)
    X, users = X[order], [users[i] for i in order]
    sub, clip = _subspace(), ClipBounds.for_length(8)
    cfg = dict(max_docs_per_epoch=4, max_docs=6, schedule="decaying", key=b"key")

    clean_b, clean_s = UserBounder(**cfg), WhitenedSketch(sub, clip)
    w, _ = clean_b.assign(users)
    clean_s.update(X, weights=w)

    b, s = UserBounder(**cfg), WhitenedSketch(sub, clip)
    cut = 1234                                   # inside "heavy"'s documents
    w1, _ = b.assign(users[:cut])
    s.update(X[:cut], weights=w1)
    assert s.pending.n > 0 and np.any(s.pending_weights < 1)
    b = UserBounder.from_dict(b.to_dict())       # crash: restore both from their states
    s = WhitenedSketch.from_bytes(s.to_bytes(), sub)
    w2, _ = b.assign(users[cut:])
    s.update(X[cut:], weights=w2)
    assert np.array_equal(np.concatenate([w1, w2]), w)
    a, c = s.sums(), clean_s.sums()
    for k in BLOCKS:
        assert np.array_equal(np.asarray(getattr(a, k)), np.asarray(getattr(c, k))), k


# ------------------------------------------------------------------- the sketches
def test_weighted_sums_equal_brute_force_weighted_documents():
    """Σ_i w_i·(document i's clipped contribution), each document sketched alone."""
    X = _corpus(150, seed=2)
    sub, clip = _subspace(), ClipBounds.for_length(8)
    w = np.random.default_rng(1).random(150)
    w[::7] = 0.0
    s = WhitenedSketch(sub, clip).update(X, weights=w).sums()
    ref = None
    for i in range(150):
        one = WhitenedSketch(sub, clip).update(X[i]).sums()
        term = {k: w[i] * np.asarray(getattr(one, k), dtype=float) for k in BLOCKS}
        ref = term if ref is None else {k: ref[k] + term[k] for k in BLOCKS}
    for k in BLOCKS:
        np.testing.assert_allclose(np.asarray(getattr(s, k)), ref[k], rtol=1e-10, atol=1e-13)
    # weights of 1 are the unweighted sketch, bit for bit
    a = WhitenedSketch(sub, clip).update(X, weights=np.ones(150)).sums()
    b = WhitenedSketch(sub, clip).update(X).sums()
    for k in BLOCKS:
        assert np.array_equal(np.asarray(getattr(a, k)), np.asarray(getattr(b, k)))


@pytest.mark.parametrize("schedule", ["uniform", "decaying"])
def test_user_with_10000_documents_in_one_epoch_moves_each_block_by_at_most_its_bound(schedule):
    base = _corpus(2000, seed=4)
    base_users = [f"u{i % 300}" for i in range(2000)]
    attack = _attacker_docs(10_000)
    sub, clip = _subspace(), ClipBounds.for_length(6)
    bound = _bounds(clip)
    cfg = dict(max_docs_per_epoch=10, max_docs=10, schedule=schedule, key=b"k")
    # the attacker's documents interleaved with everyone else's
    X = sp.vstack([base, attack], format="csr")
    users = base_users + ["attacker"] * 10_000
    order = np.random.default_rng(2).permutation(X.shape[0])
    X, users = X[order], [users[i] for i in order]
    w, _ = UserBounder(**cfg).assign(users)
    with_u = WhitenedSketch(sub, clip).update(X, weights=w).sums()
    keep = np.array([u != "attacker" for u in users])
    w0, _ = UserBounder(**cfg).assign([u for u, k in zip(users, keep) if k])
    without = WhitenedSketch(sub, clip).update(X[keep], weights=w0).sums()
    change = _block_change(with_u, without)
    for k in BLOCKS:
        assert change[k] <= bound[k], (k, change[k], bound[k])
    # the attack reaches the bound of its binding block (s3 for this document): tight
    assert change["s3"] > 0.99 * clip.s3
    # without bounding the same attacker moves count by 10,000
    raw = WhitenedSketch(sub, clip).update(X).sums().count - WhitenedSketch(sub, clip).update(
        X[keep]).sums().count
    assert raw > 9000 * clip.s3        # each copy adds its clip factor, C_s3 / its e3 norm


def test_user_spread_over_every_epoch_and_out_of_order_blt_loss_within_one_document():
    """A user with documents in every epoch (arriving out of order across the open epochs):
    Σ_s ‖x'_s − x_s‖ ≤ Δ_b (the user's weights sum to ≤ 1), and the BLT's loss
    Σ_t (Σ_s c_{t−s}·‖x'_s − x_s‖/Δ_b)² stays below what the accountant charges for one
    document of epoch 1, Σ_{j<T} c_j² (docs/privacy.md, "The user-level unit")."""
    T = 16
    sub, clip = _subspace(), ClipBounds.for_length(6)
    bound = _bounds(clip)
    clock = EpochClock(stream_start=0.0, epoch_seconds=10.0)
    base = _corpus(1600, seed=6)
    base_ts = np.random.default_rng(0).uniform(0, 10 * T, 1600)
    base_users = [f"u{i % 100}" for i in range(1600)]
    n_att = 40 * T
    att = _attacker_docs(n_att)
    att_ts = np.random.default_rng(1).permutation(np.repeat(np.arange(T) * 10.0 + 5.0, 40))
    for schedule in ("uniform", "decaying"):
        cfg = dict(max_docs_per_epoch=3, max_docs=4 * T, schedule=schedule, key=b"k")

        # one arrival order; the neighbour is the same order without the attacker's rows
        X_all = sp.vstack([base, att], format="csr")
        ts_all = np.concatenate([base_ts, att_ts])
        users_all = base_users + ["att"] * n_att
        order = np.random.default_rng(7).permutation(X_all.shape[0])
        X_all, ts_all, users_all = X_all[order], ts_all[order], [users_all[i] for i in order]

        def run(with_attacker):
            keep = np.array([with_attacker or u != "att" for u in users_all])
            X, ts = X_all[keep], ts_all[keep]
            users = [u for u, k in zip(users_all, keep) if k]
            w, _ = UserBounder(**cfg).assign(users, clock.epochs(ts))
            es = EpochSketches(sub, clip, clock)
            for a in range(0, X.shape[0], 333):        # count-based batches
                es.add(X[a:a + 333], ts[a:a + 333], weights=w[a:a + 333])
            return {e: s.sketch for e, s in es.pop_through(T)}

        with_u, without = run(True), run(False)
        per_epoch = {k: np.array([_block_change(with_u[e], without[e])[k] for e in range(1, T + 1)])
                     for k in BLOCKS}
        c = default_params(T).coefs(T)
        for k in BLOCKS:
            assert per_epoch[k].sum() <= bound[k], (schedule, k)
            assert np.count_nonzero(per_epoch[k]) == T          # every epoch was touched
            r = per_epoch[k] / bound[k]
            loss = sum(sum(c[t - s] * r[s] for s in range(t + 1)) ** 2 for t in range(T))
            assert loss <= float(np.sum(c[:T] ** 2)) + 1e-12, (schedule, k)


def test_warmup_user_bounded_range_sum_and_histogram():
    base = _corpus(500, seed=8)
    att = _attacker_docs(10_000)
    X = sp.vstack([base, att], format="csr")
    users = [f"u{i % 50}" for i in range(500)] + ["att"] * 10_000

    def sketch(keep):
        b = UserBounder(max_docs_per_epoch=5, max_docs=5, key=b"k")
        Xk, uk = X[keep], [u for u, k in zip(users, keep) if k]
        w, r = b.assign(uk)
        return WarmupSketch(D, KP, clip=0.05, seed=0).update(Xk, weights=w, in_histogram=r == 1)

    full = sketch(np.ones(X.shape[0], bool))
    without = sketch(np.array([u != "att" for u in users]))
    cw = block_sensitivities(ClipBounds(m1=1, z=1, s3=1, warmup=0.05))["warmup"]
    change = np.linalg.norm(full.range_sum() - without.range_sum())
    assert 0.99 * 0.05 < change <= cw
    # the histogram counts each user's first warm-up document only: ≤ 1 per histogram
    dh = full.norm_hist - without.norm_hist
    assert np.all(dh.sum(axis=1) == 1) and np.all(dh >= 0)
    assert full.norm_hist[0].sum() == 51


def test_refinement_user_with_10000_documents_moves_T_by_at_most_one():
    model = make_lda_model(D, 3, seed=9)
    rm = RefinementModel(topic_word=model.topics, alpha=model.alpha, model_id="m")
    base = _corpus(300, seed=9)
    att = _attacker_docs(10_000)
    X = sp.vstack([base, att], format="csr")
    users = [f"u{i % 40}" for i in range(300)] + ["att"] * 10_000

    def total(keep):
        w, _ = UserBounder(max_docs_per_epoch=7, max_docs=7, key=b"k").assign(
            [u for u, k in zip(users, keep) if k])
        return RefinementSketch(3, D).update(X[keep], rm, weights=w).sums

    change = np.linalg.norm(total(np.ones(X.shape[0], bool))
                            - total(np.array([u != "att" for u in users])))
    # one attacker document alone moves T by ‖r‖ ≤ 1; 10,000 of them, weighted, by the same
    one = np.linalg.norm(RefinementSketch(3, D).update(att[:1], rm).sums)
    assert change <= 1.0 + 1e-9
    assert abs(change - one) < 1e-9


# ------------------------------------------------------------------- the estimator
def _fit_data(n=6000, seed=0):
    model = make_lda_model(200, 4, seed=seed)
    X = sample_documents(model, n, seed=seed)
    users = (np.random.default_rng(seed).zipf(1.8, n) % 1500).astype(str)
    ts = np.arange(n, dtype=float)
    return X, users, ts


def test_fit_user_mode_reports_the_unit_and_the_ledger_records_it():
    X, users, ts = _fit_data()
    ledger = MemoryLedger()
    acc = Accountant(4.0, 1e-6, ledger, unit="user")
    snap = streamdp.fit(X, 4, epsilon=4.0, timestamps=ts, stream_start=1500.0, seed=0,
                        sampler="fast", non_production=True, privacy_unit="user", users=users,
                        max_docs_per_user_epoch=5, accountant=acc, run_id="u")
    p = snap.privacy
    assert p["privacy_unit"] == "user" and p["neighbouring"] == "add/remove all documents of one user"
    assert p["user_bounding"]["max_docs_per_user_epoch"] == 5
    assert p["user_bounding"]["max_docs_per_user"] == 5
    assert p["accountant"]["unit"].startswith("one user")
    # warm-up charged to the stream partition (sequential composition): nothing on "warmup"
    assert p["accountant"]["rho_by_atom"]["warmup"] == 0.0
    assert p["accountant"]["rho_worst_case"] <= acc.rho_budget * (1 + 1e-12)
    assert p["accountant"]["rho_worst_case"] > 0.999 * acc.rho_budget
    events = [e for r in ledger.read() if r.kind in ("reserve", "commit")
              for e in r.payload["events"]]
    assert events and all(e["unit"] == "user" for e in events)
    assert any(e["block"] == "warmup" and e["partition"] == "stream" for e in events)
    budget = [r for r in ledger.read() if r.kind == "budget"][0]
    assert budget.payload["unit"].startswith("one user")
    assert snap.topic_word.shape == (4, 200)


def test_user_mode_refuses_what_it_cannot_bound():
    X, users, ts = _fit_data(800)
    with pytest.raises(ValueError, match="users="):
        streamdp.fit(X, 4, epsilon=4.0, timestamps=ts, stream_start=200.0,
                     privacy_unit="user", sampler="fast", non_production=True)
    with pytest.raises(ValueError, match="per-document boundary"):
        streamdp.fit(X, 4, epsilon=4.0, warmup_docs=200, privacy_unit="user", users=users)
    with pytest.raises(ValueError, match="unit='user'"):
        streamdp.StreamingSpectralLDA(4, epsilon=4.0, privacy_unit="user",
                                      accountant=Accountant(4.0, 1e-6, MemoryLedger()))
    with pytest.raises(ValueError, match="privacy_unit='user'"):
        streamdp.StreamingSpectralLDA(4, epsilon=4.0, max_docs_per_user_epoch=3)
    # a user-level ledger refuses document-level events
    from streamdp.privacy.events import GaussianEvent
    acc = Accountant(4.0, 1e-6, MemoryLedger(), unit="user")
    with pytest.raises(ValueError, match="protects users"):
        acc.reserve([GaussianEvent("z", 1.0, 1.0)])
    acc.reserve([GaussianEvent("z", 1.0, 2.0, unit="user")])
    est = streamdp.StreamingSpectralLDA(4, epsilon=4.0, privacy_unit="user", sampler="fast", non_production=True)
    with pytest.raises(ValueError, match="users="):
        est.warmup(X[:100])
    with pytest.raises(MissingUser):
        est.warmup(X[:2], users=["a", None])


@pytest.mark.parametrize("aggregator", ["blt", "tree"])
def test_continual_user_mode_within_budget_and_premise_covers_all_stream_documents(aggregator):
    """Continual release in user mode: every epoch's snapshot states the unit, the worst atom
    stays within ρ, and the float64 premise is checked, noised, on all stream documents released
    so far (a user's documents can sit in every epoch), at sensitivity M; over the premise an
    epoch is drawn from noise only, never refused (issue 23 item 2)."""
    X, users, _ = _fit_data(5000, seed=3)
    clock = EpochClock(stream_start=100.0, epoch_seconds=10.0)
    ts = np.sort(np.random.default_rng(0).uniform(100.0, 140.0, size=4000))

    def est(max_docs, stream=True):
        e = streamdp.StreamingSpectralLDA(
            4, epsilon=2.0, seed=0, sampler="fast", non_production=True, epochs=clock, horizon=4,
            continual_aggregator=aggregator, privacy_unit="user", max_docs_per_user_epoch=2,
            max_docs_per_user=6, max_documents_per_sum=max_docs)
        e.warmup(X[:1000], users=users[:1000])
        if stream:
            e.partial_fit(X[1000:], ts, users=users[1000:])
        return e

    e = est(10**9)
    snaps = e.close_epochs(140.0)
    assert len(snaps) == 4
    for s in snaps:
        assert s.privacy["privacy_unit"] == "user"
        assert s.privacy["accountant"]["rho_worst_case"] <= e.rho_ * (1 + 1e-12)
        check = s.privacy["premise_check"]
        assert check["sensitivity"] == 6.0 and check["epoch"]["partition"] == "stream"
        assert check["epoch"]["passed"]
    # a premise every epoch alone is within but all four together are not: its noised check
    # (σ_p ≫ the counts at this ε) draws every epoch from noise only, on schedule, no refusal
    n_epoch = max(sk.n_rows for sk in est(10**9)._epoch_sketches.open.values())
    premise = max(n_epoch, est(10**9, stream=False)._warmup.n_docs) + 1
    e2 = est(premise)
    assert premise < sum(sk.n_rows for sk in e2._epoch_sketches.open.values())
    snaps2 = e2.close_epochs(140.0)
    assert [s.epoch for s in snaps2] == [1, 2, 3, 4]
    assert not any(s.privacy["premise_check"]["epoch"]["passed"] for s in snaps2)
    assert e2.accountant.report()["delta_of_approximate_events_by_atom"]["stream_worst"] > 0


# ------------------------------------------------- the documents' optional user field
def test_document_user_field_round_trips_and_is_validated():
    from streamdp import messages
    raw = messages.encode_document("d1", 5.0, text="some words here", user="alice")
    doc = messages.decode_document(raw)
    assert doc.user == "alice" and "alice" not in repr(doc)
    assert messages.decode_document(messages.encode_document("d2", 5.0, tokens=["a"])).user is None
    base = {"v": 1, "id": "d", "ts": 1.0, "text": "x y z"}
    for bad, cls in ((1, messages.WRONG_TYPE), ("", messages.INVALID_VALUE),
                     ("u" * 257, messages.INVALID_VALUE), (b"alice", messages.INVALID_UTF8)):
        with pytest.raises(messages.InvalidMessage) as e:
            messages.validate_document({**base, "user": bad})
        assert e.value.error_class == cls


def test_produce_keys_documents_by_user_else_by_id(tmp_path):
    """`streamdp produce` uses the user as the Kafka key, so one partition holds all of a
    user's documents in their order (the user-level unit's numbering needs it)."""
    import json

    from streamdp import messages
    from streamdp.services.produce import Rejections, encoded_records, produce

    class FakeProducer:
        def __init__(self):
            self.sent = []

        def produce(self, topic, key, value, timestamp, on_delivery):
            self.sent.append((key, messages.decode_document(value).user))
            on_delivery(None, None)

        def poll(self, _t):
            return 0

        def flush(self, _t):
            return 0

    docs = [{"id": "a1", "ts": 1, "text": "one two three", "user": "alice"},
            {"id": "b1", "ts": 2, "text": "one two three"},
            {"id": "a2", "ts": 3, "text": "one two three", "user": 7}]
    p = FakeProducer()
    assert produce("unused:9092", "docs", docs, producer=p) == 3
    assert p.sent == [(b"alice", "alice"), (b"b1", None), (b"7", "7")]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in docs + [{"id": "x", "ts": 4, "text": "a b",
                                                             "user": ""}]) + "\n")
    rej = Rejections()
    p2 = FakeProducer()
    assert produce("unused:9092", "docs", encoded_records(path, rej), producer=p2) == 3
    assert [k for k, _ in p2.sent] == [b"alice", b"b1", b"7"]
    assert rej.count == 1 and "'user'" in rej.first[0]


def test_a_ledger_keeps_its_unit(tmp_path):
    """A file ledger created for documents refuses a user-level accountant and vice versa."""
    from streamdp.privacy.accountant import LedgerMismatch
    path = tmp_path / "ledger.jsonl"
    Accountant(4.0, 1e-6, path)
    with pytest.raises(LedgerMismatch, match="unit"):
        Accountant(4.0, 1e-6, path, unit="user")
    upath = tmp_path / "user-ledger.jsonl"
    Accountant(4.0, 1e-6, upath, unit="user")
    assert Accountant(4.0, 1e-6, upath, unit="user").report()["unit"].startswith("one user")
    with pytest.raises(LedgerMismatch, match="unit"):
        Accountant(4.0, 1e-6, upath)
