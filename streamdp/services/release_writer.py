"""The single release writer of a deployment: Kafka fence, ledger binding, local lease.

Single writer per deployment, fenced at Kafka (docs/services.md §Fencing):

* a transactional producer with ``transactional.id = <topic_prefix>-release-writer``
  writes every release record; ``init_transactions()`` at start-up fences any
  older instance, whose next write then fails (:class:`WriterFenced`);
* a writer epoch (fencing token), one more than any seen, is registered under
  ``release/writer`` and carried by every release-state and subspace record; a
  service that sees a newer writer epoch stops spending (:meth:`ReleaseWriter.still_writer`);
* the ledger is bound to the deployment: every release record mirrors the
  ledger head (record count + hash chain); a service whose ledger does not
  extend the head on Kafka refuses to start (ConfigError naming both;
  :func:`bind_ledger`, :func:`check_ledger`).

* one *ready* writer (issue 23 item 9): a service answers ready only while a
  :class:`WriterWatch` confirmed its writer epoch on Kafka within
  ``WRITER_CONFIRM_SECONDS``, and only ``WRITER_TAKEOVER_SECONDS`` after registering it.
  An older writer's last confirmation read started before the new epoch was visible, so its
  readiness lapses before the new writer's begins; the watch also stops it at once.

The ``flock`` lease next to the ledger (:class:`ReleaseLease`) stays as a local convenience
(a clear error for two services on one ledger file); it is not the protection.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from confluent_kafka import Producer

from streamdp.kafka.clients import service_client_config
from streamdp.kafka.connectivity import client_extras
from streamdp.kafka.state_errors import WriterFenced
from streamdp.kafka.state_store import StateStore
from streamdp.privacy.accountant import Accountant, LedgerMismatch, recorded_budget
from streamdp.privacy.ledger import FileLedger, ledger_head
from streamdp.services import control
from streamdp.services.config import ConfigError, ServiceConfig
from streamdp.services.state_auth import MAC_FIELD, StateAuth, StateIntegrityError

log = logging.getLogger("streamdp.release")

WRITER_KEY = "release/writer"          # the registered writer epoch (fencing token)
#: never two ready writers: readiness lapses this long after the last confirmation of the
#: writer epoch; a new writer is ready only this long after registering (> confirm)
WRITER_CONFIRM_SECONDS = 5.0
WRITER_TAKEOVER_SECONDS = 8.0
WRITER_WATCH_SECONDS = 1.0
# records that carry the head of the ledger that paid for them (a private selection's
# vocabulary record only has one when the ledger paid: public/file records are skipped)
SPENT_KEYS = (control.VOCABULARY_KEY, control.WARMUP_PREMISE_KEY, control.WARMUP_DRAW_KEY,
              control.SUBSPACE_KEY, control.RELEASE_STATE_KEY)

LEDGER_FIX = ("Fix: start the release service with the deployment's own ledger file (restore "
              "it from backup to this path or point --ledger at it); never start a spent "
              "deployment on a new ledger - to start over, create a new deployment (new "
              "topic_prefix) with its own budget")


def writer_transactional_id(topic_prefix: str) -> str:
    """The deployment's one release-writer ``transactional.id``."""
    return f"{topic_prefix}-release-writer"


class Fenced(ConfigError):
    """A newer release service took over this deployment: this one must not spend."""


class LeaseHeld(ConfigError):
    """Another release service holds the single-writer lease."""


class ReleaseLease:
    """Exclusive, process-lifetime ``flock`` on ``<ledger>.lease`` (released by the OS on death)."""

    def __init__(self, ledger_path: str) -> None:
        self.path = Path(f"{ledger_path}.lease")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise LeaseHeld(f"another release service holds {self.path}: only one release writer may "
                            "spend the budget; stop it first (or point this one at its own ledger "
                            "for a separate deployment)") from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ------------------------------------------------------------------ signed release records
