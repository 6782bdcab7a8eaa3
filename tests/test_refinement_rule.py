"""The public refinement-model rule (issue 15, docs/privacy.md §The refinement model rule).

A stream document of epoch e is folded into the snapshot of epoch e − L
(:func:`streamdp.refinement.model_epoch_for`), decided once e − L is closed; until then its
partition is held. Before the rule, a sketcher folded every document into the newest model it
had read, switching between two poll batches: adding one document shifted the later batch
boundaries, moved another document across a model switch, and the refinement sums of the two
neighbouring runs differed by more than the accounted sensitivity 1.

These run the real sketcher path (``Sketcher.step`` → ``process`` → ``PartitionState.add``,
control messages, the release state record) over fake Kafka clients
(tests/sketcher_harness.py), so poll batches and the arrival of releases are placed exactly.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from streamdp import messages
from streamdp.moments.clipping import ClipBounds
from streamdp.continual import EpochSketches
from streamdp.refinement import (FoldInModels, ModelNotDecided, RefinementConfig, RefinementModel,
                                 RefinementSketch, epoch_refined, model_epoch_for)
from streamdp.services.config import ConfigError
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary
from streamdp.whitening.subspace import Subspace

from sketcher_harness import World, clock, epoch_start, make_config, make_sketcher

WORDS = [f"w{i}" for i in range(20)]
D, K = len(WORDS), 2
ALPHA = np.ones(K)


def _subspace() -> Subspace:
    return Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal((D, 3)))[0])


def _peaked(first: int, second: int) -> np.ndarray:
    """Topic 0 puts 0.9 on word ``first``, topic 1 on word ``second``; the rest uniform."""
    phi = np.full((K, D), 0.1 / (D - 1))
    phi[0, first], phi[1, second] = 0.9, 0.9
    phi[0, second] = phi[1, first] = 0.1 / (D - 1)
    return phi / phi.sum(axis=1, keepdims=True)


def _doc(i: int, ts: float, tokens: list[str]) -> tuple[bytes, float]:
    return messages.encode_document(f"doc-{i}", ts, tokens=tokens), ts


def _filler(rng, n: int, e: int, start: int = 0) -> list[tuple[bytes, float]]:
    """n distinct documents of epoch e (words w2 … w19), in timestamp order."""
    ts = np.sort(epoch_start(e) + 1.0 + rng.random(n) * 3000.0)
    out, seen = [], set()
    for j in range(n):
        while True:
            toks = sorted(rng.choice(WORDS[2:], size=int(rng.integers(3, 9))).tolist())
            if tuple(toks) not in seen:
                seen.add(tuple(toks))
                break
        out.append(_doc(start + j, float(ts[j]), toks))
    return out


def _counts(docs, tmp_vocab=WORDS):
    decoded = [messages.decode_document(v) for v, _ in docs]
    cb = messages.documents_to_counts(decoded, Tokenizer(), Vocabulary(tmp_vocab))
    assert not cb.errors
    return cb.counts


def _row_key(X, i):
    a, b = X.indptr[i], X.indptr[i + 1]
    return tuple(X.indices[a:b].tolist()), tuple(X.data[a:b].tolist())


def _record_folds(monkeypatch) -> list:
    """Every (document, model) pair the sketcher folds, in order."""
    log = []
    orig = RefinementSketch.update

    def update(self, X, model):
        X = X.tocsr()
        for i in range(X.shape[0]):
            log.append((_row_key(X, i), model.model_id))
        return orig(self, X, model)
    monkeypatch.setattr(RefinementSketch, "update", update)
    return log


def _drive(sk, world, *, releases: dict, max_steps: int = 5000) -> int:
    """Step the sketcher until every record is consumed and nothing is held; ``releases``
    maps a step number to the release made right after that step (epoch, Φ, stage)."""
    steps = 0
    while sk.consumer.pos < len(world.messages) or sk.paused:
        sk.step()
        steps += 1
        if steps in releases:
            world.release(*releases[steps])
        assert steps < max_steps, f"stuck: held {sk.paused}, position {sk.consumer.pos}"
    sk.step()                      # apply any last control message
    return steps


# ------------------------------------------------------------------ the rule itself
def test_the_rule_is_a_function_of_the_epoch_and_the_lag():
    assert [model_epoch_for(e, 2) for e in range(1, 6)] == [None, None, 1, 2, 3]
    assert [model_epoch_for(e, 1) for e in range(1, 4)] == [None, 1, 2]
    assert [epoch_refined(e, 3) for e in range(1, 6)] == [False, False, False, True, True]
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="lag"):
            model_epoch_for(5, bad)
        with pytest.raises(ValueError, match="lag"):
            RefinementConfig(model_lag=bad)
    assert RefinementConfig().model_lag == 2 and RefinementConfig().to_dict()["model_lag"] == 2
    fm = FoldInModels(2)
    assert fm.decided(1) and fm.decided(2) and fm.model_for(2) is None
    assert not fm.decided(3)
    with pytest.raises(ModelNotDecided, match="epoch 1"):
        fm.model_for(3)
    for e in (1, 2, 3, 4):
        fm.released(RefinementModel(_peaked(0, 1), ALPHA, f"r{e}", epoch=e))
    # closed through 4: on-time documents are of epochs >= 5, needing models 3 and 4 only
    assert sorted(fm.models) == [3, 4] and fm.model_for(6).model_id == "r4"
    # a closed epoch whose model was never kept (a pre-rule release state): no term, not a hold
    old = FoldInModels(2)
    old.released(RefinementModel(_peaked(0, 1), ALPHA, "r7", epoch=7))
    assert old.decided(8) and old.model_for(8) is None and old.model_for(9).model_id == "r7"


def test_service_config_validates_the_lag(tmp_path):
    cfg = make_config(tmp_path, WORDS, K)
    assert cfg.refinement_config().model_lag == 2
    with pytest.raises(ConfigError, match="refinement_model_lag"):
        make_config(tmp_path, WORDS, K, refinement_model_lag=0)
    # a hold must always end: (L - 1) x epoch_seconds >= lateness + max_future_seconds
    with pytest.raises(ConfigError, match="refinement_model_lag.*at least 3"):
        make_config(tmp_path, WORDS, K, non_production=False, non_private=False, epsilon=1.0,
                    control_key_file="", lateness=3400.0)
    make_config(tmp_path, WORDS, K, non_production=False, non_private=False, epsilon=1.0,
                lateness=3400.0, refinement_model_lag=3)
    make_config(tmp_path, WORDS, K, non_production=False, non_private=False, epsilon=1.0,
                lateness=3400.0, refinement=False)         # no refinement: no hold


# ------------------------------------------------------------------ 1. the attack
def _old_rule_sums(docs, batch: int, switch_after: int, models) -> dict:
    """What the pre-rule sketcher computed: each poll batch folded into the newest model it had
    read; the release read after poll ``switch_after`` applies from the next batch on."""
    X = _counts(docs)
    ep = clock().epochs(np.array([ts for _, ts in docs]))
    out = {}
    for b, a in enumerate(range(0, len(docs), batch)):
        model = models[0] if b < switch_after else models[1]
        for e in np.unique(ep[a:a + batch]):
            rows = a + np.flatnonzero(ep[a:a + batch] == e)
            out.setdefault(int(e), RefinementSketch(K, D)).update(X[rows], model)
    return {e: rs.total()[0] for e, rs in out.items()}


def test_one_added_document_changes_no_other_documents_refinement_term(tmp_path, monkeypatch):
    """Neighbouring runs D and D + x, poll batches of 5 records, snapshot 2 released (a very
    different model) after the 4th poll in both: every document other than x is folded into
    the same model in both runs, the refinement sums differ by x's own term only (norm <= 1).
    Under the old newest-model rule the same runs differ by sqrt(3) > 1."""
    rng = np.random.default_rng(5)
    batch, release_after = 5, 4
    A, B = _peaked(0, 1), _peaked(1, 0)         # B: the same words, the topics swapped
    e3 = _filler(rng, 40, 3)
    e4 = _filler(rng, 20, 4, start=100)
    # the document the switch lands on: the last one read before it in D; one word, which
    # A gives to topic 0 and B to topic 1 (its term moves by sqrt(2) between the models)
    switch_pos = (release_after + 1) * batch - 1        # the release is read after poll 5
    e3[switch_pos] = _doc(999, e3[switch_pos][1], ["w0", "w0", "w0"])
    x = _doc(1000, e3[0][1] - 0.5, ["w1", "w1", "w1"])   # the added document, epoch 3
    runs = {}
    for name, docs in (("D", e3 + e4), ("D+x", [x] + e3 + e4)):
        cfg = make_config(tmp_path / name, WORDS, K, batch_size=batch)
        world = World(cfg, _subspace())
        world.release(1, A, ALPHA)                      # closed through 1 before the stream
        world.add_documents(docs)
        log = _record_folds(monkeypatch)
        sk = make_sketcher(world, monkeypatch)
        _drive(sk, world, releases={release_after: (2, B, ALPHA)})
        st = sk.states[0]
        assert st.next_offset == len(docs) and not sk.paused
        assert st.epochs[3].n_docs == 40 + (name == "D+x") and st.epochs[4].n_docs == 20
        runs[name] = ({e: st.refine[e].total()[0] for e in (3, 4)}, dict(log), log)
        monkeypatch.undo()

    (T, folds, log), (Tx, folds_x, log_x) = runs["D"], runs["D+x"]
    x_key = _row_key(_counts([x]), 0)
    assert len(log) == len(folds) == 60 and len(log_x) == len(folds_x) == 61   # once each
    assert folds_x.pop(x_key) == "release-1"          # x: epoch 3 -> the snapshot of epoch 1
    assert folds_x == folds                           # every other document: the same model
    assert set(folds.values()) == {"release-1", "release-2"}   # both models were used
    np.testing.assert_array_equal(Tx[4], T[4])        # the other epoch: bit-identical
    R_x = RefinementModel(A, ALPHA).contributions(_counts([x]))[0]
    np.testing.assert_allclose(Tx[3] - T[3], R_x, rtol=0, atol=1e-12)
    diff = math.sqrt(sum(float(np.sum((Tx[e] - T[e]) ** 2)) for e in (3, 4)))
    assert 0.99 < diff <= 1 + 1e-9, diff                # the accounted sensitivity

    # the old rule on the same runs: the switch document moves model, the sums move by sqrt(3)
    old = _old_rule_sums(e3 + e4, batch, release_after + 1, (RefinementModel(A, ALPHA),
                                                              RefinementModel(B, ALPHA)))
    old_x = _old_rule_sums([x] + e3 + e4, batch, release_after + 1, (RefinementModel(A, ALPHA),
                                                                      RefinementModel(B, ALPHA)))
    old_diff = math.sqrt(sum(float(np.sum((old_x[e] - old[e]) ** 2)) for e in (3, 4)))
    assert old_diff > 1.7, old_diff                   # sqrt(3) = 1.732 > 1


# ------------------------------------------------------------------ 3. the hold
def _four_epochs(rng, n: int = 12):
    docs = []
    for e in (1, 2, 3, 4):
        docs += _filler(rng, n, e, start=100 * e)
    return docs


def _random_model(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(D, 0.3), size=K)


@pytest.mark.parametrize("batch", [1, 7, 500])
def test_a_partition_is_held_until_its_model_is_decided_and_resumes_exactly(tmp_path, monkeypatch,
                                                                             batch):
    """No release yet: epochs 1, 2 (no model) are sketched, the partition is held at the first
    epoch-3 record (it needs snapshot 1) without consuming anything more; the release of epoch 1
    resumes it and the next hold is at the first epoch-4 record (snapshot 2). Every document is
    counted once and folded into the snapshot of its epoch − 2: the sums are bit-identical to a
    brute-force fold and to the estimator's EpochSketches; a crash (restore from a checkpoint
    taken mid-way) gives the same sums as the clean run."""
    rng = np.random.default_rng(8)
    docs = _four_epochs(rng)
    first3, first4 = 24, 36
    A, C = _random_model(1), _random_model(2)

    def start(tag, restore=None, world=None):
        if world is None:
            cfg = make_config(tmp_path / tag, WORDS, K, batch_size=batch)
            world = World(cfg, _subspace())
            world.add_documents(docs)
        return world, make_sketcher(world, monkeypatch, restore=restore)

    def until_held(sk, world):
        for _ in range(200):
            if sk.paused:
                return
            sk.step()
        raise AssertionError("never held")

    # --- clean run, step by step
    world, sk = start("clean")
    until_held(sk, world)
    st = sk.states[0]
    assert sk.paused == {0: "model"} and sk.held_for[0][0] == 1
    assert st.next_offset == first3 and sk.consumer.pos == first3        # seeked back to it
    assert st.progress == pytest.approx(docs[first3][1], abs=1e-3)      # the held record's time
    assert sorted(st.epochs) == [1, 2] and not st.refine                 # epochs 1, 2: no model
    for _ in range(5):                                                   # held: nothing read
        sk.step()
    assert st.next_offset == first3 and sk.paused
    world.release(1, A, ALPHA)
    sk.step()                                        # reads the release, resumes
    sk.step()
    mid = st.to_bytes()                              # a checkpoint somewhere in epoch 3 (or at 4)
    mid_offset = st.next_offset
    until_held(sk, world)
    assert sk.held_for[0][0] == 2 and st.next_offset == first4
    world.release(2, C, ALPHA)
    _drive(sk, world, releases={})
    assert st.next_offset == len(docs) and not sk.paused
    assert sorted(st.epochs) == [3, 4]                                   # 1, 2 released, dropped
    assert st.epochs[3].n_docs == st.epochs[4].n_docs == 12
    assert st.counters["documents"] == 48 and st.counters["late"] == 0
    clean = {e: st.refine[e].total() for e in (3, 4)}

    # --- brute force: epoch 3 into snapshot 1's model, epoch 4 into snapshot 2's (as kept by
    # the release service: a spectral snapshot's topics aligned to the first model's)
    folds = FoldInModels(2)
    models = {s.epoch: folds.add_snapshot(s) for s in world.snapshots}
    X = _counts(docs)
    for e, rows in ((3, slice(first3, first4)), (4, slice(first4, len(docs)))):
        ref = RefinementSketch(K, D).update(X[rows], models[e - 2])
        assert all(np.array_equal(a, b) for a, b in zip(clean[e], ref.total())), e

    # --- the estimator's path (EpochSketches, the same rule): everything added before any
    # epoch closes, held, folded as each snapshot is handed over -> the same bits
    es = EpochSketches(_subspace(), ClipBounds.unclipped(), clock(), n_topics=K, model_lag=2)
    es.add(X, np.array([ts for _, ts in docs]))
    assert sorted(es.held) == [3, 4]
    out = {}
    for e in (1, 2, 3, 4):
        out.update(es.pop_through(e))
        if e <= 2:
            es.model_released(world.snapshots[e - 1])
    for e in (3, 4):
        assert np.array_equal(out[e].refine, clean[e][0]) and np.array_equal(out[e].refine_lo, clean[e][1])

    # --- crash: a new sketcher restores the mid-way checkpoint (release state: epoch 2 closed)
    assert first3 <= mid_offset <= first4
    _, again = start("crash", restore=mid, world=world)
    _drive(again, world, releases={})
    st2 = again.states[0]
    assert st2.next_offset == len(docs) and st2.counters["documents"] == 48
    for e in (3, 4):
        assert all(np.array_equal(a, b) for a, b in zip(st2.refine[e].total(), clean[e])), e
