"""The release service's own state record (key ``release/tree``, issue 26 item 4): its one
schema version and the one migration from the version before, so the service reads the
current layout only.

v2 payload (msgpack)::

    {"kind": "release_state", "v": 2, "continual": ContinualRelease state,
     "last_snapshot": snapshot bytes | None, "control_offset": int | None,
     "orders": [Order.to_list()], "writer_epoch": int,
     "refinement_models": [RefinementModel dicts], "refinement": RefinementConfig dict | None}

v1 had no header (every record written before this version). Some v1 records also lack a
field that came later; :func:`_v1_to_v2` fills each as the service read it then. Those fills
depend on the configuration and the clock (the standing orders' ``at``, the configured model
lag), so the migration takes them as arguments.
"""
from __future__ import annotations

from functools import partial

from streamdp import serialization as ser
from streamdp.refinement import RefinementConfig, RefinementModel
from streamdp.services.release_policy import Order
from streamdp.snapshot import TopicSnapshot

KIND = "release_state"
VERSION = 2
FIELDS = ("continual", "last_snapshot", "control_offset", "orders", "writer_epoch",
          "refinement_models", "refinement")


def encode(**fields) -> bytes:
    """The record of ``fields`` (exactly :data:`FIELDS`)."""
    if set(fields) != set(FIELDS):
        raise ValueError(f"release state fields {sorted(fields)} != {sorted(FIELDS)}")
    return ser.dumps({"kind": KIND, "v": VERSION, **fields})


def decode(payload: bytes, *, refinement: RefinementConfig | None, now: float) -> dict:
    """The persisted state as a v2 dict. ``refinement``: the configured refinement (None: off),
    ``now``: the clock, both only for migrating a v1 record."""
    obj = ser.loads(payload)
    if isinstance(obj, dict) and "kind" not in obj and "continual" in obj:
        obj = {**obj, "kind": KIND, "v": 1}      # v1 had no header
    obj = ser.upgrade(obj, KIND, VERSION, {1: partial(_v1_to_v2, refinement=refinement, now=now)})
    ser.require(obj, KIND, *FIELDS)
    return obj


def _v1_to_v2(obj: dict, *, refinement: RefinementConfig | None, now: float) -> dict:
    """v1 as v2. Records written before the public schedule (issue 23) hold
    ``forced_through``/``flush_requested`` instead of the operator's orders: each becomes a
    standing order given ``now``. Records written before the model rule (issue 15) hold no
    refinement models: the last snapshot's model is the one kept. Those written before the
    model lag existed record refinement without ``model_lag``: the configured lag is taken."""
    out = {k: v for k, v in obj.items() if k not in ("forced_through", "flush_requested")}
    out.setdefault("last_snapshot", None)
    out.setdefault("control_offset", None)
    out.setdefault("writer_epoch", 0)
    if "orders" not in obj:
        orders = []
        if obj.get("forced_through", -1) >= 0:
            orders.append(Order(now, int(obj["forced_through"])))
        if obj.get("flush_requested"):
            orders.append(Order(now, -1, now))
        out["orders"] = [o.to_list() for o in orders]
    had = obj.get("refinement")
    if had is not None and refinement is not None and "model_lag" not in had:
        out["refinement"] = {**had, "model_lag": refinement.model_lag}
    out.setdefault("refinement", None)
    if refinement is not None and not obj.get("refinement_models") and obj.get("last_snapshot"):
        snap = TopicSnapshot.from_bytes(obj["last_snapshot"])
        out["refinement_models"] = [RefinementModel.from_snapshot(snap).to_dict()]
    out.setdefault("refinement_models", [])
    return out
