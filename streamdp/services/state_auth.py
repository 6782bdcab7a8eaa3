"""MACs on the sketchers' state records (issue 23 item 6; docs/privacy.md §Trust boundary).

A sketch state record (``sketch/<documents topic>/<partition>``) is what the release service
noises. Sketchers sign each one with the deployment's control key — the HMAC of
:func:`streamdp.services.control.mac`, the one implementation — over

    {"kind": "sketch_state", "deployment": topic prefix, "key": the record's key,
     "payload_sha256": SHA-256 of the payload, "meta": the manifest metadata without "mac"}

and put the hex digest in the record's metadata under ``mac``. The release service (and a
sketcher restoring a partition) accepts a record only if the MAC verifies. What this stops: a
writer without the key (a forged or edited record), a record copied from another partition's key
or from another deployment (another topic prefix, or another key). What it does not stop: a
holder of the key (every sketcher: sketchers are inside the trust boundary), and the replay of
an *older* record of the same partition (the fencing rule, ``select_state``, refuses a record
whose fence or next_offset goes backwards).
"""
from __future__ import annotations

import hashlib
import hmac

from streamdp.services import control

KIND = "sketch_state"
MAC_FIELD = control.MAC_FIELD


class StateIntegrityError(RuntimeError):
    """A sketch state record without a valid MAC where one must be restored."""


class StateAuth:
    """Signs and verifies sketch state records of one deployment (``key``: its control key,
    ``deployment``: its topic prefix)."""

    def __init__(self, key: bytes, deployment: str) -> None:
        self.key, self.deployment = key, str(deployment)

    def _obj(self, record_key: str, payload: bytes, meta: dict) -> dict:
        return {"kind": KIND, "deployment": self.deployment, "key": record_key,
                "payload_sha256": hashlib.sha256(payload).hexdigest(),
                "meta": {k: meta[k] for k in sorted(meta) if k != MAC_FIELD}}

    def sign(self, record_key: str, payload: bytes, meta: dict) -> dict:
        """``meta`` with its ``mac``."""
        return {**meta, MAC_FIELD: control.mac(self._obj(record_key, payload, meta), self.key)}

    def authentic(self, record_key: str, payload: bytes, meta: dict) -> bool:
        """Whether ``meta`` carries a valid MAC of this record (constant-time compare)."""
        got = meta.get(MAC_FIELD) if isinstance(meta, dict) else None
        return isinstance(got, str) and hmac.compare_digest(
            got, control.mac(self._obj(record_key, payload, meta), self.key))


    def verify(self, record_key: str, rec) -> None:
        """Raise :class:`StateIntegrityError` unless ``rec`` (a StateRecord of ``record_key``)
        carries a valid MAC; the message says what it means and what to check."""
        if self.authentic(record_key, rec.payload, rec.meta):
            return
        why = ("it carries no MAC (a foreign writer, or a record written before this record "
               "was signed)" if not (isinstance(rec.meta, dict) and MAC_FIELD in rec.meta)
               else "its MAC does not verify (forged or edited, written under another control "
               "key, or copied from another key or deployment)")
        raise StateIntegrityError(
            f"state record {record_key!r} of deployment {self.deployment!r}: {why}. Check that "
            "control_key_file is the deployment's control key (every service must hold the same "
            "key) and who can write the state topic (docs/operations.md §Kafka ACLs)")


def for_config(cfg) -> StateAuth:
    """The deployment's :class:`StateAuth` (control key from :func:`control.load_key`)."""
    return StateAuth(control.load_key(cfg), cfg.topic_prefix)
