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
