"""A lost state topic is refused, never restarted from empty sums (issue 25; docs/operations.md
"The state topic is lost").

The state topic holds what proves a deployment has spent: the warm-up subspace, the release
state (tree/BLT buffers, last snapshot), the ledger heads they carry. If it is deleted,
re-created, emptied by retention or replaced (another cluster, a memory-only broker restarted),
a release service would start from nothing: the sketchers re-read the documents topic from its
beginning and every released epoch would be released again, a second spend of the budget of
the same documents. With the ledger kept, the accountant then refuses each draw with "reservation
... was already committed", which names the symptom, not the loss; with a fresh ledger (the
obvious fix) it re-spends (ε 1.45 of 1.00 measured, issue 25 item 7).

At every start of a private release service, before anything is written, :func:`check` compares
the state topic with the evidence of spending kept elsewhere:

* the local ledger (its committed reservations of the release service's draws),
* the deployment's snapshots topic (records published by earlier releases), and
* the control topic: ``subspace_ready`` / ``epochs_closed`` announcements signed with the
  deployment's key, which the release service sends only after the warm-up subspace or a
  release state is persisted (this catches a deployment that released only its warm-up and
  lost both the state topic and the ledger). Topics with time retention may have dropped them:
  this evidence is best effort; the ledger is the authority.
* the documents topic's cluster: after each spent record (warm-up, epoch release) the release
  service commits offsets on the documents topic for the group :func:`released_group`
  (``streamdp-released.<documents topic>``, :func:`mark_released`). The broker keeps them with
  the documents topic, so a "new deployment" that replaced everything else (state, snapshots and
  control topics, ledger) but reads the same documents is refused too. Brokers drop the
  offsets of a group without members after ``offsets.retention.minutes`` (Kafka: 7 days): the
  marker is refreshed at every release, and is best effort after a longer outage.

Evidence without any spent release record on the state topic is refused with
:class:`StateTopicLost`, a message that says what was lost and what to do. The operator may
proceed knowingly with ``confirm_state_loss: true`` on a *new* ledger (the old one is the record
of the budget already spent, keep it): the start is then recorded on the state topic under
:data:`LOSS_KEY` (signed, with the evidence) and logged as an error. A ledger that already
committed this deployment's draws cannot be reused: its reservations are spent.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from streamdp.kafka.clients import service_client_config
from streamdp.privacy.ledger import FileLedger
from streamdp.services import control
from streamdp.services.config import ConfigError, ServiceConfig

log = logging.getLogger("streamdp.release")

LOSS_KEY = "deployment/state_loss"
#: the idempotency keys of the release service's draws (streamdp.services.release): the private
#: vocabulary selection, the warm-up (clip histogram, range finder), the epochs and their premise
#: checks; a committed one proves this deployment released something
RELEASE_SPEND_PREFIXES = ("vocabulary", "warmup", "tree:epoch=", "tree:premise:epoch=")
#: control messages the release service sends only after a spent record is persisted
SPENT_ANNOUNCEMENTS = ("subspace_ready", "epochs_closed")


class StateTopicLost(ConfigError):
    """Evidence of spending exists, but the state topic holds none of it."""


def ledger_evidence(path: str) -> str | None:
    """What the ledger file at ``path`` proves was released (None: nothing committed)."""
    if not (os.path.isfile(path) and os.path.getsize(path) > 0):
        return None
    commits = sorted({r.key for r in FileLedger(path).read()
                      if r.kind == "commit" and r.key.startswith(RELEASE_SPEND_PREFIXES)})
    if not commits:
        return None
    shown = ", ".join(commits[:4]) + (", ..." if len(commits) > 4 else "")
    return f"the ledger {path} records {len(commits)} committed draw(s) ({shown})"


def published_records(cfg: ServiceConfig, topic: str, timeout: float = 10.0) -> int:
    """How many records ``topic`` holds (high − low watermark over its partitions; 0 if the
    topic does not exist). Reads no record."""
    consumer = Consumer(service_client_config(cfg.bootstrap, cfg.kafka, "consumer", **{
        "group.id": f"streamdp-state-loss-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}))
    try:
        md = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is None or md.error is not None:
            return 0
        total = 0
        for p in md.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            total += max(0, high - low)
        return total
    finally:
        consumer.close()


def announcements(cfg: ServiceConfig, key: bytes, timeout: float = 10.0) -> dict[str, int]:
    """How many release announcements that prove spending (``subspace_ready``,
    ``epochs_closed``) the control topic holds with a valid MAC under ``key`` (by type).
    Reads the topic from its beginning, bounded by ``timeout`` per partition."""
    found: dict[str, int] = {}
    consumer = Consumer(service_client_config(cfg.bootstrap, cfg.kafka, "consumer", **{
        "group.id": f"streamdp-state-loss-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}))
    try:
        topic = cfg.topics.control
        md = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is None or md.error is not None:
            return found
        for p in md.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            deadline, last = time.monotonic() + timeout, low - 1
            while last < high - 1 and time.monotonic() < deadline:
                for m in consumer.consume(num_messages=500, timeout=0.5):
                    if m.error() is not None:
                        continue
                    last = max(last, m.offset())
                    try:
                        msg = control.decode(m.value())
                    except Exception:      # noqa: BLE001 - foreign or bad messages prove nothing
                        continue
                    if msg["type"] in SPENT_ANNOUNCEMENTS and control.authentic(msg, key):
                        found[msg["type"]] = found.get(msg["type"], 0) + 1
        return found
    finally:
        consumer.close()


def released_group(cfg: ServiceConfig) -> str:
    """The consumer group whose committed offsets on the documents topic mark that a release
    service released from it (named after the documents topic, not the ledger or the state)."""
    return f"streamdp-released.{cfg.topics.documents}"


@contextlib.contextmanager
def _marker_partitions(cfg: ServiceConfig, timeout: float):
    """A consumer of :func:`released_group` and the documents topic's partitions ([] if the
    topic is missing), closed on exit."""
    topic = cfg.topics.documents
    consumer = Consumer(service_client_config(cfg.bootstrap, cfg.kafka, "consumer", **{
        "group.id": released_group(cfg), "enable.auto.commit": False}))
    try:
        md = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        ok = md is not None and md.error is None
        yield consumer, [TopicPartition(topic, p) for p in sorted(md.partitions)] if ok else []
    finally:
        consumer.close()


def mark_released(cfg: ServiceConfig, timeout: float = 10.0) -> None:
    """Commit the documents topic's high watermarks for :func:`released_group` (a public marker:
    it says only that this documents topic fed a release). Called after a spent record is
    persisted; raises on a failed commit (the caller logs and retries at the next release)."""
    with _marker_partitions(cfg, timeout) as (consumer, parts):
        if not parts:
            return
        offsets = [TopicPartition(tp.topic, tp.partition,
                                  max(0, consumer.get_watermark_offsets(tp, timeout=timeout)[1]))
                   for tp in parts]
        for tp in consumer.commit(offsets=offsets, asynchronous=False) or []:
            if tp.error is not None:
                raise RuntimeError(f"marking {tp.topic!r} as released: {tp.error}")


def released_marker(cfg: ServiceConfig, timeout: float = 10.0) -> int:
    """How many partitions of the documents topic carry :func:`released_group`'s marker."""
    with _marker_partitions(cfg, timeout) as (consumer, parts):
        if not parts:
            return 0
        got = consumer.committed(parts, timeout=timeout)
        return sum(1 for tp in got if tp.error is None and tp.offset >= 0)


