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

* the local ledger (its committed reservations of the release service's draws), and
* the deployment's snapshots topic (records published by earlier releases).

Evidence without any spent release record on the state topic is refused with
:class:`StateTopicLost`, a message that says what was lost and what to do. The operator may
proceed knowingly with ``confirm_state_loss: true`` on a *new* ledger (the old one is the record
of the budget already spent, keep it): the start is then recorded on the state topic under
:data:`LOSS_KEY` (signed, with the evidence) and logged as an error. A ledger that already
committed this deployment's draws cannot be reused: its reservations are spent.
"""
from __future__ import annotations

import logging
import os
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from streamdp.kafka.clients import service_client_config
from streamdp.privacy.ledger import FileLedger
from streamdp.services.config import ConfigError, ServiceConfig

log = logging.getLogger("streamdp.release")

LOSS_KEY = "deployment/state_loss"
#: the idempotency keys of the release service's draws (streamdp.services.release): the private
#: vocabulary selection, the warm-up (clip histogram, range finder), the epochs; a committed one
#: proves this deployment released something
RELEASE_SPEND_PREFIXES = ("vocabulary", "warmup", "tree:epoch=")


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