def check_release_records(cfg: ServiceConfig, recs: dict, auth: StateAuth) -> list[str]:
    """Refuse (ConfigError) the start on any ``release/*`` record without a valid MAC under the
    deployment's key (docs/privacy.md §Trust boundary): forged, edited, written under another
    control key, or copied from another deployment. Returns the keys of records that carry no
    MAC at all when ``sign_unsigned_state`` is set (a deployment older than signed release
    records; :meth:`ReleaseWriter.sign_unsigned` signs them once the writer is open)."""
    unsigned = []
    for key in sorted(recs):
        rec = recs[key]
        if cfg.sign_unsigned_state and MAC_FIELD not in (rec.meta or {}):
            unsigned.append(key)
            continue
        try:
            auth.verify(key, rec)
        except StateIntegrityError as exc:
            legacy = MAC_FIELD not in (rec.meta or {})
            raise ConfigError(
                f"{exc}. The release service refuses to restore from it." + (
                    " If this deployment was started by a streamdp that did not sign its "
                    "release records, and nobody but its release service writes the state "
                    "topic, start once with sign_unsigned_state: true to sign them "
                    "(docs/operations.md \"Signed state records\"); otherwise restore the "
                    "state topic from a backup" if legacy else "")) from None
    return unsigned


# ------------------------------------------------------------------ ledger binding
def spent_records(recs: dict) -> dict:
    """The release records that prove this deployment has spent budget: the subspace and the
    release state; the vocabulary record only if the ledger paid for it (a private selection)."""
    return {k: recs[k] for k in SPENT_KEYS if k in recs
            and (k != control.VOCABULARY_KEY or isinstance(recs[k].meta.get("ledger"), dict))}


def kafka_ledger_head(recs: dict) -> dict | None:
    """The newest ledger head Kafka's release records carry (None: none carries one)."""
    heads = [recs[k].meta["ledger"] for k in SPENT_KEYS
             if k in recs and isinstance(recs[k].meta.get("ledger"), dict)]
    return max(heads, key=lambda h: h["records"]) if heads else None


def _kafka_says(cfg: ServiceConfig, recs: dict) -> str:
    spent = list(spent_records(recs))
    head = kafka_ledger_head(recs)
    return (f"the state topic {cfg.topics.state!r} says deployment {cfg.topic_prefix!r} "
            f"has spent ({', '.join(spent)}"
            + (f"; ledger head {head['records']} records, chain {head['head'][:16]}..."
               if head else "") + ")")


def bind_ledger(cfg: ServiceConfig, recs: dict) -> Accountant:
    """The accountant on the local ledger, refused unless it is this deployment's ledger.

    Kafka's release records (``recs``) carry the ledger head (records + hash chain) of the
    ledger that paid for them. The local ledger must extend that head. A deployment
    that has spent (a subspace or release state exists) never gets a fresh ledger.
    """
    check_ledger_present(cfg, recs)
    path = os.path.abspath(cfg.ledger)
    try:
        acc = Accountant(cfg.epsilon, cfg.delta, FileLedger(path),
                         unit=cfg.privacy_unit)        # the ledger records the unit and checks it
    except LedgerMismatch as exc:
        raise _budget_changed(exc) from exc
    check_ledger(cfg, acc, recs)
    return acc


def _budget_changed(exc: LedgerMismatch) -> ConfigError:
    return ConfigError(f"{exc}. The budget of a deployment cannot change: configure the "
                       "(epsilon, delta) and privacy_unit the ledger records")


def check_ledger_budget(cfg: ServiceConfig) -> None:
    """Refuse an existing ledger that records another (ε, δ, privacy unit) than ``cfg``'s.
    Read-only (no file is created): the release service runs it before it takes the lease, so
    this refusal leaves no ``<ledger>.lease``; :func:`bind_ledger`'s accountant checks it again
    under the ledger's lock."""
    path = os.path.abspath(cfg.ledger)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return                                  # a new ledger: the accountant records cfg's budget
    try:
        recorded_budget(FileLedger(path), cfg.epsilon, cfg.delta, cfg.privacy_unit)
    except LedgerMismatch as exc:
        raise _budget_changed(exc) from exc


def check_ledger_present(cfg: ServiceConfig, recs: dict) -> None:
    """Refuse a missing or empty ledger when Kafka's release records say the deployment spent.
    Read-only: the release service runs it before it takes the lease (issue 25: a refused start
    leaves no file), and :func:`bind_ledger` again under the lease."""
    path = os.path.abspath(cfg.ledger)
    if spent_records(recs) and (not os.path.exists(path) or os.path.getsize(path) == 0):
        raise ConfigError(f"ledger {path} is missing or empty, but {_kafka_says(cfg, recs)}. "
                          f"{LEDGER_FIX}.")


