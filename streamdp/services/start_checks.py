"""The deployment's start-up checks of a configuration against what the deployment recorded.

A service calls them before it spends any budget: the privacy mode and unit of privacy
(``deployment/privacy`` on the state topic, the ledger), the documents topic's partition count
in user mode, and a first start's ``stream_start``. The configuration itself is data
(:mod:`streamdp.services.config`); these read the deployment's records and the broker.
"""
from __future__ import annotations

from pathlib import Path

from streamdp.errors import ConfigError
from streamdp.kafka.clients import partition_count
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.ledger import FileLedger
from streamdp.services import control, public_records
from streamdp.services.service_config import ServiceConfig
from streamdp.whitening.subspace import Subspace


PRIVACY_MODE_KEY = "deployment/privacy"


def _privacy_marker(cfg: ServiceConfig, document_partitions: int | None) -> dict:
    meta = {"private": True, "epsilon": cfg.epsilon, "delta": cfg.delta,
            "privacy_unit": cfg.privacy_unit}
    if cfg.privacy_unit == "user":
        if document_partitions is None:
            raise ValueError("user mode: the documents topic's partition count is required")
        m, M = cfg.user_bounds
        meta.update(document_partitions=int(document_partitions), max_docs_per_user_epoch=m,
                    max_docs_per_user=M, user_weights=cfg.user_weights,
                    max_users=cfg.max_users)
    return meta


def check_unit(cfg: ServiceConfig, marker: dict, document_partitions: int | None, *,
               store_name: str = "the state topic") -> None:
    """Refuse a service whose unit of privacy, user bounding or documents-partition count
    differs from what the deployment recorded at its first start (``deployment/privacy``).

    The unit is part of the privacy mode: every sum and every ledger event of a deployment is
    calibrated to one unit. In user mode the partition count is fixed too: the rule
    ``partition_for_user(user, n)`` puts a user on one partition only for one n (Kafka can add
    partitions, which re-maps users: a user on two partitions gets two weight sequences)."""
    had = marker.get("privacy_unit", "document")     # markers before issue 16: documents
    if had != cfg.privacy_unit:
        raise ConfigError(
            f"configuration field 'privacy_unit': {store_name!r} records a deployment with "
            f"privacy_unit {had!r}, this service is configured with {cfg.privacy_unit!r}. Every "
            "sum and ledger event of a deployment is calibrated to its unit, which cannot change: "
            f"configure privacy_unit: {had}, or start a new deployment (new topic_prefix and "
            "ledger)")
    if cfg.privacy_unit != "user":
        return
    m, M = cfg.user_bounds
    for name, mine in (("max_docs_per_user_epoch", m), ("max_docs_per_user", M),
                       ("user_weights", cfg.user_weights)):
        if marker.get(name) != mine:
            raise ConfigError(
                f"configuration field {name!r}: the deployment was started with {name} "
                f"{marker.get(name)!r} ({store_name!r}), this service has {mine!r}; the user "
                f"bounding cannot change mid-deployment: configure {marker.get(name)!r}")
    # the admission rule (issue 23): markers before it have no max_users, and their deployments
    # admitted every user they counted (the cap failed closed), so they read as null
    had_k = marker.get("max_users")
    if had_k != cfg.max_users:
        raise ConfigError(
            f"configuration field 'max_users': the deployment was started with max_users "
            f"{had_k!r} ({store_name!r}; null = every user admitted), this service has "
            f"{cfg.max_users!r}. The admission rule decides which users' documents are in sums "
            f"already partly released, so it cannot change mid-deployment: configure "
            f"max_users: {'null' if had_k is None else had_k}, or start a new deployment (new "
            "topic_prefix and ledger)")
    n = marker.get("document_partitions")
    if document_partitions is not None and n != document_partitions:
        raise ConfigError(
            f"the documents topic {cfg.topics.documents!r} has {document_partitions} partitions, "
            f"but this user-level deployment was started with {n} ({store_name!r} records it): "
            "the rule partition_for_user(user, n) keeps each user on one partition only for a "
            "fixed n, so the partition count cannot change. Restore the topic with "
            f"{n} partitions, or start a new deployment (new topic_prefix and ledger)")


def recorded_partitions(store) -> int | None:
    """The documents-partition count a user-level deployment recorded, or None."""
    rec = store.read_latest(PRIVACY_MODE_KEY)
    return None if rec is None else rec.meta.get("document_partitions")


def documents_partition_count(cfg: ServiceConfig) -> int:
    """The documents topic's partition count (ConfigError if the topic does not exist)."""
    n = partition_count(cfg.bootstrap, cfg.kafka, cfg.topics.documents, timeout=10)
    if n is None:
        raise ConfigError(f"privacy_unit: user needs the documents topic "
                          f"{cfg.topics.documents!r} to exist before the services start (its "
                          "partition count is fixed for the deployment): create the topics "
                          "first (streamdp topics / --create-topics)")
    return n


