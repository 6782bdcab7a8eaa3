"""Reading released topic snapshots: the public API for downstream consumers.

A consumer reads snapshots from one of three *sources* (docs/consumers.md):

* a snapshot directory (the release service's ``snapshot_dir``: ``epoch-*.msgpack`` files and
  ``vocabulary.txt``), or one snapshot file;
* the release service over HTTP (its metrics port: ``GET /snapshot/latest.msgpack``,
  ``/snapshot/latest`` as JSON, ``/vocabulary.txt``);
* the snapshots topic on Kafka (``KafkaSource(bootstrap, topic)``; read from the beginning by
  assignment, never committing offsets).

::

    from streamdp import snapshots
    snap = snapshots.latest("snapshots/")              # or "http://release:9400", or a KafkaSource
    for snap in snapshots.follow(source):              # every release once, then new ones as they come
        ...

A snapshot is a :class:`streamdp.snapshot.TopicSnapshot` (``Snapshot`` here), decoded by its own
``from_bytes``: this module only finds the bytes, checks them and orders releases.

**A release and its re-publications.** ``release_id`` identifies a release. The release service
publishes each release once per epoch, after the release is durably recorded, and re-publishes
the *same* release (same ``release_id``, same content) after a restart; so a consumer that sees a
``release_id`` again has seen that release already. A new release has a new ``release_id`` and,
within a deployment, a larger ``epoch``. :func:`follow` and :func:`releases` yield each
``release_id`` once.

Kafka is imported only when a :class:`KafkaSource` is used: the rest of this module (and the
numerical code) never needs it.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, Iterable, Iterator

from streamdp.serialization import SchemaError
from streamdp.snapshot import SCHEMA_VERSION, TopicSnapshot
# the JSON summary is part of this reader API (docs/consumers.md); the release service writes it too
from streamdp.snapshot_summary import SUMMARY_VERSION, privacy_summary, summary
from streamdp import trends as _trends
from streamdp.text.vocabulary import Vocabulary

log = logging.getLogger("streamdp.snapshots")

#: The one snapshot class (the same object as ``streamdp.snapshot.TopicSnapshot``).
Snapshot = TopicSnapshot

#: HTTP paths of the release service (its metrics port).
HTTP_LATEST_MSGPACK = "/snapshot/latest.msgpack"
HTTP_LATEST_JSON = "/snapshot/latest"
HTTP_VOCABULARY = "/vocabulary.txt"

#: Default consumer group of a :class:`KafkaSource` (the ACLs in docs/operations.md allow
#: ``streamdp-snapshot-readers*``); offsets are never committed.
DEFAULT_GROUP_PREFIX = "streamdp-snapshot-readers"

_FILE = re.compile(r"^epoch-(\d+)-(.+)\.msgpack$")


class SnapshotError(SchemaError):
    """Bytes that are not a readable topic snapshot (the message names where they came from)."""


class SourceError(RuntimeError):
    """A source that cannot be read: a missing folder, an unreachable service or broker."""


# ===================================================================== decoding
def read(data: bytes | bytearray | str | os.PathLike) -> Snapshot:
    """One snapshot from its bytes or from a snapshot file.

    Raises :class:`SnapshotError` (a ``ValueError``) naming the file when the bytes are not a
    topic snapshot of a schema version this build reads.
    """
    if isinstance(data, (bytes, bytearray)):
        return _decode(bytes(data), "snapshot bytes")
    path = Path(data)
    if path.is_dir():
        raise SnapshotError(f"{path} is a folder: read() takes one snapshot file; use "
                            "latest(folder) or releases(folder) for a snapshot directory")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot file {path}: {exc.strerror or exc}") from None
    return _decode(raw, str(path))


def _decode(raw: bytes, origin: str) -> Snapshot:
    try:
        snap = TopicSnapshot.from_bytes(raw)
    except SchemaError as exc:
        raise SnapshotError(f"{origin}: not a readable streamdp topic snapshot: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise SnapshotError(f"{origin}: malformed topic snapshot (schema v{SCHEMA_VERSION}): "
                            f"{what}") from None
    k = snap.topic_word.shape[0] if snap.topic_word.ndim == 2 else None
    if k is None or snap.alpha.shape != (k,):
        raise SnapshotError(f"{origin}: malformed topic snapshot: topic_word {snap.topic_word.shape}"
                            f" and alpha {snap.alpha.shape} do not describe k topics")
    if not isinstance(snap.release_id, str) or not snap.release_id or not isinstance(snap.privacy, dict):
        raise SnapshotError(f"{origin}: malformed topic snapshot: release_id must be a non-empty "
                            "string and privacy a map")
    return snap


def _order(snap: Snapshot) -> tuple:
    """Release order: epoch (None, the one-shot engine's, first), then creation time."""
    return (-1 if snap.epoch is None else int(snap.epoch), float(snap.created_at), snap.release_id)


# ===================================================================== sources
class Source:
    """Where snapshots come from. Use :func:`open_source` (or pass a path, URL or
    :class:`KafkaSource` to the functions of this module)."""

    def cursor(self) -> "_Cursor":                 # pragma: no cover - abstract
        raise NotImplementedError

    def vocabulary(self):
        """The public vocabulary the snapshots refer to (``streamdp.text.vocabulary.Vocabulary``),
        or None when this source does not carry it."""
        return None


class _Cursor:
    """One reading session: ``backlog`` (what the source holds now, in release order), then
    ``poll`` (what arrived since). Duplicates are allowed here: :func:`follow` removes them."""

    def backlog(self, latest_only: bool = False) -> Iterator[Snapshot]:   # pragma: no cover
        raise NotImplementedError

    def poll(self, timeout: float) -> list[Snapshot]:                      # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DirectorySource(Source):
    """A release service's ``snapshot_dir`` (``epoch-<epoch>-<release_id>.msgpack`` files), or
    one snapshot file. Files are written atomically (temporary name, then rename), so a file
    seen is complete."""

    def __init__(self, path: str | os.PathLike, *, errors: str = "raise") -> None:
        self.path = Path(path)
        self.errors = _check_errors(errors)

    def __repr__(self) -> str:
        return f"DirectorySource({str(self.path)!r})"

    def files(self) -> list[Path]:
        """The snapshot files now, in release order (epoch, then modification time)."""
        if self.path.is_file():
            return [self.path]
        if not self.path.is_dir():
            raise SourceError(f"no snapshot directory at {self.path} (the release service's "
                              "snapshot_dir)")
        found = []
        for p in self.path.iterdir():
            m = _FILE.match(p.name)
            if m and p.is_file():
                try:
                    found.append((int(m.group(1)), p.stat().st_mtime_ns, p.name, p))
                except FileNotFoundError:        # removed meanwhile
                    continue
        return [p for *_, p in sorted(found)]

    def cursor(self) -> "_DirectoryCursor":
        return _DirectoryCursor(self)

    def vocabulary(self):
        base = self.path.parent if self.path.is_file() else self.path
        p = base / "vocabulary.txt"
        return Vocabulary.load(p) if p.is_file() else None


class _DirectoryCursor(_Cursor):
    def __init__(self, source: DirectorySource) -> None:
        self.source = source
        self.seen: set[str] = set()

    def _read(self, paths: Iterable[Path], *, following: bool = False) -> Iterator[Snapshot]:
        for p in paths:
            self.seen.add(p.name)
            try:
                yield read(p)
            except SnapshotError as exc:
                if following and _being_written(p):
                    # a file still being copied in by a non-atomic writer (the release service
                    # itself renames complete files into place): read it again next poll
                    self.seen.discard(p.name)
                    continue
                if self.source.errors == "raise":
                    raise
                log.warning("skipped: %s", exc)

    def backlog(self, latest_only: bool = False) -> Iterator[Snapshot]:
        files = self.source.files()
        if not latest_only:
            yield from self._read(files)
            return
        self.seen.update(p.name for p in files)
        if not files:
            return
        # the newest epoch's files (one, unless a folder was shared by two deployments)
        top = _FILE.match(files[-1].name)
        same = [p for p in files if top is None or _FILE.match(p.name).group(1) == top.group(1)]
        snaps = list(self._read(same))
        if snaps:
            yield max(snaps, key=_order)

    def poll(self, timeout: float) -> list[Snapshot]:
        new = [p for p in self.source.files() if p.name not in self.seen]
        return list(self._read(new, following=True))


#: while following a folder, an unreadable snapshot file modified less than this long ago is
#: taken as still being written and read again on the next poll, not reported
PARTIAL_FILE_GRACE_SECONDS = 30.0


def _being_written(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime < PARTIAL_FILE_GRACE_SECONDS
    except FileNotFoundError:
        return False


class HttpSource(Source):
    """The release service's HTTP endpoint (its metrics port), e.g. ``http://release:9400``.

    Serves only the latest release: ``follow`` over HTTP sees every release that stays the latest
    for at least one poll interval (releases are hours apart in a deployment; use the topic or
    the files for a complete history).
    """

    def __init__(self, url: str, *, timeout: float = 10.0, headers: dict | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return f"HttpSource({self.url!r})"

    def get(self, path: str) -> bytes | None:
        """The body of ``GET <url><path>``; None for a 404 of a served route (nothing yet)."""
        req = urllib.request.Request(self.url + path,
                                     headers={"Accept-Encoding": "gzip", **self.headers})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                body = r.read()
                gz = r.headers.get("Content-Encoding") == "gzip"
        except urllib.error.HTTPError as exc:
            body = exc.read()
            if exc.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if exc.code == 404:
                try:
                    info = json.loads(body)
                except ValueError:
                    info = {}
                if isinstance(info, dict) and "routes" in info:    # the route itself is unknown
                    raise SourceError(
                        f"{self.url} does not serve {path} (it serves {info['routes']}): is it "
                        "a streamdp release service of this version (its metrics port)?") from None
                return None
            raise SourceError(f"GET {self.url}{path}: HTTP {exc.code}: "
                              f"{body[:200].decode('utf-8', 'replace')}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SourceError(f"cannot reach the release service at {self.url}: {reason}") from None
        return gzip.decompress(body) if gz else body

    def cursor(self) -> "_HttpCursor":
        return _HttpCursor(self)

    def latest(self) -> Snapshot | None:
        raw = self.get(HTTP_LATEST_MSGPACK)
        return None if raw is None else _decode(raw, self.url + HTTP_LATEST_MSGPACK)

    def vocabulary(self):
        raw = self.get(HTTP_VOCABULARY)
        return None if raw is None else Vocabulary.from_bytes(raw, source=self.url + HTTP_VOCABULARY)


class _HttpCursor(_Cursor):
    def __init__(self, source: HttpSource) -> None:
        self.source = source
        self.last: str | None = None

    def backlog(self, latest_only: bool = False) -> Iterator[Snapshot]:
        snap = self.source.latest()
        if snap is not None:
            self.last = snap.release_id
            yield snap

    def poll(self, timeout: float) -> list[Snapshot]:
        time.sleep(timeout)
        try:
            # the small JSON first: the full snapshot only when the release changed
            head = self.source.get(HTTP_LATEST_JSON)
            if head is None or json.loads(head).get("release_id") == self.last:
                return []
            snap = self.source.latest()
        except (SourceError, ValueError) as exc:   # a restarting service: try again next poll
            log.warning("%s (retrying)", exc)
            return []
        if snap is None:
            return []
        self.last = snap.release_id
        return [snap]


class KafkaSource(Source):
    """The snapshots topic (``<topic_prefix>.snapshots``), read from the beginning.

    Reads by assignment (every partition, from the first offset); never commits offsets, so
    ``group_id`` only names the reader (for ACLs: default ``streamdp-snapshot-readers-<random>``).
    ``config``: extra librdkafka settings (security, e.g. ``{"security.protocol": "SASL_SSL",
    ...}``). The end of the backlog is found by end-of-partition events, not by offsets
    (docs/kafka.md: the embedded broker under-reports partition ends).
    """

    def __init__(self, bootstrap: str, topic: str = "streamdp.snapshots", *,
                 group_id: str | None = None, config: dict | None = None,
                 timeout: float = 30.0, errors: str = "raise") -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.group_id = group_id or f"{DEFAULT_GROUP_PREFIX}-{uuid.uuid4().hex[:8]}"
        self.config = dict(config or {})
        self.timeout = float(timeout)
        self.errors = _check_errors(errors)

    def __repr__(self) -> str:
        return f"KafkaSource({self.bootstrap!r}, {self.topic!r})"

    @classmethod
    def from_config(cls, config_file: str | os.PathLike, **kwargs) -> "KafkaSource":
        """The snapshots topic of a deployment's configuration file (bootstrap, topic prefix,
        ``kafka`` client settings)."""
        from streamdp.services.config import from_mapping, load_file
        cfg = from_mapping(load_file(config_file))
        return cls(cfg.bootstrap, cfg.topics.snapshots, config=dict(cfg.kafka), **kwargs)

    def cursor(self) -> "_KafkaCursor":
        return _KafkaCursor(self)


class _KafkaCursor(_Cursor):
    def __init__(self, source: KafkaSource) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

        from streamdp.kafka.topics import client_config
        self.source = source
        conf = client_config(source.bootstrap, "consumer", **{
            "group.id": source.group_id, "enable.auto.commit": False,
            "enable.partition.eof": True, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100})
        conf.update(source.config)
        self.consumer = Consumer(conf)
        try:
            try:
                md = self.consumer.list_topics(source.topic, timeout=min(source.timeout, 15.0))
            except KafkaException as exc:
                raise SourceError(f"cannot reach Kafka at bootstrap {source.bootstrap!r}: "
                                  f"{exc.args[0] if exc.args else exc}") from None
            tmd = md.topics.get(source.topic)
            if tmd is None or tmd.error is not None or not tmd.partitions:
                raise SourceError(f"no topic {source.topic!r} at bootstrap {source.bootstrap!r}"
                                  + (f" ({tmd.error})" if tmd is not None and tmd.error else "")
                                  + ": the deployment's snapshots topic is <topic_prefix>.snapshots")
            self.partitions = sorted(tmd.partitions)
            self.consumer.assign([TopicPartition(source.topic, p, OFFSET_BEGINNING)
                                  for p in self.partitions])
        except BaseException:
            self.consumer.close()
            raise

    def _message(self, m) -> Snapshot | None:
        if m.value() is None:                    # a tombstone: nothing to read
            return None
        where = f"{self.source.topic} partition {m.partition()} offset {m.offset()}"
        try:
            return _decode(m.value(), where)
        except SnapshotError as exc:
            if self.source.errors == "raise":
                raise
            log.warning("skipped: %s", exc)
            return None

    def _error(self, m) -> None:
        raise SourceError(f"reading {self.source.topic} at {self.source.bootstrap}: {m.error()}")

    def backlog(self, latest_only: bool = False) -> Iterator[Snapshot]:
        from confluent_kafka import KafkaError
        eof: set[int] = set()
        held: list[Snapshot] = []
        deadline = time.monotonic() + self.source.timeout
        while len(eof) < len(self.partitions):
            if time.monotonic() > deadline:
                raise SourceError(f"reading {self.source.topic} at {self.source.bootstrap}: no end "
                                  f"of partition(s) {sorted(set(self.partitions) - eof)} within "
                                  f"{self.source.timeout:.0f} s")
            m = self.consumer.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                self._error(m)
            eof.discard(m.partition())
            snap = self._message(m)
            if snap is None:
                continue
            if latest_only:
                if not held or _order(snap) > _order(held[0]):
                    held = [snap]
            else:
                held.append(snap)
        # partitions interleave arbitrarily: the backlog is put in release order
        yield from sorted(held, key=_order)

    def poll(self, timeout: float) -> list[Snapshot]:
        from confluent_kafka import KafkaError
        out: list[Snapshot] = []
        deadline = time.monotonic() + timeout
        while True:
            m = self.consumer.poll(max(0.0, min(0.2, deadline - time.monotonic())))
            if m is not None:
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        self._error(m)
                else:
                    snap = self._message(m)
                    if snap is not None:
                        out.append(snap)
            if time.monotonic() >= deadline:
                return out

    def close(self) -> None:
        self.consumer.close()


def _check_errors(errors: str) -> str:
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    return errors


def open_source(source: Source | str | os.PathLike, **kwargs) -> Source:
    """A :class:`Source` from a path (folder or file), an ``http(s)://`` URL of the release
    service, or ``kafka://BOOTSTRAP/TOPIC`` (e.g. ``kafka://k1:9092,k2:9092/streamdp.snapshots``).
    A :class:`Source` is returned unchanged."""
    if isinstance(source, Source):
        return source
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        return HttpSource(source, **kwargs)
    if isinstance(source, str) and source.startswith("kafka://"):
        rest = source[len("kafka://"):]
        bootstrap, _, topic = rest.partition("/")
        if not bootstrap or not topic:
            raise ValueError(f"{source!r}: a Kafka source is kafka://BOOTSTRAP/TOPIC")
        return KafkaSource(bootstrap, urllib.parse.unquote(topic), **kwargs)
    if isinstance(source, (str, os.PathLike)):
        return DirectorySource(source, **kwargs)
    raise TypeError(f"not a snapshot source: {source!r} (a path, an http:// URL, kafka://... "
                    "or a Source)")


# ===================================================================== the reader API
def latest(source: Source | str | os.PathLike) -> Snapshot | None:
    """The newest release the source holds (largest epoch, then creation time), or None when it
    holds none yet."""
    src = open_source(source)
    if isinstance(src, HttpSource):
        return src.latest()
    with src.cursor() as cur:
        snaps = list(cur.backlog(latest_only=True))
    return max(snaps, key=_order) if snaps else None


def releases(source: Source | str | os.PathLike) -> Iterator[Snapshot]:
    """Every release the source holds now, in release order, each ``release_id`` once
    (re-publications dropped). Over HTTP that is the latest one only."""
    src = open_source(source)
    seen: set[str] = set()
    with src.cursor() as cur:
        for snap in cur.backlog():
            if snap.release_id not in seen:
                seen.add(snap.release_id)
                yield snap


def follow(source: Source | str | os.PathLike, *, start: str = "beginning",
           after_epoch: int | None = None, poll_seconds: float = 1.0,
           idle_timeout: float | None = None,
           stop: threading.Event | Callable[[], bool] | None = None) -> Iterator[Snapshot]:
    """Yield every release once: first those the source holds (``start="beginning"``, in release
    order) or only its newest (``start="latest"``), then each new release as it appears.

    Re-publications of a release already yielded (same ``release_id``, e.g. after a release
    service restart) are skipped. ``after_epoch``: skip releases of epochs ≤ this (the resume
    point of a consumer that stored the last epoch it processed). Stops when ``stop`` is set
    (an Event or a callable returning True) or after ``idle_timeout`` seconds without a new
    release; by default it runs forever.
    """
    if start not in ("beginning", "latest"):
        raise ValueError(f"start must be 'beginning' or 'latest', got {start!r}")
    if not (poll_seconds > 0):
        raise ValueError(f"poll_seconds must be > 0, got {poll_seconds!r}")
    src = open_source(source)
    stopped = (stop.is_set if isinstance(stop, threading.Event) else stop) or (lambda: False)
    seen: set[str] = set()

    def new(snaps: Iterable[Snapshot]) -> Iterator[Snapshot]:
        for snap in snaps:
            if snap.release_id in seen:
                continue                      # a re-publication (or seen in the backlog)
            seen.add(snap.release_id)
            if after_epoch is not None and snap.epoch is not None and snap.epoch <= after_epoch:
                continue
            yield snap

    with src.cursor() as cur:
        last_new = time.monotonic()
        for snap in new(cur.backlog(latest_only=start == "latest")):
            last_new = time.monotonic()
            yield snap
        while not stopped():
            if idle_timeout is not None and time.monotonic() - last_new >= idle_timeout:
                return
            wait = poll_seconds if idle_timeout is None else max(
                0.01, min(poll_seconds, idle_timeout - (time.monotonic() - last_new)))
            for snap in new(sorted(cur.poll(wait), key=_order)):
                last_new = time.monotonic()
                yield snap


def vocabulary(source: Source | str | os.PathLike):
    """The vocabulary the source's snapshots refer to (``Vocabulary``), or None: a snapshot
    directory's ``vocabulary.txt``, the release service's ``GET /vocabulary.txt``. The snapshots
    topic does not carry it: use the file or the HTTP endpoint, and check
    ``vocab.id == snap.vocabulary_id``."""
    return open_source(source).vocabulary()


def trends(source: Source | str | os.PathLike | Iterable[Snapshot], *,
           level: float | None = None, alpha: float | None = None):
    """Topic shares per release with error bars, and significant share changes
    (:class:`streamdp.trends.Trends`), from every release the source holds (or from snapshots
    given in release order). Released values only: each refined release's ``topic_mass`` and
    the known noise of the continual mechanism (docs/consumers.md §Topic trends). Over HTTP
    (the latest release only) there is one point."""
    if isinstance(source, (Source, str, os.PathLike)):
        snaps = list(releases(source))
    else:
        snaps = sorted({s.release_id: s for s in source}.values(), key=_order)
    kw = {}
    if level is not None:
        kw["level"] = level
    if alpha is not None:
        kw["alpha"] = alpha
    return _trends.trends(snaps, **kw)


__all__ = ["Snapshot", "SnapshotError", "SourceError", "Source", "DirectorySource", "HttpSource",
           "KafkaSource", "open_source", "read", "latest", "releases", "follow", "vocabulary",
           "summary", "privacy_summary", "trends", "SUMMARY_VERSION"]
