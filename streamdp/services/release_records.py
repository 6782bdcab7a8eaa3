"""The release's own Kafka records, written through the deployment's single writer.

:meth:`ReleaseRecords.persist` is step 4 of the spend protocol (docs/services.md, the order in
:mod:`streamdp.services.release`): write one release record in the writer's transaction, then
commit the reservations drawn for it; a fenced or re-initialised writer commits nothing.
Every persisted subspace / vocabulary record is mirrored to the public record sketchers read
(:mod:`streamdp.services.public_records`), and the public release record
(:mod:`streamdp.services.public_release`) follows the release state. A failed public write is
logged and retried (:attr:`ReleaseRecords.mirrors_pending`, :attr:`ReleaseRecords.public_epoch`);
sketchers then wait, they never read the release records.
"""
from __future__ import annotations

import logging
from typing import Callable

from streamdp.kafka.state_errors import WriterFenced, WriterReinitialised
from streamdp.privacy.spend import SpendSession
from streamdp.services import control, public_records, public_release
from streamdp.services.config import ServiceConfig
from streamdp.services.release_writer import ReleaseWriter
from streamdp.services.state_auth import StateAuth

log = logging.getLogger("streamdp.release")

#: release record -> the public record sketchers read instead (streamdp.services.public_records)
MIRRORS = {control.SUBSPACE_KEY: public_records.SUBSPACE_KEY,
           control.VOCABULARY_KEY: public_records.VOCABULARY_KEY}


class ReleaseRecords:
    """Persist release records (then commit their reservations) and keep the public records
    sketchers read in step with them. ``resync`` reloads the durable state after the writer's
    producer was re-created (the service's restore)."""

    def __init__(self, cfg: ServiceConfig, writer: ReleaseWriter, control_key: Callable[[], bytes],
                 spend: SpendSession | None, resync: Callable[[], None]) -> None:
        self.cfg = cfg
        self.writer = writer
        self.spend = spend
        self._control_key = control_key
        self._resync = resync
        self.public_epoch: int | None = None     # epoch of the public release record written
        self.mirrors_pending: set[str] = set()   # public records whose write failed

    @property
    def store(self):
        return self.writer.store

    def persist(self, key: str, payload: bytes, meta: dict) -> bool:
        """Spend protocol steps 3-4: write ``key`` in this writer's transaction, then commit
        the drawn reservations. False (nothing committed, nothing to publish) if fenced."""
        try:
            self.writer.write(key, payload, meta)       # signed (docs/privacy.md §Trust boundary)
        except WriterFenced as exc:
            self.writer.fence(f"release writer epoch {self.writer.writer_epoch} was fenced at Kafka while "
                              f"persisting {key!r} ({exc}); nothing of it was published")
            return False
        except WriterReinitialised as exc:
            # nothing was committed; the new producer (same transactional.id, epoch bumped)
            # writes only after the state is re-validated and reloaded from Kafka
            log.warning("%s", exc)
            if self.spend is not None:
                self.spend.discard()     # uncommitted: fulfilled by the retried release
            self._resync()
            return False
        except BaseException:
            if self.spend is not None:
                self.spend.discard()     # uncommitted: fulfilled by the next start
            raise
        if self.spend is not None:
            self.spend.persisted()
        if key in MIRRORS:                  # what sketchers read: before any announcement
            self.write_mirror(MIRRORS[key], payload, meta)
        return True

    def write_mirror(self, key: str, payload: bytes, meta: dict) -> None:
        """The public record ``key`` (streamdp.services.public_records) of a persisted release
        record: its released fields only, signed. A failure is logged and retried at the next
        step or start (sketchers wait; they never read the release records)."""
        try:
            public_records.write(self.store, self.writer.auth, key, payload, meta)
            self.mirrors_pending.discard(key)
            return
        except WriterFenced as exc:
            self.writer.fence(f"release writer epoch {self.writer.writer_epoch} was fenced at Kafka while "
                              f"writing the public record {key!r} ({exc})")
        except Exception as exc:      # noqa: BLE001 - the release record is durable; retried
            log.warning("the public record %r was not written (%s): sketchers see it when it is",
                        key, exc)
        self.mirrors_pending.add(key)

    def sync_mirrors(self) -> None:
        """Write every public record that is missing or differs from its persisted release
        record (a crash between the two writes; a deployment older than the public records)."""
        for private, key in MIRRORS.items():
            rec = self.store.read_latest(private)
            if rec is None:
                self.mirrors_pending.discard(key)
            elif public_records.same(self.store.read_latest(key), key, rec.payload, rec.meta):
                self.mirrors_pending.discard(key)
            else:
                self.write_mirror(key, rec.payload, rec.meta)

    def write_public(self, epoch: int, models: list[dict], start: str | None) -> None:
        """The public release record (streamdp.services.public_release): the last released
        epoch and the released refinement models, signed; sketchers read it instead of the
        release state. Written after the state persist; a failure is logged and retried at the
        next start-up or release (sketchers then wait, they never read the private state)."""
        payload = public_release.encode(epoch, models, start)
        meta = StateAuth(self._control_key(), self.cfg.topic_prefix).sign(
            public_release.KEY, payload, {"epoch": epoch})
        self.public_epoch = -1             # until written: step() retries
        try:
            self.store.write(public_release.KEY, payload, meta=meta)
            self.public_epoch = epoch
        except WriterFenced as exc:
            self.writer.fence(f"release writer epoch {self.writer.writer_epoch} was fenced at Kafka while "
                              f"writing the public release record ({exc})")
        except Exception as exc:      # noqa: BLE001 - the release is durable; retried later
            log.warning("the public release record of epoch %d was not written (%s): sketchers "
                        "see the release when it is (next release or restart)", epoch, exc)

    def public_behind(self, published_epoch: int) -> bool:
        """Whether the public release record lags the persisted release state at
        ``published_epoch`` (a crash between the two writes, or a deployment older than the
        record)."""
        rec = self.store.read_latest(public_release.KEY)
        return rec is None or int(rec.meta.get("epoch", -1)) != published_epoch
