"""Write-ahead privacy ledger: durable, append-only records of every spend.

The accountant writes a reservation to the ledger, durably, *before* any noise
is drawn (write-ahead), and the privacy guarantee rests on this file: whatever
was reserved is counted as spent forever, committed or not.

Interface
---------
:class:`Ledger` is deliberately small so that the Kafka release service can
back it with a compacted topic:

* ``exclusive()`` — a context manager serialising read-check-append across
  every writer (here ``fcntl.flock``; on Kafka, the single partition leader or
  a transactional producer that fences zombies);
* ``read()`` — all complete records, oldest first;
* ``append(record)`` — durable before it returns (here write + fsync; on Kafka,
  produce with ``acks=all`` and flush), only inside ``exclusive()``.

Every :class:`LedgerRecord` has a ``key``. Records that describe the same
reservation share its key and each carries the full payload (a commit repeats
the reserved events), so log compaction — which keeps only the latest record
per key — never loses a spend.

File format and crash semantics (:class:`FileLedger`)
-----------------------------------------------------
JSON lines, one record per line, each with a CRC-32 of its canonical JSON. A
record is appended with one ``write`` and then ``fsync``'d; the file's directory
is fsync'd when the file is created. Appends happen only under the exclusive
lock, and an append starts only after the previous one was fsync'd, so after a
crash *at most the last line* can be incomplete or garbled (a "torn" write).

A torn last line is ignored on read, and cut off by the next writer (under the
lock) before it appends. That is safe: the writer of the torn line crashed
before its fsync returned, hence before ``reserve()`` returned, hence before
any noise was drawn for it — ignoring it loses no spend. Any *other* unreadable
line cannot come from a crash (every earlier line was fsync'd before the next
was written); it means corruption, and the ledger refuses to be read
(:class:`LedgerCorrupt`) rather than under-count.

Head (count and hash chain)
---------------------------
:func:`ledger_head` summarises a ledger as ``(records, sha256 chain head)``, the
chain being ``h_0 = sha256("streamdp-ledger-v1")``, ``h_i = sha256(h_{i-1} ||
line_i)`` over the canonical encoded lines. The release service mirrors the head
into every release-state and subspace record on Kafka, and refuses to start when
the local ledger does not extend the head Kafka holds (a lost, replaced, truncated
or foreign ledger): see docs/privacy_accounting.md §Ledger bound to the deployment.

Use a local filesystem: ``flock`` is not reliable on NFS. The file *is* the
spent budget: deleting or replacing it resets the accounting, so protect it
(mode 0600, backups) like the raw data. An open :class:`FileLedger` refuses to
recreate a file deleted under it, and refuses a file that shrank below the
records it has already read.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, Iterator, Protocol, runtime_checkable

import fcntl

SCHEMA_VERSION = 1


class LedgerCorrupt(RuntimeError):
    """A ledger line other than the last is unreadable: refuse to under-count."""


@dataclass(frozen=True)
class LedgerRecord:
    """One ledger entry.

    Attributes
    ----------
    kind : str
        What happened ("budget", "reserve", "commit", "refuse"); the ledger
        does not interpret it.
    key : str
        Compaction key: records about the same thing share it.
    payload : dict
        JSON-serialisable body; treat as read-only.
    time : float
        UNIX seconds when the record was created (informational).
    """

    kind: str
    key: str
    payload: dict = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, "kind": self.kind, "key": self.key,
                "time": self.time, "payload": self.payload}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "LedgerRecord":
        if obj.get("v") != SCHEMA_VERSION:
            raise ValueError(f"unsupported ledger record version {obj.get('v')!r}")
        return cls(kind=str(obj["kind"]), key=str(obj["key"]),
                   payload=dict(obj["payload"]), time=float(obj["time"]))


@runtime_checkable
class Ledger(Protocol):
    """Durable, append-only, totally ordered log of :class:`LedgerRecord`."""

    def exclusive(self) -> ContextManager[None]:
        """Hold the writer lock: no other writer appends until it is released."""
        ...

    def read(self) -> list[LedgerRecord]:
        """All complete records, oldest first."""
        ...

    def append(self, record: LedgerRecord) -> None:
        """Append durably (on stable storage when this returns). Inside ``exclusive()`` only."""
        ...


# --------------------------------------------------------------- line format
def _canonical(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      allow_nan=False, ensure_ascii=True).encode("ascii")


def encode_line(record: LedgerRecord) -> bytes:
    """One JSON line: the record plus a CRC-32 of its canonical encoding."""
    body = record.to_json()
    crc = zlib.crc32(_canonical(body))
    return _canonical({"crc": crc, "rec": body}) + b"\n"


def decode_line(line: bytes) -> LedgerRecord:
    """Inverse of :func:`encode_line`; raises ``ValueError`` on any damage."""
    try:
        obj = json.loads(line)
        body = obj["rec"]
        if zlib.crc32(_canonical(body)) != obj["crc"]:
            raise ValueError("CRC mismatch")
        return LedgerRecord.from_json(body)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"bad ledger line: {exc}") from exc


def scan(data: bytes, *, origin: str = "ledger", base: int = 0) -> tuple[list[LedgerRecord], int]:
    """Parse ledger bytes.

    Returns the records and the byte length of the valid prefix (the end of
    the last good line). A damaged *last* line (missing newline, bad JSON or
    CRC) is a torn write and is left out; a damaged line followed by more data
    raises :class:`LedgerCorrupt`. ``base`` is the file offset of ``data``
    (for error messages).
    """
    records: list[LedgerRecord] = []
    pos = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        end = n if nl < 0 else nl + 1
        try:
            if nl < 0:
                raise ValueError("no newline")
            rec = decode_line(data[pos:nl])
        except ValueError as exc:
            if data[end:].strip(b"\n") == b"":      # last line: torn write, ignore
                return records, pos
            raise LedgerCorrupt(f"{origin}: unreadable record at byte {base + pos} "
                                f"followed by more records ({exc})") from exc
        records.append(rec)
        pos = end
    return records, pos


CHAIN_SEED = hashlib.sha256(b"streamdp-ledger-v1").hexdigest()


def chain_step(head: str, record: LedgerRecord) -> str:
    """The chain head after ``record`` (hex sha256 of the previous head and its line)."""
    return hashlib.sha256(bytes.fromhex(head) + encode_line(record)).hexdigest()


def ledger_head(records) -> dict:
    """``{"records": n, "head": hex}`` of a sequence of records (oldest first)."""
    head, n = CHAIN_SEED, 0
    for rec in records:
        head = chain_step(head, rec)
        n += 1
    return {"records": n, "head": head}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileLedger:
    """:class:`Ledger` on a local JSON-lines file (see the module docstring).

    Parameters
    ----------
    path : str or Path
        The ledger file; created (and its directory fsync'd) if missing. The
        parent directory must exist.

    Safe across processes (``fcntl.flock`` on a descriptor opened per
    transaction, so forked children never share a lock) and across threads
    (a per-object re-entrant lock).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._tlock = threading.RLock()
        self._fd: int | None = None       # descriptor holding the flock, while held
        self._depth = 0
        # (device, inode), end of the parsed valid prefix, its records
        self._cache: tuple[tuple[int, int] | None, int, list[LedgerRecord]] = (None, 0, [])
        self._create()

    def __repr__(self) -> str:
        return f"FileLedger({str(self.path)!r})"

    def _create(self) -> None:
        if self.path.exists():
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return                          # another process created it first
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(self.path.parent)        # the new directory entry is durable too

    # ------------------------------------------------------------------ lock
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._tlock:
            if self._depth > 0:              # re-entrant within one thread
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            # No O_CREAT: a ledger deleted behind our back must not silently
            # restart from an empty (fully unspent) file.
            fd = os.open(self.path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._fd, self._depth = fd, 1
                try:
                    yield
                finally:
                    self._fd, self._depth = None, 0
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ read
    def _load(self, fd: int) -> tuple[list[LedgerRecord], int, int]:
        """Records, valid-prefix length and file size, parsing only new bytes.

        The parsed valid prefix is cached: bytes before the end of a good line
        never change (only a torn tail after it is ever cut off). If the file
        was replaced, re-parse it; if it shrank below that prefix, records
        were deleted — refuse.
        """
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        with self._tlock:
            c_ident, c_end, c_records = self._cache
            if c_ident != ident:
                c_end, c_records = 0, []
            if st.st_size < c_end:
                raise LedgerCorrupt(f"{self.path}: shrank to {st.st_size} bytes, below "
                                    f"{c_end} bytes of durable records")
            data = os.pread(fd, st.st_size - c_end, c_end) if st.st_size > c_end else b""
            new, valid = scan(data, origin=str(self.path), base=c_end)
            records = c_records + new
            self._cache = (ident, c_end + valid, records)
            return list(records), c_end + valid, st.st_size

    def read(self) -> list[LedgerRecord]:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return self._load(fd)[0]
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- append
    def append(self, record: LedgerRecord) -> None:
        with self._tlock:
            fd = self._fd
            if fd is None:
                raise RuntimeError("FileLedger.append must be called inside exclusive()")
            line = encode_line(record)
            records, valid, size = self._load(fd)
            if valid < size:
                # A crashed writer left a torn last line (see module docstring):
                # cut it off so the new record starts on a line of its own.
                os.ftruncate(fd, valid)
                os.fsync(fd)
            view = memoryview(line)
            offset = valid
            while view:                         # write() may be partial
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n
            os.fsync(fd)
            ident, _, _ = self._cache
            self._cache = (ident, offset, records + [record])
