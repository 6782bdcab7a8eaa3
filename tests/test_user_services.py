"""The user-level unit in the services (issue 16): attack tests on the sketcher and the
deployment checks.

The sketcher runs for real (its ``step``/``process`` path, checkpoints, dead-letter policy)
over the fake Kafka clients of tests/sketcher_harness.py, so poll batches, crashes and
rebalances are placed exactly; the last tests run the whole pipeline on the embedded broker.

* a user with many documents, in one epoch or spread over epochs: the merged sums with and
  without the whole user differ by at most each block's bound (the partition's bounder weights
  the documents exactly as the estimator does);
* a document with no user, or read from a partition other than ``partition_for_user``: dead-
  lettered with its own class, nothing else changes (not even other users' numbering);
* a crash or a rebalance in the middle of a user's documents: identical sums and counters to a
  clean run;
* more users than ``max_users``: first-K admission, no hold; a user displacing the K-th moves
  the sums by ≤ Δ_b;
* a service configured with another unit, bounding or partition count: refused.
"""
from __future__ import annotations

import numpy as np
import pytest

from sketcher_harness import World, epoch_start, make_config, make_sketcher
from streamdp import messages
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.user_bounding import partition_for_user
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.services.config import ConfigError, check_privacy_mode
from streamdp.services.partition_state import PartitionState, state_key
from streamdp.whitening.subspace import Subspace

WORDS = [f"w{i}" for i in range(20)]
D, K, N_PARTITIONS = len(WORDS), 2, 2
BLOCKS = ("count", "m1", "z", "s1", "s2", "s3")
CLIP = ClipBounds.for_length(6)


def _subspace() -> Subspace:
    """Its first column is word 0 (the attacker's word): the attacker's whitened blocks keep
    their full norm, the worst case for the bounds."""
    A = np.random.default_rng(0).standard_normal((D, 3))
    A[:, 0] = 0.0
    A[0, 0] = 1.0
    A[0, 1:] = 0.0
    return Subspace(np.linalg.qr(A)[0])


def _users_on(partition: int, n: int, prefix: str) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        u = f"{prefix}{i}"
        if partition_for_user(u, N_PARTITIONS) == partition:
            out.append(u)
        i += 1
    return out


ATTACKER = _users_on(0, 1, "attacker-")[0]
OTHERS = _users_on(0, 60, "u")


def _doc(i: int, ts: float, tokens, user) -> tuple[bytes, float]:
    kw = {} if user is None else {"user": user}
    return messages.encode_document(f"doc-{i}", ts, tokens=list(tokens), **kw), ts


def _feed(rng, *, n_others: int, n_attacker: int, epochs=(3,), attacker=ATTACKER):
    """(value, ts, user) in timestamp order: others' documents over words w1…w19, the
    attacker's n documents of the maximal word w0 three times, spread evenly over ``epochs``
    and interleaved with everyone else's."""
    rows = []
    for j in range(n_others):
        e = epochs[j % len(epochs)]
        toks = rng.choice(WORDS[1:], size=int(rng.integers(3, 9))).tolist()
        rows.append((epoch_start(e) + 1.0 + 3000.0 * rng.random(), toks, OTHERS[j % len(OTHERS)]))
    for j in range(n_attacker):
        e = epochs[j % len(epochs)]
        rows.append((epoch_start(e) + 1.0 + 3000.0 * rng.random(), ["w0"] * 3, attacker))
    rows.sort(key=lambda r: r[0])
    return [(_doc(i, ts, toks, u), u) for i, (ts, toks, u) in enumerate(rows)]


def _config(tmp_path, **changes):
    values = dict(epsilon=1.0, non_private=False, privacy_unit="user",
                  max_docs_per_user_epoch=5, max_docs_per_user=5, refinement=True,
                  refinement_model_lag=2, batch_size=97)
    values.update(changes)
    return make_config(tmp_path, WORDS, K, **values)


def _world(cfg) -> World:
    world = World(cfg, _subspace())
    # epochs 1 and 2 are released: documents of epoch 3 (4) fold into the model of epoch 1 (2)
    phi = np.full((K, D), 1.0 / D)
    world.release(1, phi, np.ones(K))
    world.release(2, phi, np.ones(K))
    return world


