"""Issue 26 item 4: each persisted state kind has one schema version and one migration per
older version (streamdp.serialization.upgrade); a reader reads the current layout only. A
state from a newer streamdp, or too old to migrate, is refused saying what to do; a current
one lacking a field is damaged, not "old"."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.moments.sketch import SCHEMA_VERSION as SKETCH_V, WhitenedSketch
from streamdp.refinement import SKETCH_VERSION as REFINE_V, RefinementModel, RefinementSketch
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import SCHEMA_VERSION as WARMUP_V, WarmupSketch

D, K = 12, 3


def _X(n=40, seed=0):
    X = sp.random(n, D, density=0.5, random_state=seed, format="csr")
    X.data = np.ceil(X.data * 5)
    return X


def _states():
    """(kind, current version, current record, reader) of each sketch state kind."""
    sub = Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal((D, K)))[0])
    sk = WhitenedSketch(sub).update(_X())
    w = WarmupSketch(D, K).update(_X())
    model = RefinementModel(np.full((2, D), 1.0 / D), np.full(2, 0.5))
    rs = RefinementSketch(2, D).update(_X(), model)
    return [("whitened_sketch", SKETCH_V, sk.to_dict(), lambda o: WhitenedSketch.from_dict(o, sub)),
            ("warmup_sketch", WARMUP_V, ser.loads(w.to_bytes()),
             lambda o: WarmupSketch.from_bytes(ser.dumps(o))),
            ("refinement_sketch", REFINE_V, rs.to_dict(), RefinementSketch.from_dict)]


@pytest.mark.parametrize("i", range(3))
def test_newer_and_too_old_states_are_refused_saying_what_to_do(i):
    kind, v, obj, read = _states()[i]
    assert obj["kind"] == kind and obj["v"] == v
    read(obj)                                            # the current layout reads
    with pytest.raises(ser.SchemaError, match=f"{kind}: unsupported schema version {v + 1}.*newer streamdp"):
        read(dict(obj, v=v + 1))
    with pytest.raises(ser.SchemaError, match=f"{kind}: unsupported schema version 0.*too old"):
        read(dict(obj, v=0))


@pytest.mark.parametrize("i,field", [(0, "n_rows"), (0, "pending"), (1, "pending"), (1, "a2_lo"),
                                     (2, "sums_lo")])
def test_a_current_state_lacking_a_field_is_damaged_and_refused(i, field):
    kind, v, obj, read = _states()[i]
    with pytest.raises(ser.SchemaError, match=f"{kind} v{v}: missing field.*{field}"):
        read({k: x for k, x in obj.items() if k != field})


def test_v1_warmup_and_refinement_states_migrate_to_what_they_meant():
    _, _, w, read_w = _states()[1]
    _, _, r, read_r = _states()[2]
    old_w = {k: x for k, x in w.items() if k not in ("yacc_lo", "a2_lo", "pending")}
    back = read_w(dict(old_w, v=1))
    assert back.pending.n == 0 and not back.yacc_lo.any() and back.to_bytes() != ser.dumps(old_w)
    assert ser.loads(back.to_bytes())["v"] == WARMUP_V
    old_r = {k: x for k, x in r.items() if k != "sums_lo"}
    rb = read_r(dict(old_r, v=1))
    assert not rb.sums_lo.any() and rb.to_dict()["v"] == REFINE_V


def test_partition_state_v1_migrates_and_newer_or_damaged_is_refused():
    from streamdp.services.partition_state import VERSION, PartitionState
    obj = ser.loads(PartitionState("docs", 3).to_bytes())
    assert obj["v"] == VERSION == 2
    # v1, as written before refinement, fencing and deduplication
    v1 = {k: x for k, x in obj.items() if k not in ("refine", "fence", "dedup")}
    st = PartitionState.from_bytes(ser.dumps(dict(v1, v=1)), None)
    assert (st.partition, st.fence, len(st.seen_ids), st.refine) == (3, 0, 0, {})
    assert ser.loads(st.to_bytes())["v"] == VERSION
    with pytest.raises(ser.SchemaError, match="partition_state v2: missing field.*fence.*dedup"):
        PartitionState.from_bytes(ser.dumps(dict(v1, v=2)), None)
    with pytest.raises(ser.SchemaError, match="version 3.*newer streamdp"):
        PartitionState.from_bytes(ser.dumps(dict(obj, v=3)), None)


def _epoch_sums(refine=True):
    from streamdp.continual import EpochSums
    sub = Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal((D, K)))[0])
    sk = WhitenedSketch(sub).update(_X()).sums()
    if not refine:
        return EpochSums(sk)
    r = np.random.default_rng(1).random((2, D))
    return EpochSums(sk, r, r * 1e-17)


def test_epoch_sums_old_layouts_migrate_to_what_the_reader_gave_and_newer_is_refused():
    from streamdp.continual import EPOCH_SUMS_VERSION, EpochSums
    cur = _epoch_sums().to_dict()
    assert (cur["kind"], cur["v"]) == ("epoch_sums", EPOCH_SUMS_VERSION) == ("epoch_sums", 2)
    back = EpochSums.from_dict(cur)
    assert ser.dumps(back.to_dict()) == ser.dumps(cur)
    # v1 as written before the document count and compensated summation: n_docs 0, no remainder
    v1 = dict(cur, v=1, sketch={k: x for k, x in cur["sketch"].items() if k != "n_docs"})
    del v1["refine_lo"]
    old = EpochSums.from_dict(v1)
    assert old.sketch.n_docs == 0 and old.refine_lo is None
    assert np.array_equal(old.refine, back.refine) and old.sketch.count == back.sketch.count
    assert EpochSums.from_dict(old.to_dict()).to_dict()["v"] == EPOCH_SUMS_VERSION
    # v0: a tree node written before refinement was the bare sketch sums map
    bare = _epoch_sums(refine=False).to_dict()["sketch"]
    v0 = EpochSums.from_dict(bare)
    assert v0.refine is None and v0.sketch.n_docs == bare["n_docs"]
    assert np.array_equal(v0.sketch.s3, EpochSums.from_dict(_epoch_sums(False).to_dict()).sketch.s3)
    with pytest.raises(ser.SchemaError, match="epoch_sums: unsupported schema version 3.*newer streamdp"):
        EpochSums.from_dict(dict(cur, v=3))
    with pytest.raises(ser.SchemaError, match="epoch_sums v2: missing field.*refine_lo"):
        EpochSums.from_dict({k: x for k, x in cur.items() if k != "refine_lo"})
    with pytest.raises(ser.SchemaError, match="epoch_sums v2: missing field.*n_docs"):
        EpochSums.from_dict(dict(cur, sketch={k: x for k, x in cur["sketch"].items() if k != "n_docs"}))


def test_public_release_v1_migrates_and_newer_or_damaged_is_refused():
    from streamdp.services import public_release as pr
    models = [{"kind": "refinement_model", "v": 1, "epoch": 0}]
    cur = ser.loads(pr.encode(4, models, "public"))
    assert (cur["kind"], cur["v"], cur["start"]) == ("public_release", pr.VERSION, "public") \
        and pr.VERSION == 2
    assert ser.loads(pr.encode(4, models))["start"] == "tensor"      # no choice made yet
    # v1 as written before issue 22 (no start): the tensor start, as the v1 reader read it
    v1 = ser.dumps({"kind": "public_release", "v": 1, "epoch": 4, "models": models})
    assert (pr.decode(v1), pr.decode_start(v1)) == ((4, models), "tensor")
    v1p = ser.dumps({"kind": "public_release", "v": 1, "epoch": 4, "models": models,
                     "start": "public"})
    assert (pr.decode(v1p), pr.decode_start(v1p)) == ((4, models), "public")
    with pytest.raises(ser.SchemaError, match="public_release: unsupported schema version 3.*newer"):
        pr.decode(ser.dumps(dict(cur, v=3)))
    with pytest.raises(ser.SchemaError, match="public_release v2: missing field.*start"):
        pr.decode_start(ser.dumps({k: x for k, x in cur.items() if k != "start"}))


def _release_state_v1(**drop):
    """A release state as main wrote it before this version (no header), refinement on."""
    from streamdp.refinement import RefinementConfig
    from streamdp.snapshot import TopicSnapshot
    rng = np.random.default_rng(2)
    tw = rng.random((K, D))
    snap = TopicSnapshot(topic_word=tw / tw.sum(1, keepdims=True), alpha=np.full(K, 0.3),
                         eigenvalues=np.ones(K), n_docs=0.0, privacy={}, mechanism="none",
                         subspace_id="s", epoch=3, release_id="release-3", stage="refined")
    from streamdp.refinement import FoldInModels
    models = FoldInModels()
    models.add_snapshot(snap)
    obj = {"continual": {"epoch": 3}, "last_snapshot": snap.to_bytes(), "control_offset": 17,
           "orders": [[10.0, 2, None]], "writer_epoch": 4,
           "refinement_models": [models.models[3].to_dict()],
           "refinement": RefinementConfig(model_lag=3).to_dict()}
    return {k: x for k, x in obj.items() if k not in drop}, snap, models.models[3]


def test_release_state_v1_migrates_to_what_the_service_read_and_newer_or_damaged_is_refused():
    from streamdp.refinement import RefinementConfig, RefinementModel
    from streamdp.services import release_state as rs
    cfg = RefinementConfig(model_lag=3)
    v1, snap, model = _release_state_v1()
    # a v1 record with every field (what main wrote) reads as it was, with the header
    got = rs.decode(ser.dumps(v1), refinement=cfg, now=5.0)
    assert got == {**v1, "kind": "release_state", "v": rs.VERSION} and rs.VERSION == 2
    cur = rs.encode(**v1)
    assert rs.decode(cur, refinement=cfg, now=5.0) == got
    # before the public schedule: forced_through / flush_requested become standing orders at now
    old = dict(_release_state_v1(orders=1)[0], forced_through=4, flush_requested=True)
    got = rs.decode(ser.dumps(old), refinement=cfg, now=5.0)
    assert got["orders"] == [[5.0, 4, None], [5.0, -1, 5.0]] and "forced_through" not in got
    assert rs.decode(ser.dumps(dict(old, forced_through=-1, flush_requested=False)),
                     refinement=cfg, now=5.0)["orders"] == []
    # before the model lag: the configured lag; before the model rule: the last snapshot's model
    old = _release_state_v1(refinement_models=1)[0]
    old["refinement"] = {k: x for k, x in old["refinement"].items() if k != "model_lag"}
    got = rs.decode(ser.dumps(old), refinement=cfg, now=5.0)
    assert got["refinement"] == cfg.to_dict()
    [m] = [RefinementModel.from_dict(x) for x in got["refinement_models"]]
    assert (m.epoch, m.model_id) == (model.epoch, model.model_id)
    assert np.array_equal(m.topic_word, model.topic_word) and np.array_equal(m.alpha, model.alpha)
    # refinement off: no model, the recorded refinement kept
    assert rs.decode(ser.dumps(dict(old, refinement=None)), refinement=None,
                     now=5.0)["refinement_models"] == []
    with pytest.raises(ser.SchemaError, match="release_state: unsupported schema version 3.*newer"):
        rs.decode(ser.dumps(dict(ser.loads(cur), v=3)), refinement=cfg, now=5.0)
    with pytest.raises(ser.SchemaError, match="release_state v2: missing field.*orders"):
        rs.decode(ser.dumps({k: x for k, x in ser.loads(cur).items() if k != "orders"}),
                  refinement=cfg, now=5.0)


def test_counted_ids_read_v2_only_and_refuse_the_rest_saying_what_to_do():
    from streamdp.services.dedup import DEDUP_VERSION, CountedIds, SeenIds
    ids = CountedIds(3)
    ids.add(np.arange(5, dtype=np.uint64), np.array([1, 1, 2, 2, 2]))
    cur = ids.to_obj()
    assert cur["v"] == DEDUP_VERSION == 2 and "kind" not in cur    # nested: partition_state names it
    back = CountedIds.from_obj(cur)
    assert ser.dumps(back.to_obj()) == ser.dumps(cur)
    with pytest.raises(ser.SchemaError, match="counted_ids: unsupported schema version 3.*newer"):
        CountedIds.from_obj(dict(cur, v=3))
    with pytest.raises(ser.SchemaError, match="counted_ids v2: missing field.*by_epoch"):
        CountedIds.from_obj({k: x for k, x in cur.items() if k != "by_epoch"})
    # format 1 (a flat set's bytes) lives only in partition_state v1, which migrates it
    with pytest.raises(ser.SchemaError, match="counted_ids: expected a map"):
        CountedIds.from_obj(SeenIds(np.arange(3, dtype=np.uint64)).to_bytes())
