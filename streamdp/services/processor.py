"""The Kafka-facing half of a sketcher: a stream processor in the style of Sentry's arroyo.

:class:`StreamProcessor` owns the confluent-kafka consumer, its subscription with
cooperative rebalancing, the commit policy (the commit as a fence against zombies), the
dead-letter policy, pausing/seeking (holds and restores) and the poll loop, health and
rebalance metrics. What is done with the records is the business of a *processing
strategy* (:class:`ProcessingStrategy`; the sketcher's is
:class:`streamdp.services.sketch_strategy.SketchStrategy`). The processor knows nothing of
sketches.

Commit and checkpoint semantics (the one place they are stated)
---------------------------------------------------------------
* The truth is the state topic. For each assigned documents partition the strategy keeps
  a state (the sketcher: a :class:`PartitionState`, sketches + next offset + progress) and
  checkpoints it as one self-sufficient, chunked record on revoke (arroyo's
  ``close``/``join``: before the partition is given up), on SIGTERM, and periodically: a
  partition is *due* ``checkpoint_seconds`` after its last checkpoint (or its restore).
  Periodic checkpoints are spread over loops (issue 24): each loop checkpoints the due
  partitions oldest first, one at a time, and stops once it has spent
  ``checkpoint_budget_seconds``; and all periodic checkpoints together take at most
  ``CHECKPOINT_SHARE`` of the wall time (after a round of ``s`` seconds the next round waits
  ``s / CHECKPOINT_SHARE - s``). A loop therefore never does more than one bounded batch of
  documents plus one bounded round of checkpoints, whatever the partitions owned and the
  backlog, and ``poll()`` stays well inside ``max.poll.interval.ms``; with many partitions
  or large states a partition's checkpoints come less often than ``checkpoint_seconds``
  (a crash then re-reads more input, never loses or double-counts it: below).
  The Kafka consumer-group offset (the checkpoint's next offset) is committed just
  *before* the state write, as a fence (below); it is informational otherwise: on restore
  only the state record counts.
* On assignment the rebalance callback only records the new partitions and assigns them
  *paused*; the poll loop then reads their latest complete state from the state topic,
  seeks each to its ``next_offset`` and resumes it (health stays "not ready" meanwhile).
  No record of a partition reaches the strategy before its state is restored, and a
  record below the restored offset is dropped should one arrive. Documents after the last
  checkpoint are re-read and re-processed; documents before it are never seen again. A
  crash at any point therefore neither loses nor double-counts a document.
* Rebalancing is cooperative (``cooperative-sticky``, incremental assign/unassign): a
  member keeps the partitions that do not move, without a revoke or a checkpoint of them,
  and goes on processing them while others move.
* A batch is validated completely before any state changes; a bad record goes to the
  dead-letter topic with headers saying why (flushed before the commit/checkpoint that
  covers its offset, so it is never lost; after a crash it may be dead-lettered twice;
  the delivery, its retries and the stop are :class:`streamdp.services.dead_letters.DeadLetters`).
  A batch's bad records are *owed* before the first is produced: one whose produce failed (an
  outage, a bug) is produced again at the next step, and :meth:`StreamProcessor.commit`
  refuses any checkpoint past an owed record.
  The strategy never dead-letters or pauses anything itself: after processing what it could
  of a batch it raises one ExceptionGroup of :class:`streamdp.errors.InvalidRecord` (→ the
  dead-letter topic) and :class:`streamdp.errors.NotReady` (→ a hold), and
  :meth:`StreamProcessor.submit` decides, in one place (arroyo's InvalidMessage and
  MessageRejected).
* On ``lost`` partitions (session expired) state is dropped without a checkpoint: another
  member may already own them.
* A partition can be *held* (:meth:`StreamProcessor.hold`): paused and seeked back to the
  record that cannot be processed yet, until the strategy says what it waits for is there
  (the sketcher: the vocabulary, the subspace, a refinement model). The record is re-read
  after resuming.
* A step that fails while acting on its batches (an outage: a hold's pause or seek, a dead
  letter) leaves the consumer past records the strategy has not processed: the next step
  first seeks each such partition back to the strategy's next offset (a held one paused
  again), so they are re-read, never skipped.
* Fencing (issue 15; docs/operations.md §Kafka ACLs): every checkpoint carries a fencing
  token (the consumer-group generation of the partition's assignment, recorded in the
  assign callback) and its next_offset; on restore :func:`select_state` rejects a record
  that goes backwards against one this process accepted. Before writing, the offset
  commit (which the group coordinator refuses from a member that lost its partitions)
  acts as a fence: a zombie drops its state instead of writing.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streamdp import messages
from streamdp.errors import InvalidRecord, NotReady
# re-exported (tests import them from here): MAX_POLL_INTERVAL_MS, DLQ_RETRY_SECONDS,
# DeadLetterUndelivered
from streamdp.services.consumer_client import MAX_POLL_INTERVAL_MS, group_generation  # noqa: F401
from streamdp.services.dead_letters import (  # noqa: F401
    DLQ_RETRY_SECONDS, DeadLetters, DeadLetterUndelivered)

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["CHECKPOINT_BUDGET_SECONDS", "CHECKPOINT_SHARE", "ProcessingStrategy", "StreamProcessor",
           "DLQ_RETRY_SECONDS", "DeadLetterUndelivered", "MAX_POLL_INTERVAL_MS"]

log = logging.getLogger("streamdp.sketcher")

#: periodic-checkpoint time per loop (a round stops once past it; at least one partition is
#: written per round, so one partition's checkpoint must fit in max.poll.interval.ms)
CHECKPOINT_BUDGET_SECONDS = 2.0
#: the largest share of wall time that periodic checkpoints may take together: with many
#: partitions or large states their interval stretches instead of starving the documents
#: (issue 24: 24 partitions' checkpoints every 5 s took the whole loop, and more)
CHECKPOINT_SHARE = 0.1


class ProcessingStrategy(Protocol):
    """What a :class:`StreamProcessor` drives: the work on the partitions of the current
    assignment. Unlike arroyo's Python strategies (one per assignment, closed and recreated
    at every rebalance) it is updated incrementally, as arroyo's Rust ``update_partitions``:
    under cooperative rebalancing a partition that stays is never checkpointed for a move."""

    def owns(self, partition: int) -> bool:
        """A restored partition of the current assignment."""

    def partitions(self) -> list[int]:
        """The restored partitions of the current assignment."""

    def restore(self, assigned: dict[int, int | None]) -> dict[int, int]:
        """Take the newly assigned partitions (partition -> consumer-group generation of the
        assignment), restore their state; return where each starts (offset or logical)."""

    def submit(self, partition: int, batch: list) -> None:
        """Process one poll batch of ``partition`` (records in offset order); then raise an
        ExceptionGroup of InvalidRecord (its bad records) and NotReady (where it must wait)."""

    def unsaved(self, partition: int) -> int | None:
        """The next offset of ``partition`` if it has unsaved changes, else None."""

    def revoke(self, partitions: list[int]) -> None:
        """Checkpoint, then forget these partitions (arroyo's close + join); the processor
        passed their commit fence just before (a fenced one was :meth:`lost` instead)."""

    def lost(self, partitions: list[int]) -> None:
        """Forget these partitions without a checkpoint (another member may own them)."""

    def poll(self, holds: dict[int, str]) -> None:
        """Scheduled work once per loop (control messages, refreshes for held partitions)."""

    def ready(self, partition: int, need: str) -> bool:
        """Is what held ``partition`` (``need``) there now?"""

    def resumed(self, partitions: list[int]) -> None:
        """These held partitions were resumed."""

    def checkpoint(self, partition: int) -> None:
        """Checkpoint this partition if it has unsaved changes (after the commit fence)."""


class StreamProcessor:
    """The consumer, rebalances, commits/fencing, dead letters, holds and the poll loop of
    one sketcher (module docstring: the semantics). ``consumer``, ``producer``: confluent-
    kafka clients (made by the caller, :func:`consumer_settings`); the processor closes the
    consumer and flushes the producer on :meth:`close`."""

    def __init__(self, consumer, producer, strategy: ProcessingStrategy, *, topic: str,
                 dlq_topic: str, metrics, health, instance: str, batch_size: int,
                 poll_seconds: float, checkpoint_seconds: float, cooperative: bool = True,
                 checkpoint_budget_seconds: float = CHECKPOINT_BUDGET_SECONDS,
                 checkpoint_share: float = CHECKPOINT_SHARE) -> None:
        self.consumer, self.producer, self.strategy = consumer, producer, strategy
        self.topic = topic
        self.metrics, self.health, self.instance = metrics, health, instance
        self.batch_size, self.poll_seconds = batch_size, poll_seconds
        self.checkpoint_seconds = checkpoint_seconds
        self.checkpoint_budget_seconds = checkpoint_budget_seconds
        self.checkpoint_share = checkpoint_share
        self.cooperative = cooperative
        self.holds: dict[int, str] = {}         # partition -> what it waits for
        self._held_since: dict[int, float] = {}  # partition -> Unix time its hold began
        self.restoring: dict[int, int | None] = {}   # assigned, not restored: -> group generation
        self._start_at: dict[int, int] = {}     # restored at this offset; first batch checked
        self._rewind: dict[int, int] = {}       # a failed step's partitions -> offset to re-read
        self.fenced_writes = 0                  # checkpoints refused because the partition was lost
        #: the last rebalance callbacks, in order: (kind, partitions), kind assign/revoke/lost
        self.rebalance_log: deque[tuple[str, list[int]]] = deque(maxlen=256)
        #: restored partition -> monotonic time of its last checkpoint (or restore): when due
        self.checkpointed_at: dict[int, float] = {}
        self._next_round = 0.0                  # monotonic: no periodic round before (CHECKPOINT_SHARE)
        self.longest_loop = 0.0                 # seconds (also streamdp_poll_loop_longest_seconds)
        self.dead_letters = DeadLetters(producer, dlq_topic, topic=topic, metrics=metrics,
                                        health=health, instance=instance)

    @property
    def last_checkpoint(self) -> float:
        """The oldest partition's last checkpoint (monotonic; now if none is restored)."""
        return min(self.checkpointed_at.values(), default=time.monotonic())

    @last_checkpoint.setter
    def last_checkpoint(self, at: float) -> None:
        """Count every partition's next periodic checkpoint from ``at``."""
        for p in self.checkpointed_at:
            self.checkpointed_at[p] = at

    # ------------------------------------------------------------ subscription
    def subscribe(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=self.on_assign,
                                on_revoke=self.on_revoke, on_lost=self.on_lost)

    def owned(self) -> list[int]:
        """The partitions of the current assignment (restored or being restored)."""
        return sorted(set(self.restoring) | set(self.strategy.partitions()))

    # ------------------------------------------------------------ rebalance callbacks
    def on_assign(self, consumer, partitions) -> None:
        """Record the new partitions and assign them paused: their state is read by the
        poll loop (:meth:`restore_pending`), not here, so the rebalance completes at once."""
        self.health.beat()
        generation = group_generation(consumer)
        for tp in partitions:
            self.restoring[tp.partition] = generation
        if self.cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        if partitions:
            consumer.pause(partitions)
        self.rebalance_log.append(("assign", sorted(tp.partition for tp in partitions)))
        if partitions:
            log.info("%s: partitions %s added (generation %s), paused until restored", self.instance,
                     sorted(tp.partition for tp in partitions), generation)
        if self.restoring:
            self.health.set_ready(False, "restoring state")
        else:
            self._assigned()

    def on_revoke(self, consumer, partitions) -> None:
        revoked = [tp.partition for tp in partitions]
        self.rebalance_log.append(("revoke", sorted(revoked)))
        for p in revoked:
            self.restoring.pop(p, None)         # never restored: nothing to checkpoint
            self._start_at.pop(p, None)
            self._rewind.pop(p, None)
            self.checkpointed_at.pop(p, None)
        try:
            for p in revoked:                   # the fences first; a fenced one is not written
                self._fence(p)
            self.strategy.revoke(revoked)       # checkpoint before the partitions are given up
        finally:                                # given up even if that fails (the last one counts)
            for p in revoked:
                self.holds.pop(p, None)
            if self.cooperative:
                consumer.incremental_unassign(partitions)
            self.metrics.rebalance("revoke", assigned=len(self.owned()))
            log.info("%s: revoked %s, keeping %s", self.instance, sorted(revoked), self.owned())

    def on_lost(self, consumer, partitions) -> None:
        lost = [tp.partition for tp in partitions]
        self.rebalance_log.append(("lost", sorted(lost)))
        for p in lost:
            self.restoring.pop(p, None)
            self._start_at.pop(p, None)
            self._rewind.pop(p, None)
            self.holds.pop(p, None)
            self.checkpointed_at.pop(p, None)
        self.dead_letters.forget(lost)
        self.strategy.lost(lost)
        if self.cooperative:
            consumer.incremental_unassign(partitions)
        self.metrics.rebalance("lost", assigned=len(self.owned()))
        log.warning("%s: lost %s (no checkpoint), keeping %s", self.instance, sorted(lost), self.owned())

    def _assigned(self) -> None:
        owned = self.owned()
        self.metrics.rebalance("assign", assigned=len(owned))
        self.health.set_ready(True, f"{len(owned)} partition(s) assigned and restored")
        log.info("%s: assigned %s", self.instance, owned)

    def restore_pending(self) -> None:
        """Restore the partitions assigned since the last loop: the strategy reads their
        state, each is seeked to where it starts and resumed (unless held)."""
        pending = dict(self.restoring)
        self.health.set_ready(False, "restoring state")
        self.health.beat()
        starts = self.strategy.restore(pending)
        self.health.beat()
        restored_at = time.monotonic()
        for p, offset in starts.items():
            self.checkpointed_at[p] = restored_at
            self.consumer.seek(TopicPartition(self.topic, p, offset))
            if offset >= 0:
                self._start_at[p] = offset
        go = [p for p in starts if p not in self.holds]
        if go:
            self.consumer.resume([TopicPartition(self.topic, p) for p in go])
        for p in pending:
            self.restoring.pop(p, None)
        self._assigned()

    def _first_batch(self, p: int, batch: list) -> list:
        """The first batch after a restore starts at the restored offset (the seek made
        sure); anything below it is already in the state and is dropped, never re-counted."""
        start = self._start_at.pop(p)
        if batch[0].offset() < start:
            log.warning("%s: partition %d: records from offset %d, the restored state starts at "
                        "%d: dropping the records below it", self.instance, p, batch[0].offset(), start)
            batch = [m for m in batch if m.offset() >= start]
        return batch

    # ------------------------------------------------------------ the loop
    def step(self) -> None:
        """One loop: restore new partitions, one ``consume`` of at most ``batch_size``
        records, their processing, scheduled work, one bounded round of due checkpoints."""
        t0 = time.monotonic()
        try:
            self._step()
        finally:
            seconds = time.monotonic() - t0
            if seconds > self.longest_loop:
                self.longest_loop = seconds
            self.metrics.loop(seconds)

    def _step(self) -> None:
        for m, exc in self.dead_letters.owed_records():   # a failed step's letters first
            self.dead_letter(m, exc)
        if self._rewind:
            self._seek_back()
        if self.restoring:
            self.restore_pending()
        msgs = self.consumer.consume(num_messages=self.batch_size, timeout=self.poll_seconds)
        self.health.beat()
        by_partition: dict[int, list] = defaultdict(list)
        for m in msgs:
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", m.error())
                continue
            by_partition[m.partition()].append(m)
        strategy = self.strategy
        batches = []
        for p, batch in by_partition.items():
            if p in self._start_at:
                batch = self._first_batch(p, batch)
            if batch and strategy.owns(p) and p not in self.holds:
                batches.append((p, batch))
        for i, (p, batch) in enumerate(batches):
            try:
                self.submit(p, batch)
            except BaseException:
                self._remember_rewind(batches[i:])
                raise
        strategy.poll(self.holds)
        ready = [p for p, need in self.holds.items() if strategy.ready(p, need)]
        if ready:
            self.consumer.resume([TopicPartition(self.topic, p) for p in ready])
            for p in ready:
                del self.holds[p]
            strategy.resumed(ready)
        self.checkpoint_due()
        self._export_pauses()

    def _remember_rewind(self, batches: list[tuple[int, list]]) -> None:
        """A step failed (an outage, most often) while acting on ``batches``, the first one's
        submit included: the consumer is past records the strategy has not processed — the
        rest of that batch after a hold that was not applied, the later partitions' batches.
        Each is re-read from the strategy's next offset (the batch's first offset if the
        strategy did not get to it), sought at the start of the next step, which a guarded
        loop runs once Kafka answers again; without it those records were skipped, and the
        next batch moved the partition's next offset past them (lost)."""
        for j, (p, batch) in enumerate(batches):
            at = self.strategy.unsaved(p) if j == 0 else None
            self._rewind[p] = batch[0].offset() if at is None else at

    def _seek_back(self) -> None:
        """Seek the partitions of a failed step back to their re-read offset, a held one paused
        again (each one forgotten once sought: a seek that fails is tried again at the next
        step)."""
        for p, offset in sorted(self._rewind.items()):
            if self.strategy.owns(p) and p not in self.restoring:
                if p in self.holds:             # a hold whose pause may have failed
                    self.consumer.pause([TopicPartition(self.topic, p)])
                self.consumer.seek(TopicPartition(self.topic, p, offset))
                log.info("%s: partition %d re-read from offset %d after a failed step",
                         self.instance, p, offset)
            del self._rewind[p]

    def checkpoint_due(self) -> int:
        """One round of periodic checkpoints (module docstring): the partitions due, oldest
        first, until ``checkpoint_budget_seconds`` is spent; none while the share of time
        allowed to checkpoints is used up. Returns how many were checkpointed."""
        now = time.monotonic()
        if now < self._next_round:
            return 0
        due = sorted((at, p) for p, at in self.checkpointed_at.items()
                     if now - at >= self.checkpoint_seconds and self.strategy.owns(p))
        n = 0
        for _, p in due:
            self.checkpoint(p)
            if self.strategy.owns(p):           # not dropped by the commit fence
                self.checkpointed_at[p] = time.monotonic()
            n += 1
            if time.monotonic() - now >= self.checkpoint_budget_seconds:
                break
        if n:
            spent = time.monotonic() - now
            self._next_round = now + spent / self.checkpoint_share
        return n

    def _export_pauses(self) -> None:
        """``streamdp_partitions_paused{reason}`` and the oldest hold's age, once per loop
        (holds and restores change only inside :meth:`step`, rebalance callbacks included)."""
        for p in [p for p in self._held_since if p not in self.holds]:
            del self._held_since[p]
        paused = {**{p: "restoring" for p in self.restoring}, **self.holds}
        self.metrics.set_paused(paused, min(self._held_since.values(), default=None))

    def checkpoint_all(self) -> None:
        """Checkpoint every partition now (SIGTERM, the end of a run). With many large states
        this takes longer than ``max.poll.interval.ms``: the partitions are paused and the
        consumer polled between two checkpoints, so the member stays in the group (and its
        commit fence keeps passing) however long the whole takes."""
        owned = [p for p in self.strategy.partitions()]
        running = [p for p in owned if p not in self.holds and p not in self.restoring]
        if running:
            self.consumer.pause([TopicPartition(self.topic, p) for p in running])
        try:
            for p in owned:
                self.checkpoint(p)
                if p in self.checkpointed_at:
                    self.checkpointed_at[p] = time.monotonic()
                self._keep_alive()
        finally:
            back = [p for p in running if self.strategy.owns(p) and p not in self.holds]
            if back:
                self.consumer.resume([TopicPartition(self.topic, p) for p in back])

    def _keep_alive(self) -> None:
        """A poll with every partition paused: resets librdkafka's max.poll.interval.ms timer
        and serves rebalance callbacks. A record that still arrives is not processed: its
        partition is seeked back to it (read again after resuming, as a hold does)."""
        first: dict[int, int] = {}
        for m in self.consumer.consume(num_messages=self.batch_size, timeout=0):
            if m.error() is None and m.partition() not in first:
                first[m.partition()] = m.offset()
        for p, offset in first.items():
            self.consumer.seek(TopicPartition(self.topic, p, offset))

    def close(self) -> None:
        """Leave the group (the revoke callback checkpoints what is left), flush dead letters."""
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)

    # ------------------------------------------------------------ what the strategy raised
    def submit(self, p: int, batch: list) -> None:
        """Hand one batch of partition ``p`` to the strategy and act on what it raises: the
        one place deciding what a record that was not processed becomes. An InvalidRecord is
        dead-lettered (every one, in offset order); a NotReady holds its partition at its
        offset. The strategy raises them after its state update, together."""
        try:
            self.strategy.submit(p, batch)
        except* InvalidRecord as group:
            # owed first: if a letter fails (an outage, a bug), the rest are not forgotten
            self.dead_letters.owe([(exc.record, exc.error) for exc in group.exceptions])
            for exc in group.exceptions:
                self.dead_letter(exc.record, exc.error)
        except* NotReady as group:
            for exc in group.exceptions:
                self.hold(exc.partition, exc.offset, exc.need, exc.what)

    # ------------------------------------------------------------ holds
    def hold(self, p: int, offset: int, need: str, what: str | None = None) -> None:
        """Hold partition ``p`` at ``offset`` (that record is re-read after resuming) until
        the strategy says ``need`` is there (:meth:`ProcessingStrategy.ready`)."""
        # recorded first: if the pause or the seek fails (an outage), the hold still stands and
        # the next step's _seek_back pauses and seeks it (it is resumed only when ready)
        self.holds[p] = need
        self._held_since.setdefault(p, time.time())
        self.consumer.pause([TopicPartition(self.topic, p)])
        self.consumer.seek(TopicPartition(self.topic, p, offset))
        log.info("%s: partition %d paused at offset %d until the %s is released",
                 self.instance, p, offset, what or need)

    # ------------------------------------------------------------ dead letters
    def dead_letter(self, m, exc: messages.InvalidMessage) -> None:
        """Produce ``m`` to the dead-letter topic with headers saying why (made durable by
        :meth:`commit` before a checkpoint covers its offset; :class:`DeadLetters`)."""
        self.dead_letters.dead_letter(m, exc)

    @property
    def dlq_topic(self) -> str:
        return self.dead_letters.dlq_topic

    @dlq_topic.setter
    def dlq_topic(self, topic: str) -> None:
        self.dead_letters.dlq_topic = topic

    @property
    def dlq_lost(self) -> str | None:
        """Why the sketcher stops, once a dead letter could not be delivered (else None)."""
        return self.dead_letters.dlq_lost

    # ------------------------------------------------------------ checkpoints and commits
    def checkpoint(self, p: int) -> None:
        """Checkpoint partition ``p`` if it has unsaved changes: the commit fence (dead
        letters made durable, offset committed), then the strategy's state write; a fenced
        partition is dropped unwritten (:meth:`ProcessingStrategy.lost`)."""
        if self._fence(p):
            self.strategy.checkpoint(p)

    def _fence(self, p: int) -> bool:
        """:meth:`commit` of ``p``'s unsaved next offset; False (and ``p`` forgotten) if
        fenced. Nothing unsaved: nothing to commit, True."""
        offset = self.strategy.unsaved(p)
        if offset is None or self.commit(p, offset):
            return True
        self.strategy.lost([p])
        return False

    def commit(self, p: int, next_offset: int) -> bool:
        """Before a checkpoint of partition ``p`` up to ``next_offset``: make the dead
        letters durable, then commit the offset as a fence. False: the partition is no
        longer ours (a zombie), the caller must drop its state without writing it.
        Raises DeadLetterUndelivered if a bad record below ``next_offset`` is still owed to
        the dead-letter topic (its produce failed): no checkpoint covers it, a restart
        re-reads it."""
        owed = self.dead_letters.owed_below(p, next_offset)
        if owed:
            why = (f"partition {p}: {len(owed)} bad record(s) not dead-lettered yet (first "
                   f"offset {owed[0]}): not checkpointing past them (a restart re-reads them)")
            log.error("%s: %s", self.instance, why)
            raise DeadLetterUndelivered(why)
        # DLQ records for the offsets this checkpoint covers must be durable first: every
        # delivery report checked, refused ones retried, then the sketcher stops.
        self.dead_letters.confirm()
        # Fence: the group coordinator refuses a commit from a member that lost its
        # partitions (UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION; measured on Tansu too). A
        # zombie then drops the partition instead of overwriting the new owner's state;
        # readers reject what slips through this check (select_state).
        try:
            self.consumer.commit(offsets=[TopicPartition(self.topic, p, next_offset)],
                                 asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in _FENCED_COMMIT:
                self.fenced_writes += 1
                log.warning("%s: partition %d is no longer ours (%s): dropping its state without "
                            "a checkpoint", self.instance, p, err)
                self.holds.pop(p, None)
                return False
            log.debug("offset commit failed (state is the truth): %s", exc)
        except Exception as exc:                # noqa: BLE001 — offsets are informational
            log.debug("offset commit failed (state is the truth): %s", exc)
        return True


_FENCED_COMMIT = {KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                  KafkaError.FENCED_INSTANCE_ID}