def _sketcher(world, monkeypatch, restore: bytes | None = None, batch_size: int | None = None):
    """The harness's sketcher in user mode: the partition count checked and the partition's
    bounders bound as ``Sketcher._on_assign`` does; clip bounds of a private deployment."""
    from streamdp.services import sketcher as mod
    monkeypatch.setattr(mod, "documents_partition_count", lambda cfg: N_PARTITIONS)
    if batch_size is not None:
        world.cfg = world.cfg.replace(batch_size=batch_size)
    sk = make_sketcher(world, monkeypatch, restore=restore)
    sk.clip = CLIP
    sk.states[0].bind_users(sk.cfg.user_bounder, warmup_open=False)
    dead = sk.dead_lettered = []
    # the one dead-letter path (the stream processor's, or the sketcher's before the split)
    owner = getattr(sk, "processor", sk)
    name = "dead_letter" if hasattr(owner, "dead_letter") else "_dead_letter"
    real = getattr(owner, name)

    def record(m, exc):
        dead.append((m.offset(), exc.error_class))
        real(m, exc)
    setattr(owner, name, record)
    return sk


def _drive(sk, world, until: int | None = None) -> None:
    end = len(world.messages) if until is None else until
    steps = 0
    while sk.consumer.pos < end or (until is None and sk.paused):
        sk.step()
        steps += 1
        assert steps < 10_000, f"stuck at {sk.consumer.pos} (held {sk.paused})"


def _run(tmp_path, monkeypatch, feed, **changes):
    cfg = _config(tmp_path, **changes)
    world = _world(cfg)
    world.add_documents(v for v, _ in feed)
    sk = _sketcher(world, monkeypatch)
    _drive(sk, world)
    return sk, world


def _change(a: PartitionState, b: PartitionState) -> dict:
    """Σ over epochs of each block's change, and of the refinement sums' change."""
    out = dict.fromkeys(BLOCKS + ("topic_word",), 0.0)
    for e in set(a.epochs) | set(b.epochs):
        sa, sb = a.epochs[e].sums(), b.epochs[e].sums()
        for k in BLOCKS:
            out[k] += float(np.linalg.norm(np.asarray(getattr(sa, k)) - np.asarray(getattr(sb, k))))
        out["topic_word"] += float(np.linalg.norm(a.refine[e].sums - b.refine[e].sums))
    return out


def _same_sums(a: PartitionState, b: PartitionState) -> None:
    assert sorted(a.epochs) == sorted(b.epochs) and sorted(a.refine) == sorted(b.refine)
    for e in a.epochs:
        sa, sb = a.epochs[e].sums(), b.epochs[e].sums()
        for k in BLOCKS:
            np.testing.assert_array_equal(getattr(sa, k), getattr(sb, k))
        np.testing.assert_array_equal(a.refine[e].sums, b.refine[e].sums)
    # every user's counters (the hash keys are random per run: compare the counts)
    def counts(st):
        return sorted((t, tuple(map(tuple, c))) for _, t, c in st.users_stream.to_dict()["users"])
    assert counts(a) == counts(b) and a.users_expired_through == b.users_expired_through


# ------------------------------------------------------------------ removing a whole user
@pytest.mark.parametrize("epochs,weights", [((3,), "uniform"), ((3, 4), "decaying")],
                         ids=["one-epoch", "spread-over-epochs"])
def test_removing_a_heavy_user_moves_the_merged_sums_by_at_most_the_block_bounds(
        tmp_path, monkeypatch, epochs, weights):
    """D = others + one user with 3,000 maximal documents (in one epoch, or spread over two
    with m = 2 per epoch, M = 4 in all); D′ = D without that user. Summed over the epochs,
    each block moves by ≤ Δ_b, the refinement sums by ≤ their bound, and the binding block
    moves by nearly C_b (the bound is reached: the user is at weight 1)."""
    rng = np.random.default_rng(1)
    m, M = (5, 5) if len(epochs) == 1 else (2, 4)
    full = _feed(rng, n_others=600, n_attacker=3000, epochs=epochs)
    without = [(v, u) for v, u in full if u != ATTACKER]
    kw = dict(max_docs_per_user_epoch=m, max_docs_per_user=M, user_weights=weights)
    a, _ = _run(tmp_path / "a", monkeypatch, full, **kw)
    b, _ = _run(tmp_path / "b", monkeypatch, without, **kw)
    change = _change(a.states[0], b.states[0])
    bound = block_sensitivities(CLIP)
    for k in BLOCKS + ("topic_word",):
        assert change[k] <= bound[k], (k, change[k], bound[k])
    assert change["s3"] > 0.99 * CLIP.s3          # the user's weights sum to exactly 1
    # the attack is real: unbounded, 3,000 documents would move the count by ~3,000 C_count
    assert a.states[0].counters["documents"] - b.states[0].counters["documents"] == 3000