def check_privacy_mode(cfg: ServiceConfig, store=None, *, role: str = "release",
                       document_partitions: int | None = None, record: bool = True) -> None:
    """Start-up check of the deployment's privacy mode (call before any budget is spent).

    * non-private or reproducible-noise configurations log a WARNING, in words;
    * a non-private service refuses to start on a deployment that is private: its
      ledger (release service) holds a budget or spending, or its state topic holds the
      private-deployment marker, a private (DP range finder) subspace or clip bounds;
    * a private release service writes the marker (``deployment/privacy``) to the state
      topic once, so a later non-private service is refused even if the ledger is lost;
      the marker records the unit of privacy, and in user mode the bounding (m, M, weights)
      and the documents topic's partition count (``document_partitions``, required then):
      a service configured otherwise is refused (:func:`check_unit`). In user mode a sketcher
      that starts first writes the marker too. ``record=False``: check only, write nothing
      (the read-only pass before any side effect; the writing call comes after it).
    """
    import logging
    log = logging.getLogger(f"streamdp.{role}")
    if cfg.noise_seed is not None and record:     # said once, by the writing call
        log.warning("INSECURE REPRODUCIBLE NOISE: noise_seed=%s with insecure_reproducible_noise "
                    "and non_production set. Anyone who knows the seed can remove the noise; "
                    "these snapshots carry no privacy guarantee. Never run this in production.",
                    cfg.noise_seed)
    if cfg.private:
        if store is not None:
            rec = store.read_latest(PRIVACY_MODE_KEY)
            # the release service writes the marker; in user mode a sketcher may come first and
            # must not sketch before the partition count is recorded (it writes the same record)
            if rec is None and record and (role == "release" or cfg.privacy_unit == "user"):
                store.write(PRIVACY_MODE_KEY, b"", meta=_privacy_marker(cfg, document_partitions))
                rec = store.read_latest(PRIVACY_MODE_KEY)
            if rec is not None:
                check_unit(cfg, rec.meta, document_partitions, store_name=cfg.topics.state)
        return
    if record:
        log.warning("NON-PRIVATE deployment (non_private: true): no clipping and no noise; every "
                    "snapshot is an exact function of the documents and is marked non-private. "
                    "Never use this mode for data that needs protection.")
    evidence = []
    if role == "release" and cfg.ledger and Path(cfg.ledger).is_file():
        kinds = sorted({r.kind for r in FileLedger(cfg.ledger).read()})
        if kinds:
            evidence.append(f"the ledger {cfg.ledger!r} holds private budget records ({', '.join(kinds)})")
    if store is not None:
        rec = store.read_latest(PRIVACY_MODE_KEY)
        if rec is not None and rec.meta.get("private"):
            evidence.append(f"the state topic {cfg.topics.state!r} records a private deployment "
                            f"(epsilon={rec.meta.get('epsilon')})")
        # a sketcher reads only public records (docs/privacy.md §Trust boundary)
        sub = store.read_latest(control.SUBSPACE_KEY if role == "release"
                                else public_records.SUBSPACE_KEY)
        if sub is not None:
            events = Subspace.from_bytes(sub.payload).provenance.get("events") or []
            clip = sub.meta.get("clip") or {}
            if events or clip != ClipBounds.unclipped().to_dict():
                evidence.append(f"the state topic {cfg.topics.state!r} holds a private warm-up "
                                "subspace (noised, with clip bounds)")
    if evidence:
        raise ConfigError(
            "configuration field 'non_private': this deployment is private - " + "; ".join(evidence)
            + ". A private deployment can never be switched to non-private (un-noised releases "
              "would reveal the documents already promised privacy). Keep its epsilon, or start a "
              "new deployment (new topic_prefix and ledger) for non-private runs.")


def check_stream_start(cfg: ServiceConfig, *, first_start: bool, now: float | None = None) -> None:
    """Refuse a new deployment whose ``stream_start`` lies more than one epoch in the past.

    On its first start the release service would close every epoch since ``stream_start``
    at once: epochs without documents are released empty and each uses up one epoch of the
    horizon (the README's old example closed 322 empty daily epochs in two minutes). A
    replay of past documents (a backfill) says so with ``confirm_backfill: true``. A
    deployment that has started before (``first_start`` false: release state or a ledger
    exists) is never refused: its epochs are already counted.
    """
    import datetime
    import time
    if not first_start or cfg.confirm_backfill:
        return
    now = time.time() if now is None else float(now)
    behind = now - float(cfg.stream_start)
    if behind <= float(cfg.epoch_seconds):
        return
    n = int(behind // float(cfg.epoch_seconds))

    def utc(t: float) -> str:
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    current = float(cfg.stream_start) + n * float(cfg.epoch_seconds)
    raise ConfigError(
        f"configuration field 'stream_start': {cfg.stream_start:.0f} ({utc(cfg.stream_start)}) is "
        f"{n} epoch(s) of {cfg.epoch_seconds:g} s in the past, and this deployment has no release "
        f"state yet: once the warm-up closes, the release service would close those {n} epochs at "
        f"once, releasing every epoch without documents empty and using up {min(n, cfg.horizon)} "
        f"of the horizon's {cfg.horizon} epochs. Fix: set stream_start to now or later (the "
        f"current epoch began at {current:.0f}, {utc(current)}; warm-up documents go before it), "
        "or, if you are replaying documents from that time on purpose, set confirm_backfill: "
        "true (STREAMDP_CONFIRM_BACKFILL=true)")
