"""The public records sketchers read: everything they need from the release service, and only
released values (issue 23 item 6: sketchers never decode the release service's private state).

Keys on the state topic (compacted, chunked by the state store like every record), each signed
with the deployment's control key (:mod:`streamdp.services.state_auth`, the one MAC):

* :data:`SUBSPACE_KEY` ``public/subspace``: the warm-up subspace (payload: ``Subspace.to_bytes``)
  and its clip bounds; meta ``{"clip", "subspace_id", "vocabulary_id"}``;
* :data:`VOCABULARY_KEY` ``public/vocabulary`` (``vocabulary_mode`` public/private): the
  deployment's vocabulary (payload: ``Vocabulary.canonical_bytes``); meta ``{"vocabulary_id",
  "mode"}`` and, for a failed selection, ``{"status", "error"}`` (a fixed error text: the private
  record's quotes the exact count of selection documents);
* ``public/release`` (:mod:`streamdp.services.public_release`): the last released epoch and
  the released refinement models.

The release service writes each one right after the private record it mirrors
(``release/subspace``, ``release/vocabulary``) is persisted, and again at start-up when it is
missing or differs (a crash between the two writes, or a deployment older than these records:
the one-time migration). Only the fields in :data:`PUBLIC_FIELDS` are copied: the private
records' ledger head, writer epoch and exact document counts (``warmup_documents``,
``selection_documents``) never leave ``release/*``.
"""
from __future__ import annotations

from streamdp.services.state_auth import StateAuth

SUBSPACE_KEY = "public/subspace"
VOCABULARY_KEY = "public/vocabulary"
#: what each public record copies from the private record's metadata (released values only)
PUBLIC_FIELDS = {
    SUBSPACE_KEY: ("clip", "subspace_id", "vocabulary_id"),
    VOCABULARY_KEY: ("vocabulary_id", "mode", "status", "error"),
}
#: what a failed selection's public record says: the private record's error quotes the exact
#: count of selection documents ("this count is private"), so it stays in release/vocabulary
FAILED_SELECTION_ERROR = ("the private vocabulary selection kept too few words; the release "
                          "service's log says why and how to fix it (docs/vocabulary.md)")


def public_meta(key: str, meta: dict) -> dict:
    """The released fields of a private record's ``meta`` (see :data:`PUBLIC_FIELDS`)."""
    pub = {k: meta[k] for k in PUBLIC_FIELDS[key] if k in meta}
    if "error" in pub:                  # never the private text (it quotes an exact count)
        pub["error"] = FAILED_SELECTION_ERROR
    return pub


def write(store, auth: StateAuth, key: str, payload: bytes, meta: dict) -> None:
    """Write the public record ``key`` (signed) from a private record's payload and meta."""
    pub = public_meta(key, meta)
    store.write(key, payload, meta=auth.sign(key, payload, pub))


def same(rec, key: str, payload: bytes, meta: dict) -> bool:
    """Whether ``rec`` (the public record found, or None) already mirrors ``payload``/``meta``."""
    return (rec is not None and rec.payload == payload
            and {k: v for k, v in rec.meta.items() if k in PUBLIC_FIELDS[key]} == public_meta(key, meta))


def read(store, auth: StateAuth, key: str):
    """``(record, authentic)`` of the public record ``key``: ``(None, True)`` if there is none;
    a record without a valid MAC comes back with ``authentic`` False (the caller ignores it
    and says so: a foreign writer, or another deployment's key)."""
    rec = store.read_latest(key)
    if rec is None:
        return None, True
    return rec, auth.authentic(key, rec.payload, rec.meta)