def test_a_user_split_across_partitions_would_double_its_weight():
    """Why the partition rule is checked: each partition's bounder numbers a user afresh, so a
    user read on two partitions gets two weight sequences (total 2, twice the bound)."""
    cfg = dict(max_docs_per_epoch=5, max_docs=5)
    from streamdp.privacy.user_bounding import UserBounder
    w0, _ = UserBounder(**cfg).assign(["x"] * 5, [3] * 5)
    w1, _ = UserBounder(**cfg).assign(["x"] * 5, [3] * 5)
    assert abs(w0.sum() + w1.sum() - 2.0) < 1e-12
    # the rule sends every document of a user to one partition, for every partition count
    for n in (1, 2, 3, 12):
        assert len({partition_for_user("x", n) for _ in range(3)}) == 1
        assert all(0 <= partition_for_user(f"u{i}", n) < n for i in range(200))


# ------------------------------------------------------------------ dead-lettered documents
def test_no_user_and_wrong_partition_are_dead_lettered_and_nothing_else_changes(
        tmp_path, monkeypatch):
    """A document without a user (missing_user) and one whose user belongs on partition 1
    (user_partition_mismatch) go to the DLQ; the sums and every user's numbering equal a run
    without those two documents."""
    rng = np.random.default_rng(2)
    feed = _feed(rng, n_others=300, n_attacker=40, epochs=(3, 4))
    stranger = _users_on(1, 1, "elsewhere-")[0]
    t_mid = messages.decode_document(feed[150][0][0]).ts
    bad = [(_doc(10_001, t_mid, ["w0"] * 3, None), None),
           (_doc(10_002, t_mid, ["w0"] * 3, stranger), stranger)]
    with_bad = feed[:150] + bad + feed[150:]
    a, _ = _run(tmp_path / "a", monkeypatch, with_bad)
    b, _ = _run(tmp_path / "b", monkeypatch, feed)
    assert sorted(a.dead_lettered) == [(150, messages.MISSING_USER),
                                       (151, messages.USER_PARTITION_MISMATCH)]
    assert b.dead_lettered == []
    _same_sums(a.states[0], b.states[0])
    assert a.states[0].counters["dlq"] == 2
    assert a.states[0].counters["documents"] == b.states[0].counters["documents"]


# ------------------------------------------------------------------ crash and rebalance
def _clean_and_interrupted(tmp_path, monkeypatch, *, how: str):
    rng = np.random.default_rng(3)
    feed = _feed(rng, n_others=500, n_attacker=1500, epochs=(3, 4))
    clean, _ = _run(tmp_path / "clean", monkeypatch, feed, batch_size=97)
    cfg = _config(tmp_path / "cut", batch_size=41)
    world = _world(cfg)
    world.add_documents(v for v, _ in feed)
    first = _sketcher(world, monkeypatch, batch_size=41)
    mid = len(feed) // 2                         # in the middle of the attacker's documents
    assert sum(u == ATTACKER for _, u in feed[:mid]) > 500
    _drive(first, world, until=mid)
    if how == "crash":
        payload = first.states[0].to_bytes()     # the last checkpoint ...
        _drive(first, world, until=mid + 300)    # ... then work that dies with the process
    else:
        first.consumer.incremental_unassign = lambda parts: None   # (the fake has no such call)
        first._on_revoke(first.consumer, [_TP(0)])   # revoke: checkpoint, hand over
        payload = world.store.read_latest(state_key("rr.documents", 0)).payload
        assert 0 not in first.states
    second = _sketcher(world, monkeypatch, restore=payload, batch_size=13)
    _drive(second, world)
    return clean.states[0], second.states[0]


class _TP:
    def __init__(self, partition: int):
        self.topic, self.partition = "rr.documents", partition


