"""The state topic's record format, its key scheme and the pure reader that verifies records.

A logical ``key``'s payload is stored as chunks and a manifest (below); :class:`StateScan` folds
records in log order and keeps, per key, the newest manifest whose chunks are all present and
match its size and sha256 (the reading half of :mod:`streamdp.kafka.state_store`'s crash
safety). Pure logic: no Kafka client.

Record format (msgpack, DESIGN §6)
----------------------------------
Chunks, Kafka key ``f"{key}/g{generation}/chunk/{index}"``::

    {kind: "state_chunk", v: 1, key, generation, index, n_chunks, data: bytes}

then, written LAST, the manifest, Kafka key ``f"{key}/manifest"``::

    {kind: "state_manifest", v: 1, key, generation, n_chunks, sha256 (hex of the
     whole payload), size, meta (a small map), created_at (unix seconds)}

Every record of one key goes to the same partition, ``crc32(key) % partitions``,
so the log orders a key's chunks before its manifest. Chunks are at most
``chunk_bytes`` (default 512 KiB; below real Kafka's ~1 MB default message size).
"""
from __future__ import annotations

import hashlib
import logging
import re
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

from streamdp.serialization import SchemaError, loads

log = logging.getLogger(__name__)

CHUNK_KIND = "state_chunk"
MANIFEST_KIND = "state_manifest"
VERSION = 1

#: Default chunk size; with msgpack framing a chunk record stays below real
#: Kafka's default ``message.max.bytes`` of 1,048,588 bytes.
DEFAULT_CHUNK_BYTES = 512 * 1024
#: Upper bound of an encoded manifest (its ``meta`` map must be small).
MAX_MANIFEST_BYTES = 256 * 1024
#: Upper bound accepted when decoding any state record.
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_KEY_CHARS = 512

_CHUNK_SUFFIX = re.compile(r"^(?P<key>.+)/g(?P<gen>[0-9]+)/chunk/(?P<idx>[0-9]+)$", re.S)
_MANIFEST_SUFFIX = "/manifest"


class StateRecord(NamedTuple):
    payload: bytes
    meta: dict
    generation: int


# ------------------------------------------------------------------ key format
def chunk_key(key: str, generation: int, index: int) -> str:
    return f"{key}/g{generation}/chunk/{index}"


def manifest_key(key: str) -> str:
    return f"{key}{_MANIFEST_SUFFIX}"


def parse_kafka_key(kafka_key: str) -> tuple[str, str, int | None, int | None] | None:
    """``(key, "chunk"|"manifest", generation, index)`` or None if not ours."""
    if kafka_key.endswith(_MANIFEST_SUFFIX) and len(kafka_key) > len(_MANIFEST_SUFFIX):
        return kafka_key[: -len(_MANIFEST_SUFFIX)], "manifest", None, None
    m = _CHUNK_SUFFIX.match(kafka_key)
    if m:
        return m["key"], "chunk", int(m["gen"]), int(m["idx"])
    return None


def check_key(key: str) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS or "\x00" in key:
        raise ValueError(f"state key must be a non-empty str of at most {MAX_KEY_CHARS} chars "
                         f"without NUL, got {key!r}")
    return key


def partition_for(key: str, n_partitions: int) -> int:
    """The state topic partition of every record of ``key`` (stable across processes)."""
    return zlib.crc32(key.encode("utf-8")) % n_partitions


# ------------------------------------------------------------ the pure reader
@dataclass
class _KeyScan:
    chunks: dict[int, dict[int, bytes]] = field(default_factory=dict)  # gen -> idx -> data
    pending: dict[int, dict] = field(default_factory=dict)             # gen -> manifest
    best: StateRecord | None = None
    max_generation: int = 0
    live_chunks: set[tuple[int, int]] = field(default_factory=set)     # (gen, idx), not tombstoned

    def verify(self, gen: int) -> StateRecord | None:
        m = self.pending.get(gen)
        if m is None:
            return None
        parts = self.chunks.get(gen, {})
        n = m["n_chunks"]
        if any(i not in parts for i in range(n)):
            return None
        payload = b"".join(parts[i] for i in range(n))
        if len(payload) != m["size"] or hashlib.sha256(payload).hexdigest() != m["sha256"]:
            log.warning("state %r generation %d: chunks do not match the manifest (size %d/%d)",
                        m["key"], gen, len(payload), m["size"])
            return None
        return StateRecord(payload, m["meta"], gen)

    def accept(self, rec: StateRecord) -> None:
        self.best = rec
        # Everything at or below the accepted generation is superseded: free it.
        for g in [g for g in self.chunks if g <= rec.generation]:
            del self.chunks[g]
        for g in [g for g in self.pending if g <= rec.generation]:
            del self.pending[g]


