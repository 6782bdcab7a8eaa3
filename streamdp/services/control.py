"""Control messages on the control topic (msgpack, versioned; docs/schemas.md).

``{"v": 1, "kind": "control", "type": T, "at": unix seconds, ..., "mac": hex}`` with T one of

* ``vocabulary_ready`` (release → sketchers) ``vocabulary_id``: the deployment's vocabulary
  (``vocabulary_mode`` public or private) is in the state store under :data:`VOCABULARY_KEY`
  and, for sketchers, ``public/vocabulary`` (:mod:`streamdp.services.public_records`);
* ``subspace_ready``  (release → sketchers) ``subspace_id``: the warm-up is closed,
  the subspace and clip bounds are in the state store under :data:`SUBSPACE_KEY` and, for
  sketchers, ``public/subspace``;
* ``epochs_closed``   (release → sketchers) ``through``: epochs ≤ through are
  released; sketchers drop their raw sketches at the next checkpoint — but only
  after the release state on the state topic confirms it (the message is a hint);
* ``flush``           (operator → release) optional ``through``: close now (without waiting
  for the grace) every epoch whose close time had passed at ``at`` — a cut derived from the
  clock, never from the data (issue 23) — and, with ``through``, every epoch ≤ through;
  each once all partitions' states cover it (a batch corpus, a demo, a test);
* ``close``           (operator → release) ``through``: the operator asserts the
  input of epochs ≤ through is complete; close them;
* ``release``         (operator → release) close whatever is closable now.

Authentication (issue 15, docs/operations.md §Kafka ACLs): ``mac`` is
HMAC-SHA256, keyed with the deployment's control key, over the canonical msgpack
encoding of every other field (keys sorted). The key comes from the file named by
the ``control_key_file`` configuration field (a Kubernetes Secret in production);
a production deployment without it refuses to start. A ``non_production``
deployment without a key file uses a key derived from its public topic prefix:
it tells streamdp's own messages from foreign ones, but authenticates nothing
against an attacker who reads this file — the demo's protection is the release
state check, not the MAC.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import time
from pathlib import Path

from streamdp import serialization as ser

log = logging.getLogger("streamdp.control")

VERSION = 1
KIND = "control"
TYPES = ("vocabulary_ready", "subspace_ready", "epochs_closed", "flush", "close", "release")
# written only by the release service
RELEASE_TYPES = ("vocabulary_ready", "subspace_ready", "epochs_closed")
VOCABULARY_KEY = "release/vocabulary"
SUBSPACE_KEY = "release/subspace"
# the warm-up's noised values, persisted between the draw and the subspace (issue 23 item 4)
WARMUP_DRAW_KEY = "release/warmup_draw"
# the warm-up premise check's noised count, persisted before it decides anything (issue 23 item 2)
WARMUP_PREMISE_KEY = "release/warmup_premise"
RELEASE_STATE_KEY = "release/tree"
MIN_KEY_BYTES = 32
MAC_FIELD = "mac"


class ControlKeyError(ValueError):
    """The deployment's control key is missing or unusable (a configuration error)."""


def _canonical(obj: dict) -> bytes:
    return ser.dumps({k: obj[k] for k in sorted(obj) if k != MAC_FIELD})


def mac(obj: dict, key: bytes) -> str:
    return hmac.new(key, _canonical(obj), hashlib.sha256).hexdigest()


def encode(type_: str, key: bytes | None = None, **fields) -> bytes:
    """A control message; signed with ``key`` (the deployment's control key) when given."""
    if type_ not in TYPES:
        raise ValueError(f"control type must be one of {TYPES}, got {type_!r}")
    obj = {"v": VERSION, "kind": KIND, "type": type_, "at": time.time(), **fields}
    if key is not None:
        obj[MAC_FIELD] = mac(obj, key)
    return ser.dumps(obj)


def decode(raw: bytes) -> dict:
    obj = ser.loads(raw, max_bytes=1 << 16)
    ser.check_header(obj, KIND, VERSION)
    if obj.get("type") not in TYPES:
        raise ser.SchemaError(f"unknown control type {obj.get('type')!r}")
    if obj["type"] in ("epochs_closed", "close") or (obj["type"] == "flush" and "through" in obj):
        if not isinstance(obj.get("through"), int) or obj["through"] < 0:
            raise ser.SchemaError(f"control {obj['type']}: 'through' must be an epoch >= 0")
    return obj


def authentic(obj: dict, key: bytes) -> bool:
    """Whether a decoded message carries a valid MAC under ``key`` (constant-time compare)."""
    got = obj.get(MAC_FIELD)
    return isinstance(got, str) and hmac.compare_digest(got, mac(obj, key))


def load_key(cfg) -> bytes:
    """The deployment's control key (see the module docstring); ControlKeyError if unusable."""
    path = getattr(cfg, "control_key_file", "") or ""
    if path:
        try:
            key = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ControlKeyError(f"configuration field 'control_key_file': cannot read {path!r} "
                                  f"({exc.strerror or exc}); mount the deployment's control-key "
                                  "Secret there (docs/operations.md §Kafka ACLs)") from None
        if len(key) < MIN_KEY_BYTES:
            raise ControlKeyError(f"configuration field 'control_key_file': {path!r} holds "
                                  f"{len(key)} bytes, at least {MIN_KEY_BYTES} are needed "
                                  "(e.g. `openssl rand -hex 32 > control.key`)")
        return key
    if getattr(cfg, "non_production", False):
        return hashlib.sha256(b"streamdp non-production control key/" + cfg.topic_prefix.encode()).digest()
    raise ControlKeyError(
        "configuration field 'control_key_file': a production deployment needs a control key: "
        "sketchers act on control messages only when they carry its HMAC. Create one "
        "(`openssl rand -hex 32 > control.key`), give it to every service (Kubernetes: a Secret "
        "mounted as a file, k8s/base) and set control_key_file to its path; for a local, "
        "non-production run set non_production: true instead")
