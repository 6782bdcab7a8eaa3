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
