"""The sketcher service: a consumer-group member that sketches its partitions.

A :class:`Sketcher` is two parts, as in Sentry's arroyo:

* :class:`streamdp.services.processor.StreamProcessor`: Kafka-facing and generic — the
  consumer and its cooperative rebalancing, restores with the partitions paused, the commit
  fence, dead letters, holds, the poll loop, health and rebalance metrics. Its module
  docstring states the commit and checkpoint semantics (the one place they are stated).
* :class:`streamdp.services.sketch_strategy.SketchStrategy`: the per-assignment work —
  routing and the :class:`PartitionState` of each assigned partition, restored on assign,
  checkpointed on revoke — with :class:`streamdp.services.sketch_context.SketchContext`, what
  the partitions share (vocabulary, subspace, refinement models, control messages, the state
  store). Its module docstring states the vocabulary, time, refinement and control rules.

This class builds both from a :class:`ServiceConfig`, runs the loop with the outage guard
and signals, and keeps the attributes the rest of the code base reads (``states``,
``paused``, ``subspace``, ...) as views of the two parts.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from streamdp.kafka.clients import open_state_store, service_client_config
from streamdp.kafka.connectivity import BrokerProbe, OutageGuard, check_bootstrap
from streamdp.kafka.topics import TopicConfigError, check_broker_time
from streamdp.observability.health import HealthState
from streamdp.observability.http_server import ObservabilityServer
from streamdp.observability.service_metrics import ServiceMetrics
from streamdp.services import control
from streamdp.services.contract import check_contract, record_contract
from streamdp.services.record_limits import check_limits, vocabulary_size
from streamdp.services.config import ConfigError, ServiceConfig
from streamdp.services.start_checks import check_privacy_mode, documents_partition_count
from streamdp.services.consumer_client import consumer_settings
from streamdp.services.processor import StreamProcessor
from streamdp.services.sketch_context import SketchContext, initial_vocabulary
from streamdp.services.sketch_strategy import SketchStrategy

log = logging.getLogger("streamdp.sketcher")


class _Via:
    """An attribute of the Sketcher that lives in one of its parts (read and written there)."""

    def __init__(self, part: str, name: str | None = None) -> None:
        self.part, self.name = part, name

    def __set_name__(self, owner, name: str) -> None:
        self.name = self.name or name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj, value) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class Sketcher:
    """One sketcher process (see the module docstring for its parts and where the semantics
    are stated)."""

    def __init__(self, cfg: ServiceConfig, *, instance: str | None = None) -> None:
        self.cfg = cfg
        self.instance = instance or f"sketcher-{uuid.uuid4().hex[:8]}"
        # every refusal before any side effect (issue 25): vocabulary, broker, key, contract
        vocabulary, candidates = initial_vocabulary(cfg)
        check_bootstrap(service_client_config(cfg.bootstrap, cfg.kafka, "admin"))  # fail fast
        try:
            control_key = control.load_key(cfg)
        except control.ControlKeyError as exc:
            raise ConfigError(str(exc)) from None
        self.topics = cfg.topics
        self.metrics = ServiceMetrics("sketcher", exact_counts=cfg.metrics_exact_counts)
        self.health = HealthState(liveness_timeout=cfg.liveness_seconds)
        self.metrics.bind_health(self.health)
        self._stop = threading.Event()
        if cfg.broker_time_required:
            try:
                check_broker_time(service_client_config(cfg.bootstrap, cfg.kafka, "admin"),
                                  cfg.topics.documents)
            except TopicConfigError as exc:
                raise ConfigError(str(exc)) from None
        store = open_state_store(cfg.bootstrap, cfg.kafka, cfg.topics.state)
        # user mode: the documents partition count is recorded (or checked) before anything runs
        user_partitions = documents_partition_count(cfg) if cfg.privacy_unit == "user" else None
        check_privacy_mode(cfg, store, role="sketcher", record=False,   # read-only checks
                           document_partitions=user_partitions)
        contract, record = check_contract(cfg, store, role="sketcher")
        check_limits(cfg, vocabulary_size(cfg, vocabulary), [cfg.topics.dlq, cfg.topics.state])
        check_privacy_mode(cfg, store, role="sketcher",   # never private -> non-private;
                           document_partitions=user_partitions)   # the unit never changes
        if record:                               # the first service of the deployment
            record_contract(cfg, store, contract, role="sketcher")
        producer = Producer(service_client_config(cfg.bootstrap, cfg.kafka, "producer", **{
            "enable.idempotence": True, "acks": "all", "linger.ms": 20}))
        consumer = Consumer(service_client_config(
            cfg.bootstrap, cfg.kafka, "consumer",
            **consumer_settings(self.instance, cfg.group_id, stats_cb=self.metrics.set_lag_from_stats)))
        control_consumer = Consumer(service_client_config(cfg.bootstrap, cfg.kafka, "consumer", **{
            "group.id": f"{self.instance}-control", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}))
        control_consumer.assign([TopicPartition(self.topics.control, 0, OFFSET_BEGINNING)])
        self.context = SketchContext(cfg, instance=self.instance, store=store,
                                     control_consumer=control_consumer, control_key=control_key,
                                     vocabulary=vocabulary, candidates=candidates,
                                     user_partitions=user_partitions)
        self.context.metrics = self.metrics
        self.strategy = SketchStrategy(self.context, self.metrics)
        self.processor = StreamProcessor(
            consumer, producer, self.strategy, topic=self.topics.documents, dlq_topic=self.topics.dlq,
            metrics=self.metrics, health=self.health, instance=self.instance,
            batch_size=cfg.batch_size, poll_seconds=cfg.poll_seconds,
            checkpoint_seconds=cfg.checkpoint_seconds)
        self.server: ObservabilityServer | None = None

    # the parts' state, under the names the rest of the code base (tests, benchmarks) uses
    consumer = _Via("processor")
    producer = _Via("processor")
    paused = _Via("processor", "holds")          # partition -> what it waits for
    fenced_writes = _Via("processor")            # checkpoints refused because the partition was lost
    _last_checkpoint = _Via("processor", "last_checkpoint")
    states = _Via("strategy")
    dirty = _Via("strategy")
    held_for = _Via("strategy")
    model_holds = _Via("strategy")
    _accepted = _Via("strategy")
    store = _Via("context")
    control_consumer = _Via("context")
    tokenizer = _Via("context")
    routing = _Via("context")
    vocabulary = _Via("context")
    candidates = _Via("context")
    d = _Via("context")
    k_prime = _Via("context")
    subspace = _Via("context")
    clip = _Via("context")
    closed_through = _Via("context")
    warmup_closed = _Via("context")
    refinement = _Via("context")
    models = _Via("context")
    model_epoch = _Via("context")
    control_key = _Via("context")
    control_rejected = _Via("context")
    broker_time = _Via("context")
    user_partitions = _Via("context")

    # ------------------------------------------------------------ lifecycle
    def stop(self, *_args) -> None:
        self._stop.set()

    def run(self, *, max_seconds: float | None = None, install_signals: bool = True) -> int:
        if install_signals:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        self.server = ObservabilityServer(self.metrics, self.health, host=self.cfg.metrics_host,
                                          port=self.cfg.metrics_port)
        log.info("%s: metrics on %s", self.instance, self.server.url)
        self._refresh_vocabulary()
        self._refresh_subspace()
        self.processor.subscribe()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        admin_config = service_client_config(self.cfg.bootstrap, self.cfg.kafka, "admin")
        guard = OutageGuard(self.health, admin_config, self._stop,
                            name=self.instance, logger=log)     # outages: alive, not ready, retry
        self.broker_probe = BrokerProbe(self.health, admin_config, name=self.instance,
                                        bound=self.cfg.readiness_broker_seconds,
                                        interval=self.cfg.readiness_broker_seconds / 2).start()
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                guard.run(self.step)
            self.checkpoint_all()
        finally:
            self.close()
        return 0

    def close(self) -> None:
        if getattr(self, "broker_probe", None) is not None:
            self.broker_probe.close()
        try:
            self.processor.close()     # leaves the group; on_revoke checkpoints what is left
        finally:
            self.control_consumer.close()
            self.store.close()
            if self.server is not None:
                self.server.close()

    # ------------------------------------------------------------ the loop and its parts
    def step(self) -> None:
        self.processor.step()

    def process(self, p: int, batch: list) -> None:
        self.processor.submit(p, batch)      # dead letters and holds: the processor's

    def checkpoint(self, p: int) -> None:
        self.processor.checkpoint(p)

    def checkpoint_all(self) -> None:
        self.processor.checkpoint_all()

    def confirmed_release(self) -> int | None:
        return self.context.confirmed_release()

    # rebalance callbacks (for a caller that subscribes the consumer itself)
    def _on_assign(self, consumer, partitions) -> None:
        self.processor.on_assign(consumer, partitions)

    def _on_revoke(self, consumer, partitions) -> None:
        self.processor.on_revoke(consumer, partitions)

    def _on_lost(self, consumer, partitions) -> None:
        self.processor.on_lost(consumer, partitions)

    def _refresh_vocabulary(self) -> None:
        self.context.refresh_vocabulary()

    def _refresh_subspace(self) -> None:
        self.context.refresh_subspace()

    def _refresh_model(self, rec=None) -> None:
        self.context.refresh_model(rec)

    def _poll_control(self) -> None:
        self.context.poll_control()

    def _apply_epochs_closed(self, through: int) -> None:
        self.context.apply_epochs_closed(through)