def evidence(cfg: ServiceConfig) -> list[str]:
    """The evidence of spending kept outside the state topic (see the module docstring)."""
    out = []
    led = ledger_evidence(os.path.abspath(cfg.ledger))
    if led:
        out.append(led)
    n = published_records(cfg, cfg.topics.snapshots)
    if n:
        out.append(f"the snapshots topic {cfg.topics.snapshots!r} holds {n} published snapshot "
                   "record(s)")
    said = announcements(cfg, control.load_key(cfg))
    if said:
        out.append(f"the control topic {cfg.topics.control!r} holds the release service's signed "
                   "announcements " + ", ".join(f"{t} x{n}" for t, n in sorted(said.items())))
    marked = released_marker(cfg)
    if marked:
        out.append(f"the documents topic {cfg.topics.documents!r} fed a release before: the group "
                   f"{released_group(cfg)!r} has offsets committed on {marked} of its partitions "
                   "(a new deployment on documents an earlier one released re-spends their "
                   "budget)")
    return out


def check(cfg: ServiceConfig, spent: dict, confirmed: bool = False) -> list[str]:
    """Refuse (:class:`StateTopicLost`) the start of a private release service whose state topic
    has lost what the ledger or the snapshots topic prove was released. ``spent``: the spent
    release records on the state topic (``release_writer.spent_records``). Returns the
    evidence when the operator confirmed the loss (the caller records it), else [].
    ``confirmed``: the state topic holds a valid :data:`LOSS_KEY` record (a loss confirmed
    before, with nothing spent since: a restart needs no second confirmation)."""
    if not cfg.private or spent or confirmed:
        return []
    found = evidence(cfg)
    if not found:
        return []
    led = ledger_evidence(os.path.abspath(cfg.ledger))
    what = (f"The state topic {cfg.topics.state!r} holds no release record of deployment "
            f"{cfg.topic_prefix!r} (no release/subspace, release/warmup_draw or release/tree), "
            f"but {'; '.join(found)}: the state topic was lost (deleted or re-created, emptied "
            "by retention, or a new cluster), or this service points at the wrong bootstrap or "
            "topic_prefix. Starting from empty sums would release the documents already "
            "released a second time and spend their budget again.")
    todo = ("What to do: check bootstrap and topic_prefix; restore the state topic from its "
            "backup or mirror and restart. If it is lost for good, the documents already released "
            "keep their spent budget: start a new deployment (new topic_prefix and ledger) fed "
            "only with documents never released")
    if not cfg.confirm_state_loss:
        raise StateTopicLost(f"{what} {todo}. Only to re-spend the budget on the same documents "
                             "knowingly (their privacy loss adds up): keep this ledger aside, "
                             "start with a new ledger and confirm_state_loss: true "
                             "(docs/operations.md \"The state topic is lost\").")
    if led:
        raise StateTopicLost(f"{what} confirm_state_loss cannot reuse this ledger: its "
                             "reservations are committed (spent). Keep it aside as the record of "
                             "the budget spent, point ledger at a new file and start again. "
                             f"{todo}.")
    log.error("STATE TOPIC LOSS CONFIRMED (confirm_state_loss): %s Starting over on a new ledger; "
              "the documents still in the documents topic are released again and their privacy "
              "loss adds up. Remove confirm_state_loss from the configuration now.", what)
    return found


def record(store, auth, cfg: ServiceConfig, found: list[str]) -> None:
    """Record a confirmed loss on the state topic (signed; read by operators, decides nothing)."""
    meta = {"confirmed_at": time.time(), "evidence": list(found),
            "ledger": os.path.abspath(cfg.ledger), "host": os.uname().nodename}
    store.write(LOSS_KEY, b"", meta=auth.sign(LOSS_KEY, b"", meta))