class StateScan:
    """Fold over state-topic records in log order (per partition); pure logic.

    ``add(kafka_key, value)`` for each record (value None = tombstone), then
    :meth:`result`. Only keys for which ``want(key)`` is true are kept.
    """

    def __init__(self, want: Callable[[str], bool] = lambda key: True):
        self.want = want
        self.keys: dict[str, _KeyScan] = {}
        self.skipped = 0

    def _skip(self, why: str, kafka_key: str) -> None:
        self.skipped += 1
        log.warning("skipping state record %r: %s", kafka_key, why)

    def add(self, kafka_key: bytes | str | None, value: bytes | None) -> None:
        if kafka_key is None:
            return self._skip("no key", "")
        if isinstance(kafka_key, bytes):
            try:
                kafka_key = kafka_key.decode("utf-8")
            except UnicodeDecodeError:
                return self._skip("key is not UTF-8", repr(kafka_key))
        parsed = parse_kafka_key(kafka_key)
        if parsed is None:
            return self._skip("not a state record key", kafka_key)
        key, kind, gen, idx = parsed
        if not self.want(key):
            return
        ks = self.keys.setdefault(key, _KeyScan())
        if value is None:  # tombstone
            if kind == "manifest":
                self.keys[key] = _KeyScan(max_generation=ks.max_generation, live_chunks=ks.live_chunks)
            else:
                ks.live_chunks.discard((gen, idx))
                ks.chunks.get(gen, {}).pop(idx, None)
            return
        try:
            rec = loads(value, max_bytes=MAX_RECORD_BYTES)
            if not isinstance(rec, dict) or rec.get("v") != VERSION or rec.get("kind") != (
                    CHUNK_KIND if kind == "chunk" else MANIFEST_KIND):
                raise SchemaError(f"expected a v{VERSION} {kind} record, got "
                                  f"{rec.get('kind') if isinstance(rec, dict) else type(rec).__name__!r} "
                                  f"v{rec.get('v') if isinstance(rec, dict) else '?'}")
            if rec.get("key") != key:
                raise SchemaError(f"record key {rec.get('key')!r} does not match the Kafka key")
            rgen, n = rec["generation"], rec["n_chunks"]
            if not (isinstance(rgen, int) and isinstance(n, int) and rgen >= 0 and n >= 0):
                raise SchemaError("bad generation or n_chunks")
            if kind == "chunk":
                if rgen != gen or rec["index"] != idx or not (0 <= idx < n) \
                        or not isinstance(rec["data"], bytes):
                    raise SchemaError("chunk fields do not match the Kafka key")
            else:
                if not (isinstance(rec["size"], int) and isinstance(rec["sha256"], str)
                        and isinstance(rec["meta"], dict)):
                    raise SchemaError("bad size, sha256 or meta")
        except (SchemaError, KeyError, TypeError) as exc:
            return self._skip(str(exc), kafka_key)

        ks.max_generation = max(ks.max_generation, rgen)
        if kind == "chunk":
            ks.live_chunks.add((gen, idx))
            if ks.best is None or gen > ks.best.generation:
                ks.chunks.setdefault(gen, {})[idx] = rec["data"]
            return
        if ks.best is not None and rgen <= ks.best.generation:
            return  # an older (or repeated) manifest: nothing new
        ks.pending[rgen] = rec
        verified = ks.verify(rgen)
        if verified is not None:
            ks.accept(verified)

    def result(self) -> dict[str, StateRecord]:
        """Newest complete, hash-verified record per key (keys without one omitted)."""
        out = {}
        for key, ks in self.keys.items():
            # Manifests whose chunks were not all there when they arrived; only
            # possible across a change of the partition count. Newest first.
            for gen in sorted(ks.pending, reverse=True):
                if ks.best is not None and gen <= ks.best.generation:
                    break
                rec = ks.verify(gen)
                if rec is not None:
                    ks.accept(rec)
                    break
            if ks.best is not None:
                out[key] = ks.best
        return out


def latest_from_records(records: Iterable[tuple[bytes | str | None, bytes | None]],
                        want: Callable[[str], bool] = lambda key: True) -> dict[str, StateRecord]:
    """:class:`StateScan` over ``(kafka_key, value)`` pairs in log order."""
    scan = StateScan(want)
    for k, v in records:
        scan.add(k, v)
    return scan.result()