@pytest.mark.parametrize("how", ["crash", "rebalance"])
def test_crash_or_rebalance_in_the_middle_of_a_users_documents_equals_a_clean_run(
        tmp_path, monkeypatch, how):
    """Restored from the checkpoint (after a crash: the work since is lost and re-read; after a
    revoke: the new owner), with other poll batch sizes: the same weights for every document,
    so bit-identical sums, refinement sums and counters."""
    clean, resumed = _clean_and_interrupted(tmp_path, monkeypatch, how=how)
    _same_sums(clean, resumed)
    assert clean.counters["documents"] == resumed.counters["documents"]


def test_more_users_than_max_users_never_hold_and_a_displacing_user_moves_sums_within_bound(
        tmp_path, monkeypatch):
    """max_users = 20 of 60 users on the partition (first-K admission, issue 23 item 2).
    Before: the 21st user raised UserCapacityExceeded and held the partition for good. Now:
    nothing holds or raises, the whole log is read, users past the first 20 count on operator
    metrics only (skipped{reason="user_not_admitted"}, tracked users = 20), and the neighbour
    D′ = D + one user whose first document comes before the 20th user's (so that user is
    displaced) moves the merged sums by ≤ Δ_b per block — the halved weights cover the user
    and the displaced one."""
    rng = np.random.default_rng(4)
    full = _feed(rng, n_others=400, n_attacker=100, epochs=(3,))
    without = [(v, u) for v, u in full if u != ATTACKER]
    order = list(dict.fromkeys(u for _, u in full))
    assert order.index(ATTACKER) < 20          # the attacker is admitted and displaces one
    a, _ = _run(tmp_path / "a", monkeypatch, full, max_users=20)
    b, _ = _run(tmp_path / "b", monkeypatch, without, max_users=20)
    for sk in (a, b):
        assert sk.paused == {} and sk.dead_lettered == []
        assert sk.states[0].users_stream.n_users == 20
        assert sk.metrics.registry.get_sample_value(
            "streamdp_tracked_users", {"partition": "0"}) == 20.0
        assert sk.metrics.registry.get_sample_value(
            "streamdp_documents_skipped_total", {"reason": "user_not_admitted"}) > 0
    change = _change(a.states[0], b.states[0])
    bound = block_sensitivities(CLIP)
    for k in BLOCKS + ("topic_word",):
        assert change[k] <= bound[k], (k, change[k], bound[k])
    # the attacker's half weight reaches half its binding block's bound (and more with the
    # displaced user's contribution)
    assert change["s3"] > 0.49 * CLIP.s3


def test_a_restored_partition_keeps_its_bounding(tmp_path, monkeypatch):
    """A checkpoint made with m = 5 is refused by a sketcher configured with m = 3."""
    rng = np.random.default_rng(5)
    sk, world = _run(tmp_path, monkeypatch, _feed(rng, n_others=50, n_attacker=10))
    payload = sk.states[0].to_bytes()
    st = PartitionState.from_bytes(payload, world.subspace)
    with pytest.raises(ValueError, match="cannot change mid-stream"):
        st.bind_users(world.cfg.replace(max_docs_per_user_epoch=3, max_docs_per_user=3).user_bounder,
                      warmup_open=False)


def test_per_epoch_counts_expire_once_the_partition_passed_the_epoch(tmp_path, monkeypatch):
    rng = np.random.default_rng(6)
    sk, _ = _run(tmp_path, monkeypatch, _feed(rng, n_others=200, n_attacker=20, epochs=(3, 4)))
    st = sk.states[0]
    assert st.users_expired_through == 3          # progress is inside epoch 4
    assert all({e for e, _ in c} <= {4} for _, _, c in st.users_stream.to_dict()["users"])


# ------------------------------------------------------------------ the deployment's unit
class _Store:
    def __init__(self):
        from streamdp.kafka.state_store import StateRecord
        self.records, self._rec = {}, StateRecord

    def read_latest(self, key):
        return self.records.get(key)

    def write(self, key, payload, meta=None):
        self.records[key] = self._rec(payload, dict(meta or {}), 0)