def check_ledger(cfg: ServiceConfig, acc: Accountant, recs: dict) -> None:
    """Refuse unless ``acc``'s ledger extends the ledger head Kafka's release records carry."""
    if not spent_records(recs):
        return
    kafka_head = kafka_ledger_head(recs)
    records = acc.ledger.read()
    if kafka_head is not None:
        n = int(kafka_head["records"])
        ok = len(records) >= n and ledger_head(records[:n])["head"] == kafka_head["head"]
        local = f"{len(records)} records, chain {ledger_head(records)['head'][:16]}…"
    else:       # records written before heads were mirrored: demand some spending
        ok = any(r.kind == "reserve" for r in records)
        local = f"{len(records)} records, {'some' if ok else 'no'} reservations"
    if not ok:
        raise ConfigError(f"ledger {os.path.abspath(cfg.ledger)} ({local}) is not the ledger of "
                          f"this deployment: {_kafka_says(cfg, recs)}. The ledger is behind, "
                          f"truncated, replaced or another deployment's. {LEDGER_FIX}.")


# ------------------------------------------------------------------ the Kafka fence
class ReleaseWriter:
    """The deployment's transactional release writer and its writer epoch.

    :meth:`open` creates the state store on the transactional producer (fencing every older
    writer) and registers the next writer epoch. ``on_fenced(why)`` is called once when this
    writer learns it was taken over (the service then stops spending).
    """

    def __init__(self, cfg: ServiceConfig, on_fenced: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.transactional_id = writer_transactional_id(cfg.topic_prefix)
        self.writer_epoch: int | None = None
        self.store: StateStore | None = None
        self.fenced: str | None = None
        self.registered_at: float | None = None      # monotonic, once registered
        self._on_fenced = on_fenced
        # every release/* record is signed (check_release_records verifies them at start)
        self.auth = StateAuth(control.load_key(cfg), cfg.topic_prefix)

    def open(self) -> StateStore:
        """The release state store on this writer's transactional producer, registered."""
        self.store = StateStore(self.new_producer(), self.cfg.bootstrap, self.cfg.topics.state,
                                consumer_overrides={**client_extras(self.cfg.bootstrap),
                                                    **self.cfg.kafka},
                                owns_producer=True, transactional=True,
                                producer_factory=self.new_producer)
        self.writer_epoch = self.register()
        return self.store

    def records(self) -> dict:
        """The release records on the state topic (``release/*``)."""
        return self.store.read_all_latest(prefix="release/")

    def write(self, key: str, payload: bytes, meta: dict) -> None:
        """Write the release record ``key`` in this writer's transaction, signed."""
        self.store.write(key, payload, meta=self.auth.sign(key, payload, meta))

    def sign_unsigned(self, keys: list[str]) -> None:
        """The one-time migration of ``sign_unsigned_state``: sign the release records that
        :func:`check_release_records` found without a MAC (the newest record of each key)."""
        recs = self.records()
        for key in keys:
            rec = recs.get(key)
            if rec is not None and MAC_FIELD not in (rec.meta or {}):
                self.write(key, rec.payload, dict(rec.meta))
                log.warning("signed the unsigned release record %r (sign_unsigned_state); remove "
                            "sign_unsigned_state from the configuration now", key)

    def new_producer(self) -> Producer:
        """The deployment's transactional producer; ``init_transactions`` fences older ones.

        Also called by the state store to replace a producer that hit a fatal error
        (docs/operations.md §Outages): then, first, a newer registered writer means this
        one was taken over, and it must not fence the new one by re-initialising."""
        if self.writer_epoch is not None:
            newest = self._newest_epoch()
            if newest > self.writer_epoch:
                raise WriterFenced(f"writer epoch {newest} registered after this one's "
                                   f"({self.writer_epoch}): not re-initialising the producer")
        writer = Producer(service_client_config(
            self.cfg.bootstrap, self.cfg.kafka, "producer", **{
            "transactional.id": self.transactional_id, "enable.idempotence": True,
            "acks": "all", "linger.ms": 5}))
        writer.init_transactions(30)
        return writer

    def register(self) -> int:
        """Take the next writer epoch (after init_transactions, so any older writer is fenced)."""
        seen = [int(r.meta.get("writer_epoch", 0)) for r in self.records().values()]
        epoch = max(seen + [0]) + 1
        try:
            self.write(WRITER_KEY, b"", {
                "writer_epoch": epoch, "transactional_id": self.transactional_id,
                "ledger": os.path.abspath(self.cfg.ledger), "host": os.uname().nodename,
                "pid": os.getpid(), "started_at": time.time()})
        except WriterFenced as exc:
            raise Fenced(f"another release service of deployment {self.cfg.topic_prefix!r} started "
                         f"at the same time and fenced this one ({exc}); only one release writer "
                         "may spend the budget") from exc
        self.registered_at = time.monotonic()
        log.info("release writer epoch %d (transactional.id %s)", epoch, self.transactional_id)
        return epoch

    def _newest_epoch(self) -> int:
        rec = self.store.read_latest(WRITER_KEY)
        return 0 if rec is None else int(rec.meta.get("writer_epoch", 0))

    def still_writer(self) -> bool:
        """Whether this service is still the deployment's writer (else: fenced, stop)."""
        if self.fenced:
            return False
        rec = self.store.read_latest(WRITER_KEY)
        newest = 0 if rec is None else int(rec.meta.get("writer_epoch", 0))
        if newest > self.writer_epoch:
            self.fence(f"a newer release service (writer epoch {newest}, ledger "
                       f"{rec.meta.get('ledger')!r} on {rec.meta.get('host')!r}) took over "
                       f"this deployment; this one (writer epoch {self.writer_epoch}) stops "
                       "spending")
            return False
        return True

    def fence(self, why: str) -> None:
        """This writer was taken over (or fenced at Kafka while writing): it stops spending."""
        self.fenced = why
        self._on_fenced(why)


class WriterWatch:
    """Confirms on its own reader and thread, every ``interval`` seconds, that this service is
    still the deployment's writer, and gates its readiness on it (:meth:`gate`).

    A newer registered writer epoch calls ``on_taken_over(why)`` once, at once (the service
    stops answering ready and exits; its main loop fences itself at its next check). A read
    that fails confirms nothing: readiness lapses after ``confirm_seconds`` (never ready on an
    unconfirmed claim)."""

    def __init__(self, writer: ReleaseWriter, reader_factory: Callable[[], StateStore],
                 on_taken_over: Callable[[str], None], *, interval: float = WRITER_WATCH_SECONDS,
                 confirm_seconds: float = WRITER_CONFIRM_SECONDS,
                 takeover_seconds: float = WRITER_TAKEOVER_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not takeover_seconds > confirm_seconds > interval > 0:
            raise ValueError("need takeover_seconds > confirm_seconds > interval > 0")
        self.writer, self._reader_factory = writer, reader_factory
        self._on_taken_over = on_taken_over
        self.interval, self.confirm_seconds = interval, confirm_seconds
        self.takeover_seconds, self._clock = takeover_seconds, clock
        self.confirmed_at: float | None = None    # start of the last read that confirmed
        self.taken_over: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def gate(self) -> tuple[bool, str]:
        if self.taken_over or self.writer.fenced:
            return False, f"fenced: {self.taken_over or self.writer.fenced}"
        now = self._clock()
        if self.writer.registered_at is None or now - self.writer.registered_at < self.takeover_seconds:
            return False, (f"taking over the writer slot: ready {self.takeover_seconds:g} s after "
                           "registering, once any older writer has stopped answering ready")
        if self.confirmed_at is None or now - self.confirmed_at > self.confirm_seconds:
            return False, (f"writer epoch {self.writer.writer_epoch} not confirmed on Kafka in the "
                           f"last {self.confirm_seconds:g} s")
        return True, "ready"

    def check(self, reader: StateStore) -> bool:
        """One confirmation read; False once taken over."""
        started = self._clock()
        rec = reader.read_latest(WRITER_KEY)
        newest = 0 if rec is None else int(rec.meta.get("writer_epoch", 0))
        if newest > (self.writer.writer_epoch or 0):
            self.taken_over = (f"a newer release service (writer epoch {newest}, ledger "
                               f"{rec.meta.get('ledger')!r} on {rec.meta.get('host')!r}) took "
                               f"over this deployment; this one (writer epoch "
                               f"{self.writer.writer_epoch}) stops answering ready and exits")
            self._on_taken_over(self.taken_over)
            return False
        if newest == self.writer.writer_epoch:
            self.confirmed_at = started
        return True

    def start(self) -> "WriterWatch":
        self._thread = threading.Thread(target=self._run, name="release-writer-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        reader = None
        try:
            while not self._stop.is_set():
                try:
                    reader = reader or self._reader_factory()
                    if not self.check(reader):
                        return
                except Exception as exc:     # noqa: BLE001 - an outage: the confirmation lapses
                    log.debug("writer watch: %s", exc)
                self._stop.wait(self.interval)
        finally:
            if reader is not None:
                try:
                    reader.close()
                except Exception:            # noqa: BLE001
                    pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
