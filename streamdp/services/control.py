"""Control messages on the control topic (msgpack, versioned; docs/schemas.md).

``{"v": 1, "kind": "control", "type": T, "at": unix seconds, ...}`` with T one of

* ``subspace_ready``  (release → sketchers) ``subspace_id``: the warm-up is closed,
  the subspace and clip bounds are in the state store under :data:`SUBSPACE_KEY`;
* ``epochs_closed``   (release → sketchers) ``through``: epochs ≤ through are
  released; sketchers drop their raw sketches at the next checkpoint;
* ``flush``           (operator → release) the input is complete for now: close
  the warm-up and every epoch up to the newest one seen, once all partitions are
  caught up (a batch corpus, a demo, a test);
* ``close``           (operator → release) ``through``: the operator asserts the
  input of epochs ≤ through is complete; close them;
* ``release``         (operator → release) close whatever is closable now.
"""
from __future__ import annotations

import time

from streamdp import serialization as ser

VERSION = 1
KIND = "control"
TYPES = ("subspace_ready", "epochs_closed", "flush", "close", "release")
SUBSPACE_KEY = "release/subspace"
RELEASE_STATE_KEY = "release/tree"


def encode(type_: str, **fields) -> bytes:
    if type_ not in TYPES:
        raise ValueError(f"control type must be one of {TYPES}, got {type_!r}")
    return ser.dumps({"v": VERSION, "kind": KIND, "type": type_, "at": time.time(), **fields})


def decode(raw: bytes) -> dict:
    obj = ser.loads(raw, max_bytes=1 << 16)
    ser.check_header(obj, KIND, VERSION)
    if obj.get("type") not in TYPES:
        raise ser.SchemaError(f"unknown control type {obj.get('type')!r}")
    if obj["type"] in ("epochs_closed", "close"):
        if not isinstance(obj.get("through"), int) or obj["through"] < 0:
            raise ser.SchemaError(f"control {obj['type']}: 'through' must be an epoch >= 0")
    return obj