def test_a_service_with_another_unit_bounding_or_partition_count_is_refused(tmp_path):
    user = _config(tmp_path)
    store = _Store()
    check_privacy_mode(user, store, role="sketcher", document_partitions=2)   # records it
    check_privacy_mode(user, store, role="release", document_partitions=2)
    doc = user.replace(privacy_unit="document", max_docs_per_user_epoch=None,
                       max_docs_per_user=None)
    for cfg, n, match in [(doc, None, "privacy_unit 'user'"),
                          (user, 3, "has 3 partitions"),
                          (user.replace(max_docs_per_user=7), 2, "max_docs_per_user"),
                          (user.replace(user_weights="decaying"), 2, "user_weights"),
                          # the admission rule is fixed too (null = all users, K = first-K)
                          (user.replace(max_users=50), 2, "'max_users'")]:
        for role in ("release", "sketcher"):
            with pytest.raises(ConfigError, match=match):
                check_privacy_mode(cfg, store, role=role, document_partitions=n)
    # a marker from before first-K admission (no max_users) reads as null: every user
    old = _Store()
    old.write("deployment/privacy", b"", meta={k: v for k, v in store.read_latest(
        "deployment/privacy").meta.items() if k != "max_users"})
    check_privacy_mode(user, old, role="release", document_partitions=2)
    with pytest.raises(ConfigError, match="'max_users'"):
        check_privacy_mode(user.replace(max_users=1_000_000), old, role="sketcher",
                           document_partitions=2)
    # and the other way round: a document-level deployment refuses a user-level service
    store2 = _Store()
    check_privacy_mode(doc, store2, role="release")
    with pytest.raises(ConfigError, match="privacy_unit 'document'"):
        check_privacy_mode(user, store2, role="sketcher", document_partitions=2)


def test_user_mode_configuration_is_validated_at_start_up(tmp_path):
    from streamdp.services.config import ServiceConfig, from_mapping
    for bad, match in [(dict(privacy_unit="person"), "privacy_unit"),
                       (dict(max_docs_per_user_epoch=3), "privacy_unit is 'document'"),
                       (dict(privacy_unit="user", max_docs_per_user=0), "max_docs_per_user"),
                       (dict(privacy_unit="user", user_weights="linear"), "user_weights"),
                       (dict(privacy_unit="user", max_users=0), "max_users"),
                       (dict(privacy_unit="user", warmup_share=1.0), "warmup_share"),
                       (dict(privacy_unit="user", epsilon=None, non_private=True), "non-private"),
                       (dict(privacy_unit="user", vocabulary_mode="public",
                             vocabulary=""), "user-level vocabulary selection")]:
        if "vocabulary_mode" in bad:
            bad = {**bad, "vocabulary_mode": "private", "selection_end": -10.0}
        with pytest.raises(ConfigError, match=match):
            ServiceConfig(**bad)
    with pytest.raises(ConfigError, match="STREAMDP_PRIVACY_UNIT is set but blank"):
        from_mapping({}, env={"STREAMDP_PRIVACY_UNIT": " "})
    cfg = from_mapping({}, env={"STREAMDP_PRIVACY_UNIT": "user",
                                "STREAMDP_MAX_DOCS_PER_USER_EPOCH": "3"})
    assert cfg.user_bounds == (3, 3) and cfg.user_bounding_report()["max_docs_per_user"] == 3
    assert cfg.max_users is None and cfg.user_bounding_report()["user_admission"] == "all users"
    cfg = from_mapping({}, env={"STREAMDP_PRIVACY_UNIT": "user", "STREAMDP_MAX_USERS": "1000"})
    assert cfg.max_users == 1000 and "first-K" in cfg.user_bounding_report()["user_admission"]


# ------------------------------------------------------------------ the pipeline, end to end
def test_user_mode_pipeline_end_to_end_and_a_restart_with_another_unit_is_refused(
        kafka_broker, tmp_path):
    """Two sketchers and the release service on the embedded broker, privacy_unit: user.
    Documents carry Zipf-distributed users and go through ``produce(user_partitions=...)``;
    one document without a user and one on the wrong partition are dead-lettered with their
    classes. The snapshot, the ledger and the accountant say unit = user; the warm-up is
    charged to the stream partition (no separate warm-up atom). Restarting either service with
    privacy_unit: document is refused."""
    from confluent_kafka import Producer

    from service_helpers import (Pipeline, fresh_topics, make_config as svc_config, make_corpus,
                                 read_topic, send_control)
    from streamdp.kafka.topics import client_config
    from streamdp.privacy.ledger import FileLedger
    from streamdp.services.demo_corpus import zipf_users
    from streamdp.services.produce import produce
    from streamdp.services.release import ReleaseService
    from streamdp.services.sketcher import Sketcher

    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(1500, 3000, 2, seed=3)
    names = fresh_topics(bootstrap)                  # 2 partitions
    cfg = svc_config(tmp_path, bootstrap, names, corpus, epsilon=2.0, sampler="fast",
                     noise_seed=5, privacy_unit="user", max_docs_per_user_epoch=3,
                     max_docs_per_user=6, user_weights="decaying")
    users = zipf_users(len(corpus.texts), seed=1)
    records = [{**corpus.record(i), "user": users[i]} for i in range(len(corpus.texts))]
    pipe = Pipeline(cfg, sketchers=2)
    try:
        pipe.start()
        produce(bootstrap, names.documents, records, user_partitions=2)
        ts = float(corpus.ts[corpus.n_warm + 10])
        stranger = _users_on(1, 1, "stranger-")[0]
        p = Producer(client_config(bootstrap, "producer"))
        for key, doc, part in [("no-user", messages.encode_document("x1", ts, text="goal match team"), 0),
                               ("wrong-part", messages.encode_document(
                                   "x2", ts, text="goal match team", user=stranger), 0)]:
            p.produce(names.documents, key=key.encode(), value=doc, partition=part,
                      timestamp=int(ts * 1000))
        assert p.flush(10) == 0
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        last = pipe.wait_released(corpus.epochs, timeout=120)
    finally:
        pipe.stop()

    dlq = {r.key.decode(): r.headers["streamdp.error.class"].decode()
           for r in read_topic(bootstrap, names.dlq)}
    assert dlq == {"no-user": messages.MISSING_USER, "wrong-part": messages.USER_PARTITION_MISMATCH}

    pr = last.privacy
    assert pr["privacy_unit"] == "user" and pr["neighbouring"] == "add/remove all documents of one user"
    ub = pr["user_bounding"]
    assert (ub["max_docs_per_user_epoch"], ub["max_docs_per_user"], ub["weights"]) == (3, 6, "decaying")
    assert ub["weight_sum"] <= 1.0 and ub["warmup_share"] == 0.25
    # the warm-up's draws are charged to the stream partition (sequential composition) ...
    assert pr["warmup"] and all(e["partition"] == "stream" for e in pr["warmup"])
    acc = pr["accountant"]
    assert acc["unit"].startswith("one user") and "warmup" not in {k for k, v in acc["rho_by_atom"].items() if v}
    assert acc["rho_worst_case"] <= acc["rho_budget"] * (1 + 1e-9)
    # ... with warmup_share of ρ (the range finder: all but the clip histogram's share)
    warm_rho = sum(e["rho"] for e in pr["warmup"])
    # ... and its noised premise check (PREMISE_SHARE of the range finder's, sensitivity M)
    assert pr["warmup_premise_check"]["sensitivity"] == cfg.user_bounds[1]
    warm_rho += pr["warmup_premise_check"]["rho"]
    assert warm_rho == pytest.approx(0.25 * (1 - cfg.clip_budget_share) * acc["rho_budget"],
                                     rel=1e-9)
    recs = FileLedger(cfg.ledger).read()
    assert recs[0].kind == "budget" and recs[0].payload["unit"].startswith("one user")
    reserved = [r for r in recs if r.kind == "reserve"]
    assert reserved and all(e["unit"] == "user" for r in reserved for e in r.payload["events"])
    # weighted: the noised count is far below the 3,000 stream documents (each user ≤ 1)
    assert last.n_docs < 0.8 * corpus.n_stream

    doc_cfg = cfg.replace(privacy_unit="document", max_docs_per_user_epoch=None,
                          max_docs_per_user=None, user_weights="uniform")
    with pytest.raises(ConfigError, match="privacy_unit|unit"):
        ReleaseService(doc_cfg)
    with pytest.raises(ConfigError, match="privacy_unit.*'user'"):   # the deployment contract
        Sketcher(doc_cfg)
    with pytest.raises(ConfigError, match="max_docs_per_user_epoch"):
        Sketcher(cfg.replace(max_docs_per_user_epoch=4))
