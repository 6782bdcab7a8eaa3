"""Metrics, liveness/readiness and a small HTTP endpoint for streamdp services.

Three pieces, each usable alone (DESIGN §6 "Conventions"):

:class:`ServiceMetrics`
    The Prometheus metrics of one service (``role="sketcher"`` or
    ``role="release"``) on its **own** :class:`~prometheus_client.CollectorRegistry`
    (never the process-global one, so several services can share a test
    process), with typed update methods. Every metric is declared once, in
    :data:`METRIC_SPECS` (name, type, help, labels, roles, unit); dashboards,
    alert rules and tests import that list (or :data:`METRIC_NAMES`,
    :func:`metric_specs`) instead of repeating names.
:class:`HealthState`
    Liveness = the poll loop called :meth:`HealthState.beat` within
    ``liveness_timeout`` seconds (every poll, empty polls included);
    readiness = a flag the service sets (partitions assigned and state
    restored) with a human-readable reason.
:class:`ObservabilityServer`
    prometheus_client's WSGI app and thread-per-request WSGI server in a daemon
    thread: ``/metrics`` (Prometheus text format, or OpenMetrics if the scraper
    asks for it), ``/healthz``, ``/readyz`` and JSON routes registered by the
    service (e.g. the release service's ``/snapshot/latest``).

This module deliberately does not import ``confluent_kafka``: consumer lag is
read from librdkafka's statistics JSON string (``stats_cb``), see
:meth:`ServiceMetrics.set_lag_from_stats`. docs/metrics.md documents every
metric, the endpoints and the suggested alerts.
"""
from __future__ import annotations

import gzip
import json
import logging
import math
import socket
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from importlib import metadata
from typing import Any, Callable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder

__all__ = [
    "ROLES", "SKETCHER", "RELEASE", "MetricSpec", "METRIC_SPECS", "METRIC_NAMES",
    "metric_specs", "names_for_role", "RELEASE_OUTCOMES", "RELEASES_ENDED_REASONS",
    "REBALANCE_KINDS", "KNOWN_SKIP_REASONS", "PAUSE_REASONS", "STATE_REFUSED_REASONS",
    "ServiceMetrics", "HealthState", "ObservabilityServer", "EXACT_COUNT_METRICS",
]

log = logging.getLogger(__name__)

SKETCHER = "sketcher"
RELEASE = "release"
ROLES = (SKETCHER, RELEASE)
_BOTH = frozenset(ROLES)
_SK = frozenset({SKETCHER})
_RE = frozenset({RELEASE})

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

#: Allowed values of ``streamdp_releases_total{outcome}`` (pre-initialised to 0).
RELEASE_OUTCOMES = ("published", "refused_budget", "failed")
#: Allowed values of ``streamdp_releases_ended{reason}`` (pre-initialised to 0): the privacy
#: budget refused a release, the tree horizon is reached, or another stop (no warm-up
#: documents, a failed vocabulary selection, the rounding premise).
RELEASES_ENDED_REASONS = ("budget", "horizon", "other")
#: Allowed values of ``streamdp_state_records_refused_total{reason}`` (pre-initialised to 0): a
#: sketch state record without a valid MAC under the deployment key, or sums that fail the
#: plausibility checks (streamdp.services.plausibility).
STATE_REFUSED_REASONS = ("mac", "implausible")
#: Allowed values of ``streamdp_rebalances_total{kind}`` (pre-initialised to 0).
REBALANCE_KINDS = ("assign", "revoke", "lost")
#: Allowed values of ``streamdp_partitions_paused{reason}`` (pre-initialised to 0): what a
#: paused partition waits for, the vocabulary, the subspace, a refinement model (the holds of
#: the sketch strategy), or its state restore after an assignment. (No hold on user counts:
#: past ``max_users`` a user is not admitted, issue 23.)
PAUSE_REASONS = ("vocabulary", "subspace", "model", "restoring")
#: ``streamdp_documents_skipped_total{reason}`` values pre-initialised to 0.
KNOWN_SKIP_REASONS = ("too_short", "duplicate_id")
#: Distinct values accepted for an open-ended label (error_class, reason,
#: partition) before further values are folded into ``"other"``: a flood of
#: odd exception names must not explode the series count.
MAX_LABEL_VALUES = 64
OVERFLOW_LABEL = "other"


# --------------------------------------------------------------------- specs
@dataclass(frozen=True)
class MetricSpec:
    """Declaration of one exported metric.

    ``name`` is the full exposition name (counters include ``_total``);
    ``unit`` is the unit suffix the name carries (before ``_total`` for
    counters): a base unit (``seconds``, ``bytes``) or the counted thing
    (``documents``, ``tokens``, ``messages``); ``""`` when the name carries
    none (dimensionless values, counts named by event such as ``_skipped_total``).
    """

    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()
    roles: frozenset[str] = _BOTH
    unit: str = ""
    buckets: tuple[float, ...] | None = None


# sketcher
DOCUMENTS_TOTAL = "streamdp_documents_total"
DOCUMENTS_SKIPPED_TOTAL = "streamdp_documents_skipped_total"
TOKENS_TOTAL = "streamdp_tokens_total"
UNKNOWN_TOKENS_TOTAL = "streamdp_unknown_tokens_total"
DLQ_MESSAGES_TOTAL = "streamdp_dlq_messages_total"
DLQ_DROPPED_TOTAL = "streamdp_dlq_dropped_total"
CONTROL_REJECTED_TOTAL = "streamdp_control_rejected_messages_total"
BATCH_DURATION_SECONDS = "streamdp_batch_duration_seconds"
BATCH_SIZE_DOCUMENTS = "streamdp_batch_size_documents"
CONSUMER_LAG_MESSAGES = "streamdp_consumer_lag_messages"
TRACKED_USERS = "streamdp_tracked_users"
DEDUP_IDS = "streamdp_dedup_ids"
CHECKPOINT_AGE_SECONDS = "streamdp_checkpoint_age_seconds"
CHECKPOINTS_TOTAL = "streamdp_checkpoints_total"
CHECKPOINT_BYTES = "streamdp_checkpoint_bytes"
ASSIGNED_PARTITIONS = "streamdp_assigned_partitions"
REBALANCES_TOTAL = "streamdp_rebalances_total"
PARTITIONS_PAUSED = "streamdp_partitions_paused"
PARTITION_HELD_SECONDS = "streamdp_partition_held_seconds"
POLL_LOOP_DURATION_SECONDS = "streamdp_poll_loop_duration_seconds"
POLL_LOOP_LONGEST_SECONDS = "streamdp_poll_loop_longest_seconds"
# release
RELEASES_TOTAL = "streamdp_releases_total"
RELEASE_DURATION_SECONDS = "streamdp_release_duration_seconds"
PRIVACY_RHO_SPENT = "streamdp_privacy_rho_spent"
PRIVACY_RHO_REMAINING = "streamdp_privacy_rho_remaining"
PRIVACY_EPSILON_SPENT = "streamdp_privacy_epsilon_spent"
PRIVACY_EPSILON_BUDGET = "streamdp_privacy_epsilon_budget"
LAST_RELEASE_TIMESTAMP_SECONDS = "streamdp_last_release_timestamp_seconds"
EPOCHS_CLOSED_TOTAL = "streamdp_epochs_closed_total"
TREE_EPOCH = "streamdp_tree_epoch"
TREE_HORIZON = "streamdp_tree_horizon"
RELEASES_ENDED = "streamdp_releases_ended"
STATE_REFUSED_TOTAL = "streamdp_state_records_refused_total"
TOPIC_SHARE = "streamdp_topic_share"
TOPIC_SHARE_LOWER = "streamdp_topic_share_lower"
TOPIC_SHARE_UPPER = "streamdp_topic_share_upper"
TOPIC_SHARE_CHANGES_TOTAL = "streamdp_topic_share_changes_total"
# both
BUILD_INFO = "streamdp_build_info"
LAST_PROGRESS_TIMESTAMP_SECONDS = "streamdp_last_progress_timestamp_seconds"

_BATCH_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                  10.0, 30.0)
_BATCH_DOCS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
_RELEASE_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    600.0)

METRIC_SPECS: tuple[MetricSpec, ...] = (
    # ---- sketcher
    MetricSpec(DOCUMENTS_TOTAL, COUNTER,
               "Documents added to the sketch, by input partition.",
               ("partition",), _SK, "documents"),
    MetricSpec(DOCUMENTS_SKIPPED_TOTAL, COUNTER,
               "Well-formed documents not added to the sketch, by reason "
               "(too_short: fewer in-vocabulary tokens than the moment estimators need; "
               "duplicate_id: a document id this partition already counted, dead-lettered).",
               ("reason",), _SK),
    MetricSpec(TOKENS_TOTAL, COUNTER,
               "Tokens read from processed documents, unknown tokens included.",
               (), _SK, "tokens"),
    MetricSpec(UNKNOWN_TOKENS_TOTAL, COUNTER,
               "Tokens dropped because they are not in the vocabulary.",
               (), _SK, "tokens"),
    MetricSpec(DLQ_MESSAGES_TOTAL, COUNTER,
               "Malformed input messages detected, by error class (written to the "
               "dead-letter topic, or refused by Kafka: streamdp_dlq_dropped_total).",
               ("error_class",), _SK, "messages"),
    MetricSpec(DLQ_DROPPED_TOTAL, COUNTER,
               "Dead-letter records Kafka refused after every retry (counted in "
               "streamdp_dlq_messages_total too); the sketcher stops without "
               "checkpointing past them, so they are re-read after its restart.",
               (), _SK),
    MetricSpec(CONTROL_REJECTED_TOTAL, COUNTER,
               "Control messages the sketcher ignored: undecodable, no valid MAC under its "
               "control key (a key mismatch with the release service), or not confirmed by "
               "the release state.",
               (), _SK, "messages"),
    MetricSpec(BATCH_DURATION_SECONDS, HISTOGRAM,
               "Wall time to decode and sketch one consumed batch.",
               (), _SK, "seconds", _BATCH_SECONDS),
    MetricSpec(BATCH_SIZE_DOCUMENTS, HISTOGRAM,
               "Documents sketched per batch.",
               (), _SK, "documents", _BATCH_DOCS),
    MetricSpec(CONSUMER_LAG_MESSAGES, GAUGE,
               "Messages between the consumer position and the end of the partition "
               "(librdkafka statistics), per assigned partition.",
               ("topic", "partition"), _SK, "messages"),
    MetricSpec(TRACKED_USERS, GAUGE,
               "User unit: distinct users held by the user bounders (warm-up and stream "
               "sides) per assigned partition, about 400 bytes of memory each; with "
               "max_users: null it grows with the users (size the memory limit by it).",
               ("partition",), _SK),
    MetricSpec(DEDUP_IDS, GAUGE,
               "Document ids remembered for deduplication per assigned partition, 8 bytes of "
               "memory and of each checkpoint each; it only grows (size the memory limit by it).",
               ("partition",), _SK),
    MetricSpec(CHECKPOINT_AGE_SECONDS, GAUGE,
               "Seconds since the last completed checkpoint (since start if none yet), "
               "computed at scrape time.",
               (), _SK, "seconds"),
    MetricSpec(CHECKPOINTS_TOTAL, COUNTER,
               "Completed checkpoints (state record manifests written).",
               (), _SK),
    MetricSpec(CHECKPOINT_BYTES, GAUGE,
               "Size of the last completed checkpoint (all chunks).",
               (), _SK, "bytes"),
    MetricSpec(ASSIGNED_PARTITIONS, GAUGE,
               "Input partitions currently assigned to this consumer.",
               (), _SK),
    MetricSpec(REBALANCES_TOTAL, COUNTER,
               "Consumer group rebalance callbacks, by kind (assign, revoke, lost).",
               ("kind",), _SK),
    MetricSpec(PARTITIONS_PAUSED, GAUGE,
               "Assigned input partitions paused, by what they wait for (vocabulary, subspace, "
               "model: a refinement model not released yet; restoring: state not restored yet).",
               ("reason",), _SK),
    MetricSpec(PARTITION_HELD_SECONDS, GAUGE,
               "Seconds the oldest current hold (vocabulary, subspace or model) has lasted, "
               "computed at scrape time; 0 when no partition is held.",
               (), _SK, "seconds"),
    MetricSpec(POLL_LOOP_DURATION_SECONDS, HISTOGRAM,
               "Wall time of one poll loop (consume, process, scheduled work, checkpoints): "
               "librdkafka's max.poll.interval.ms (20 s) bounds it.",
               (), _SK, "seconds", _BATCH_SECONDS),
    MetricSpec(POLL_LOOP_LONGEST_SECONDS, GAUGE,
               "The longest poll loop since the process started (alert well below "
               "max.poll.interval.ms = 20 s: past it the sketcher leaves the group).",
               (), _SK, "seconds"),
    # ---- release
    MetricSpec(RELEASES_TOTAL, COUNTER,
               "Release attempts by outcome (published, refused_budget, failed).",
               ("outcome",), _RE),
    MetricSpec(RELEASE_DURATION_SECONDS, HISTOGRAM,
               "Wall time of one release (merge, noise, decomposition, publish).",
               (), _RE, "seconds", _RELEASE_SECONDS),
    MetricSpec(PRIVACY_RHO_SPENT, GAUGE,
               "zCDP rho spent by the worst-off document, from the ledger.",
               (), _RE),
    MetricSpec(PRIVACY_RHO_REMAINING, GAUGE,
               "zCDP rho still available to the worst-off document.",
               (), _RE),
    MetricSpec(PRIVACY_EPSILON_SPENT, GAUGE,
               "(epsilon, delta)-DP epsilon of the rho spent so far, at the configured delta.",
               (), _RE),
    MetricSpec(PRIVACY_EPSILON_BUDGET, GAUGE,
               "Configured total epsilon budget.",
               (), _RE),
    MetricSpec(LAST_RELEASE_TIMESTAMP_SECONDS, GAUGE,
               "Unix time of the last published release (0 = none known).",
               (), _RE, "seconds"),
    MetricSpec(EPOCHS_CLOSED_TOTAL, COUNTER,
               "Epochs closed into the binary tree.",
               (), _RE),
    MetricSpec(TREE_EPOCH, GAUGE,
               "Last closed epoch of the binary tree (1-based; 0 = none).",
               (), _RE),
    MetricSpec(TREE_HORIZON, GAUGE,
               "Horizon T of the binary tree (epochs it can release before a new tree "
               "and budget are needed).",
               (), _RE),
    MetricSpec(RELEASES_ENDED, GAUGE,
               "1 once this deployment will publish no further release, by reason (budget: the "
               "accountant refused one; horizon: the tree horizon is reached; other: no warm-up "
               "documents, a failed vocabulary selection, the rounding premise); 0 otherwise.",
               ("reason",), _RE),
    MetricSpec(STATE_REFUSED_TOTAL, COUNTER,
               "Sketch state records the release service refused, by reason (mac: no valid MAC "
               "under the deployment key; implausible: sums beyond n_docs times the clip bounds, "
               "left out of the release before any noise). Any increase is an incident.",
               ("reason",), _RE),
    MetricSpec(TOPIC_SHARE, GAUGE,
               "Each topic's share of the documents of the epoch(s) the latest release added "
               "(streamdp.trends: released topic masses; NaN until a refined release). One series "
               "per topic index (at most k).",
               ("topic",), _RE),
    MetricSpec(TOPIC_SHARE_LOWER, GAUGE,
               "Lower end of the 95% interval of streamdp_topic_share (the release's known noise).",
               ("topic",), _RE),
    MetricSpec(TOPIC_SHARE_UPPER, GAUGE,
               "Upper end of the 95% interval of streamdp_topic_share.",
               ("topic",), _RE),
    MetricSpec(TOPIC_SHARE_CHANGES_TOTAL, COUNTER,
               "Significant changes of a topic's share between consecutive releases (two-sided "
               "test at 1%/k per topic, Bonferroni over the k topics: a stationary stream "
               "reports one in at most 1% of releases). Alert StreamdpTopicShareChange.",
               ("topic",), _RE),
    # ---- both
    MetricSpec(BUILD_INFO, GAUGE,
               "Constant 1, labelled with the streamdp version and the service role.",
               ("version", "role"), _BOTH),
    MetricSpec(LAST_PROGRESS_TIMESTAMP_SECONDS, GAUGE,
               "Unix time the poll loop last made progress (empty polls included).",
               (), _BOTH, "seconds"),
)

#: Every metric name, in declaration order.
METRIC_NAMES: tuple[str, ...] = tuple(s.name for s in METRIC_SPECS)

#: Data-dependent exact counts (the trust boundary, docs/privacy.md): how many documents,
#: tokens or messages arrived, exactly. Operator-only; a service constructed with
#: ``exact_counts=False`` (configuration ``metrics_exact_counts: false``) does not export them,
#: for deployments whose Prometheus is shared more widely than the operators.
EXACT_COUNT_METRICS: tuple[str, ...] = (
    DOCUMENTS_TOTAL, DOCUMENTS_SKIPPED_TOTAL, TOKENS_TOTAL, UNKNOWN_TOKENS_TOTAL,
    BATCH_SIZE_DOCUMENTS, CONSUMER_LAG_MESSAGES, DLQ_MESSAGES_TOTAL, DLQ_DROPPED_TOTAL,
    TRACKED_USERS, DEDUP_IDS,
)


class _Dropped:
    """Stands in for a metric that is not exported (``exact_counts=False``): updates vanish."""

    def labels(self, *args: Any, **kwargs: Any) -> "_Dropped":
        return self

    def inc(self, *args: Any, **kwargs: Any) -> None:
        pass

    observe = set = dec = inc

    def remove(self, *args: Any) -> None:
        pass


def metric_specs(role: str | None = None) -> dict[str, MetricSpec]:
    """``name -> MetricSpec`` for all metrics, or those exported by ``role``."""
    if role is not None:
        _check_role(role)
    return {s.name: s for s in METRIC_SPECS if role is None or role in s.roles}


def names_for_role(role: str) -> tuple[str, ...]:
    """Names of the metrics exported by ``role``."""
    return tuple(metric_specs(role))


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")


def _package_version() -> str:
    try:
        return metadata.version("streamdp")
    except metadata.PackageNotFoundError:  # pragma: no cover - not installed
        return "unknown"


def _count(x: float, what: str) -> float:
    x = float(x)
    if not (x >= 0 and math.isfinite(x)):
        raise ValueError(f"{what} must be a finite number >= 0, got {x!r}")
    return x


# ------------------------------------------------------------------- metrics
class ServiceMetrics:
    """The metrics of one service on a private registry.

    Parameters
    ----------
    role : ``"sketcher"`` or ``"release"``
        Selects the metric subset (see :data:`METRIC_SPECS`); calling a method
        of the other role raises :class:`LookupError`.
    version : str, optional
        Label of ``streamdp_build_info`` (default: the installed package version).
    clock : callable, optional
        Wall clock in Unix seconds (default :func:`time.time`); injectable for tests.
    registry : CollectorRegistry, optional
        Default: a fresh registry. Never the global ``REGISTRY``.
    health : HealthState, optional
        Source of ``streamdp_last_progress_timestamp_seconds`` (see :meth:`bind_health`).
    exact_counts : bool
        False drops the data-dependent exact counts (:data:`EXACT_COUNT_METRICS`) from the
        exposition: their update methods become no-ops (the trust boundary, docs/privacy.md).

    All methods are thread-safe (the stats callback runs in the poll thread,
    scrapes in server threads).
    """

    def __init__(self, role: str, *, version: str | None = None,
                 clock: Callable[[], float] = time.time,
                 registry: CollectorRegistry | None = None,
                 health: "HealthState | None" = None, exact_counts: bool = True) -> None:
        _check_role(role)
        self.role = role
        self.exact_counts = bool(exact_counts)
        self.version = version or _package_version()
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._last_checkpoint: float | None = None
        self._last_progress: float | None = None
        self._held_since: float | None = None
        self._longest_loop = 0.0
        self._health: HealthState | None = None
        # (topic, partition) lag series set from each librdkafka handle's stats
        self._lag_series: dict[str, set[tuple[str, str]]] = {}
        self._label_values: dict[str, set[str]] = {}
        self._metrics: dict[str, Any] = {}
        for spec in metric_specs(role).values():
            if not self.exact_counts and spec.name in EXACT_COUNT_METRICS:
                self._metrics[spec.name] = _Dropped()
            else:
                self._metrics[spec.name] = self._make(spec)

        self._metrics[BUILD_INFO].labels(version=self.version, role=role).set(1)
        self._metrics[LAST_PROGRESS_TIMESTAMP_SECONDS].set_function(self._progress_timestamp)
        if role == SKETCHER:
            self._metrics[CHECKPOINT_AGE_SECONDS].set_function(self._checkpoint_age)
            self._metrics[PARTITION_HELD_SECONDS].set_function(self._held_age)
            for reason in PAUSE_REASONS:
                self._metrics[PARTITIONS_PAUSED].labels(reason=reason).set(0)
            for kind in REBALANCE_KINDS:
                self._metrics[REBALANCES_TOTAL].labels(kind=kind)
            for reason in KNOWN_SKIP_REASONS:
                self._metrics[DOCUMENTS_SKIPPED_TOTAL].labels(reason=reason)
        else:
            for outcome in RELEASE_OUTCOMES:
                self._metrics[RELEASES_TOTAL].labels(outcome=outcome)
            for reason in RELEASES_ENDED_REASONS:
                self._metrics[RELEASES_ENDED].labels(reason=reason).set(0)
            for reason in STATE_REFUSED_REASONS:
                self._metrics[STATE_REFUSED_TOTAL].labels(reason=reason)
        if health is not None:
            self.bind_health(health)

    def _make(self, spec: MetricSpec):
        kw: dict[str, Any] = {"labelnames": spec.labels, "registry": self.registry}
        if spec.type == COUNTER:
            return Counter(spec.name, spec.help, **kw)
        if spec.type == GAUGE:
            return Gauge(spec.name, spec.help, **kw)
        if spec.type == HISTOGRAM:
            return Histogram(spec.name, spec.help, buckets=spec.buckets or Histogram.DEFAULT_BUCKETS,
                             **kw)
        raise ValueError(f"unknown metric type {spec.type!r} for {spec.name}")  # pragma: no cover

    def metric(self, name: str):
        """The prometheus_client object behind ``name`` (for uncommon updates)."""
        try:
            return self._metrics[name]
        except KeyError:
            if name in METRIC_NAMES:
                raise LookupError(f"{name} is not exported by the {self.role} service") from None
            raise LookupError(f"unknown metric {name!r}") from None

    _m = metric

    def _bounded(self, metric: str, value: Any) -> str:
        """Label value, folded to ``"other"`` past MAX_LABEL_VALUES distinct values."""
        value = str(value) if value is not None and str(value) != "" else "unknown"
        with self._lock:
            seen = self._label_values.setdefault(metric, set())
            if value in seen:
                return value
            if len(seen) >= MAX_LABEL_VALUES:
                return OVERFLOW_LABEL
            seen.add(value)
            return value

    # ---------------------------------------------------------------- both
    def bind_health(self, health: "HealthState") -> None:
        """Export ``health``'s last beat as ``streamdp_last_progress_timestamp_seconds``."""
        self._health = health

    def mark_progress(self, at: float | None = None) -> None:
        """Record progress explicitly (used when no HealthState is bound)."""
        self._last_progress = self._clock() if at is None else float(at)

    def _progress_timestamp(self) -> float:
        candidates = [t for t in (self._last_progress,
                                  self._health.last_beat_wall if self._health else None)
                      if t is not None]
        return max(candidates) if candidates else 0.0

    # ------------------------------------------------------------ sketcher
    def observe_batch(self, n_docs: int, n_tokens: int, n_unknown: int, seconds: float,
                      partition: int | str | Mapping[int | str, int] | None = None) -> None:
        """One processed batch.

        ``n_docs`` documents were added to the sketch (skipped and dead-lettered
        messages are reported with :meth:`skipped` / :meth:`dlq`); ``n_tokens``
        tokens were read, of which ``n_unknown`` were out of vocabulary.
        ``partition`` is the input partition of the whole batch, or a mapping
        ``partition -> documents`` for a batch spanning partitions (its values
        should sum to ``n_docs``); ``None`` labels the documents ``"unknown"``.
        """
        n_docs = _count(n_docs, "n_docs")
        n_tokens = _count(n_tokens, "n_tokens")
        n_unknown = _count(n_unknown, "n_unknown")
        seconds = _count(seconds, "seconds")
        if n_unknown > n_tokens:
            raise ValueError(f"n_unknown ({n_unknown}) > n_tokens ({n_tokens})")
        docs = self._m(DOCUMENTS_TOTAL)
        if isinstance(partition, Mapping):
            for p, n in partition.items():
                docs.labels(partition=self._bounded(DOCUMENTS_TOTAL, p)).inc(
                    _count(n, "documents per partition"))
        elif n_docs:
            docs.labels(partition=self._bounded(DOCUMENTS_TOTAL, partition)).inc(n_docs)
        self._m(TOKENS_TOTAL).inc(n_tokens)
        self._m(UNKNOWN_TOKENS_TOTAL).inc(n_unknown)
        self._m(BATCH_DURATION_SECONDS).observe(seconds)
        self._m(BATCH_SIZE_DOCUMENTS).observe(n_docs)

    def skipped(self, reason: str, n: int = 1) -> None:
        """``n`` well-formed documents were not sketched (e.g. ``"too_short"``)."""
        self._m(DOCUMENTS_SKIPPED_TOTAL).labels(
            reason=self._bounded(DOCUMENTS_SKIPPED_TOTAL, reason)).inc(_count(n, "n"))

    def dlq(self, error_class: str, *, dropped: bool = False, n: int = 1) -> None:
        """``n`` malformed messages of ``error_class`` were detected.

        ``dropped=True`` means the dead-letter producer's rate limit was
        exhausted and they were skipped without a DLQ record; they count in
        both ``streamdp_dlq_messages_total`` and ``streamdp_dlq_dropped_total``.
        Use a bounded vocabulary for ``error_class`` (exception class names).
        """
        n = _count(n, "n")
        self._m(DLQ_MESSAGES_TOTAL).labels(
            error_class=self._bounded(DLQ_MESSAGES_TOTAL, error_class)).inc(n)
        if dropped:
            self._m(DLQ_DROPPED_TOTAL).inc(n)

    def control_rejected(self, n: int = 1) -> None:
        """``n`` control messages ignored (``streamdp_control_messages_rejected_total``)."""
        self._m(CONTROL_REJECTED_TOTAL).inc(_count(n, "n"))

    def dlq_undelivered(self, n: int = 1) -> None:
        """``n`` dead-letter records (already counted by :meth:`dlq`) were refused by Kafka
        after every retry: no copy exists (``streamdp_dlq_dropped_total``; the sketcher stops
        without checkpointing past them, so they are re-read after its restart)."""
        self._m(DLQ_DROPPED_TOTAL).inc(_count(n, "n"))

    def checkpointed(self, nbytes: int, *, at: float | None = None) -> None:
        """A checkpoint of ``nbytes`` bytes (all chunks) completed at ``at`` (default now)."""
        nbytes = _count(nbytes, "nbytes")
        self._m(CHECKPOINTS_TOTAL).inc()
        self._m(CHECKPOINT_BYTES).set(nbytes)
        self._last_checkpoint = self._clock() if at is None else float(at)

    def loop(self, seconds: float) -> None:
        """One poll loop took ``seconds`` (wall)."""
        seconds = max(0.0, float(seconds))
        self._m(POLL_LOOP_DURATION_SECONDS).observe(seconds)
        with self._lock:
            self._longest_loop = max(self._longest_loop, seconds)
            self._m(POLL_LOOP_LONGEST_SECONDS).set(self._longest_loop)

    def _checkpoint_age(self) -> float:
        ref = self._last_checkpoint if self._last_checkpoint is not None else self._started
        return max(0.0, self._clock() - ref)

    def rebalance(self, kind: str, assigned: int | None = None) -> None:
        """A rebalance callback of ``kind`` (assign/revoke/lost); ``assigned`` is the
        total assignment size afterwards (not the increment), if known."""
        if kind not in REBALANCE_KINDS:
            raise ValueError(f"kind must be one of {REBALANCE_KINDS}, got {kind!r}")
        self._m(REBALANCES_TOTAL).labels(kind=kind).inc()
        if assigned is not None:
            self.set_assigned_partitions(assigned)

    def set_paused(self, reasons: Mapping[int, str], held_since: float | None = None) -> None:
        """The paused partitions now (``partition -> reason``, :data:`PAUSE_REASONS`) and the
        Unix time the oldest current hold began (None: no hold)."""
        counts = dict.fromkeys(PAUSE_REASONS, 0)
        for reason in reasons.values():
            if reason not in counts:
                raise ValueError(f"reason must be one of {PAUSE_REASONS}, got {reason!r}")
            counts[reason] += 1
        gauge = self._m(PARTITIONS_PAUSED)
        for reason, n in counts.items():
            gauge.labels(reason=reason).set(n)
        self._held_since = None if held_since is None else float(held_since)

    def _held_age(self) -> float:
        return 0.0 if self._held_since is None else max(0.0, self._clock() - self._held_since)

    def set_tracked_users(self, partition: int, n: int) -> None:
        """User unit: distinct users held by ``partition``'s bounders (operator-only)."""
        self._m(TRACKED_USERS).labels(
            partition=self._bounded(TRACKED_USERS, partition)).set(_count(n, "users"))

    def set_dedup_ids(self, partition: int, n: int) -> None:
        """Document ids ``partition`` remembers for deduplication (operator-only)."""
        self._m(DEDUP_IDS).labels(
            partition=self._bounded(DEDUP_IDS, partition)).set(_count(n, "ids"))

    def set_assigned_partitions(self, n: int) -> None:
        self._m(ASSIGNED_PARTITIONS).set(_count(n, "assigned partitions"))

    def set_lag_from_stats(self, stats_json: str | bytes,
                           fields: tuple[str, ...] = ("consumer_lag_stored", "consumer_lag"),
                           ) -> dict[tuple[str, int], int]:
        """Update ``streamdp_consumer_lag_messages`` from a librdkafka statistics JSON.

        Reads ``topics.<topic>.partitions.<id>``; the lag of a partition is the
        first of ``fields`` that is ``>= 0``. The internal UA partition ``-1``
        and partitions with no valid lag (``-1``: not assigned, offsets or
        watermarks not known yet) are skipped, and series this handle set
        before but no longer reports are removed. Series are tracked per
        handle (``name``), so stats of a second consumer do not erase the
        first one's; producer statistics are ignored.

        Why ``consumer_lag_stored`` first: librdkafka computes ``consumer_lag``
        from the *committed* offset, which stays -1 when offsets live in our
        own state records or are sent with ``send_offsets_to_transaction``;
        ``consumer_lag_stored`` is end offset − stored (≈ consumed) position.
        Both use the last stable offset under ``isolation.level=read_committed``.

        Never raises on bad input (it runs inside the poll loop's stats
        callback): malformed JSON is logged and returns ``{}`` unchanged.
        Returns ``{(topic, partition): lag}`` of the series now exported.
        """
        gauge = self._m(CONSUMER_LAG_MESSAGES)
        try:
            stats = json.loads(stats_json)
            if not isinstance(stats, dict):
                raise ValueError("statistics JSON is not an object")
        except (ValueError, TypeError) as exc:
            log.warning("ignoring malformed librdkafka statistics: %s", exc)
            return {}
        if stats.get("type", "consumer") != "consumer":
            return {}
        handle = str(stats.get("name", ""))
        lags: dict[tuple[str, int], int] = {}
        topics = stats.get("topics")
        for topic, tstats in (topics.items() if isinstance(topics, dict) else ()):
            parts = tstats.get("partitions") if isinstance(tstats, dict) else None
            for pid, pstats in (parts.items() if isinstance(parts, dict) else ()):
                try:
                    partition = int(pstats.get("partition", pid)) if isinstance(pstats, dict) \
                        else int(pid)
                except (TypeError, ValueError):
                    continue
                if partition < 0 or not isinstance(pstats, dict):
                    continue
                for f in fields:
                    v = pstats.get(f)
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
                        lags[(str(topic), partition)] = int(v)
                        break
        with self._lock:
            current = {(t, str(p)) for t, p in lags}
            for t, p in self._lag_series.get(handle, set()) - current:
                try:
                    gauge.remove(t, p)
                except KeyError:  # pragma: no cover - already gone
                    pass
            for (t, p), v in lags.items():
                gauge.labels(topic=t, partition=str(p)).set(v)
            self._lag_series[handle] = current
        return lags

    def clear_lag(self) -> None:
        """Remove every lag series (e.g. after all partitions were revoked or lost)."""
        with self._lock:
            gauge = self._m(CONSUMER_LAG_MESSAGES)
            for series in self._lag_series.values():
                for t, p in series:
                    try:
                        gauge.remove(t, p)
                    except KeyError:  # pragma: no cover
                        pass
            self._lag_series.clear()

    # ------------------------------------------------------------- release
    def release_outcome(self, outcome: str, seconds: float | None = None, *,
                        at: float | None = None) -> None:
        """One release attempt ended with ``outcome`` (published/refused_budget/failed).

        ``seconds`` (if given) is observed in the duration histogram; a
        ``published`` outcome sets the last-release timestamp to ``at`` (default now).
        """
        if outcome not in RELEASE_OUTCOMES:
            raise ValueError(f"outcome must be one of {RELEASE_OUTCOMES}, got {outcome!r}")
        self._m(RELEASES_TOTAL).labels(outcome=outcome).inc()
        if seconds is not None:
            self._m(RELEASE_DURATION_SECONDS).observe(_count(seconds, "seconds"))
        if outcome == "published":
            self.set_last_release_timestamp(self._clock() if at is None else at)

    def set_last_release_timestamp(self, ts: float) -> None:
        """E.g. on startup, from the latest snapshot on the snapshot topic."""
        self._m(LAST_RELEASE_TIMESTAMP_SECONDS).set(_count(ts, "timestamp"))

    def set_budget(self, rho_spent: float, rho_remaining: float, eps_spent: float,
                   eps_budget: float) -> None:
        """Privacy budget state (worst-off document), e.g. after each ledger change."""
        self._m(PRIVACY_RHO_SPENT).set(_count(rho_spent, "rho_spent"))
        self._m(PRIVACY_RHO_REMAINING).set(_count(rho_remaining, "rho_remaining"))
        self._m(PRIVACY_EPSILON_SPENT).set(_count(eps_spent, "eps_spent"))
        self._m(PRIVACY_EPSILON_BUDGET).set(_count(eps_budget, "eps_budget"))

    def set_budget_from_report(self, report: Mapping[str, Any]) -> None:
        """:meth:`set_budget` from ``Accountant.report()`` (``rho_worst_case``,
        ``rho_remaining``, ``epsilon_worst_case``, ``epsilon``)."""
        self.set_budget(report["rho_worst_case"], report["rho_remaining"],
                        report["epsilon_worst_case"], report["epsilon"])

    def epoch_closed(self, epoch: int | None = None) -> None:
        """An epoch was closed into the tree; ``epoch`` (1-based) becomes the current one."""
        self._m(EPOCHS_CLOSED_TOTAL).inc()
        if epoch is not None:
            self._m(TREE_EPOCH).set(_count(epoch, "epoch"))

    def set_releases_ended(self, reason: str) -> None:
        """No further release will come, because of ``reason`` (:data:`RELEASES_ENDED_REASONS`)."""
        if reason not in RELEASES_ENDED_REASONS:
            raise ValueError(f"reason must be one of {RELEASES_ENDED_REASONS}, got {reason!r}")
        self._m(RELEASES_ENDED).labels(reason=reason).set(1)

    def state_refused(self, reason: str, n: int = 1) -> None:
        """``n`` sketch state records (or partition sums) refused for ``reason``
        (:data:`STATE_REFUSED_REASONS`)."""
        if reason not in STATE_REFUSED_REASONS:
            raise ValueError(f"reason must be one of {STATE_REFUSED_REASONS}, got {reason!r}")
        self._m(STATE_REFUSED_TOTAL).labels(reason=reason).inc(n)

    def set_topic_trend(self, point, changes=()) -> None:
        """The latest release's topic shares and interval (a ``streamdp.trends.TrendPoint``;
        NaN where it has none) and its significant changes (``ShareChange``). Topic labels are
        the indices 0 … k−1 (bounded by k)."""
        for i in range(len(point.share)):
            t = str(int(i))
            self._m(TOPIC_SHARE).labels(topic=t).set(float(point.share[i]))
            self._m(TOPIC_SHARE_LOWER).labels(topic=t).set(float(point.lower[i]))
            self._m(TOPIC_SHARE_UPPER).labels(topic=t).set(float(point.upper[i]))
            self._m(TOPIC_SHARE_CHANGES_TOTAL).labels(topic=t)      # the series exists at 0
        for c in changes:
            if c.significant:
                self._m(TOPIC_SHARE_CHANGES_TOTAL).labels(topic=str(int(c.topic))).inc()

    def set_tree(self, epoch: int, horizon: int) -> None:
        """Tree position, e.g. after restoring the release state."""
        self._m(TREE_EPOCH).set(_count(epoch, "epoch"))
        self._m(TREE_HORIZON).set(_count(horizon, "horizon"))

    # ---------------------------------------------------------- exposition
    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """``(body, content_type)`` for a scrape with the given Accept header."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


# -------------------------------------------------------------------- health
class HealthState:
    """Liveness (poll-loop heartbeat) and readiness (service-set flag).

    ``beat()`` must be called on every poll, empty polls included; the loop is
    live while the last beat is at most ``liveness_timeout`` seconds old
    (construction counts as a beat, a start-up grace period: beat during long
    state restores too, or give the pod a startupProbe). Readiness starts
    false with reason ``"starting"``.
    """

    def __init__(self, liveness_timeout: float = 30.0, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not liveness_timeout > 0:
            raise ValueError("liveness_timeout must be > 0")
        self.liveness_timeout = float(liveness_timeout)
        self._clock = clock
        self._wall_clock = wall_clock
        self._last = (clock(), wall_clock())  # (monotonic, wall), replaced atomically
        self._lock = threading.Lock()
        self._ready = False
        self._reason = "starting"
        # conditions checked at every /readyz on top of the flag (e.g. the release service's
        # confirmed writer epoch): each returns (ok, reason)
        self._gates: list[Callable[[], tuple[bool, str]]] = []

    def beat(self) -> None:
        """The poll loop went round once (hot path: two clock reads, one store)."""
        self._last = (self._clock(), self._wall_clock())

    @property
    def last_beat_wall(self) -> float:
        """Unix time of the last beat."""
        return self._last[1]

    def last_progress_age(self) -> float:
        return max(0.0, self._clock() - self._last[0])

    def is_live(self) -> bool:
        return self.last_progress_age() <= self.liveness_timeout

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """E.g. ``set_ready(True, "3 partitions assigned, state restored")`` or
        ``set_ready(False, "revoked; restoring")`` / ``(False, "shutting down")``."""
        with self._lock:
            self._ready = bool(ready)
            self._reason = reason or ("ready" if ready else "not ready")

    def add_ready_gate(self, gate: Callable[[], tuple[bool, str]]) -> None:
        """Ready only while ``gate()`` says ok too (checked at every readiness query)."""
        self._gates.append(gate)

    def is_ready(self) -> bool:
        return self.readiness()[0]

    def ready_flag(self) -> tuple[bool, str]:
        """The flag the service set, without the gates (what an outage saves and restores)."""
        with self._lock:
            return self._ready, self._reason

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        age = self.last_progress_age()
        live = age <= self.liveness_timeout
        return live, {"status": "ok" if live else "stalled",
                      "last_progress_age_seconds": round(age, 3),
                      "liveness_timeout_seconds": self.liveness_timeout}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            ready, reason = self._ready, self._reason
        for gate in self._gates if ready else ():
            ok, why = gate()
            if not ok:
                ready, reason = False, why
                break
        return ready, {"status": "ready" if ready else "not_ready", "reason": reason}


# -------------------------------------------------------------------- server
def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, without importing numpy
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _encode_json(obj: Any) -> bytes:
    return json.dumps(obj, default=_json_default, allow_nan=False,
                      separators=(",", ":")).encode()


class _Handler(WSGIRequestHandler):
    timeout = 10  # a stuck client cannot hold a handler thread forever
    server_version = "streamdp-observability"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s - %s", self.address_string(), format % args)


class _Server(ThreadingWSGIServer):
    """prometheus_client's thread-per-request WSGI server (daemon threads: a slow client never
    delays shutdown), quiet about clients that time out or hang up."""

    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a burst of connections (many scrapers, slow
    # clients) then waits for SYN retransmits (1 s each) before its thread is even started
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("observability request from %s failed", client_address, exc_info=True)


def _routed_path(environ: Mapping[str, Any]) -> str:
    path = environ.get("PATH_INFO") or "/"
    return path.rstrip("/") if len(path) > 1 else path


class ObservabilityServer:
    """HTTP endpoint for one service, started on construction.

    ``/metrics`` (Prometheus text format 0.0.4 via ``generate_latest``;
    OpenMetrics when the Accept header asks for it), ``/healthz`` and
    ``/readyz`` (200 / 503 with a JSON body), plus JSON routes added with
    :meth:`add_json_route`. ``port=0`` binds an ephemeral port, see
    :attr:`port`. The metrics' ``streamdp_last_progress_timestamp_seconds`` is
    bound to ``health`` unless the metrics already have a health source.
    """

    def __init__(self, metrics: ServiceMetrics, health: HealthState, host: str = "127.0.0.1",
                 port: int = 0, *, poll_interval: float = 0.1) -> None:
        self.metrics = metrics
        self.health = health
        if metrics._health is None:
            metrics.bind_health(health)
        self._routes: dict[str, Callable[[], Any]] = {}
        self._raw_routes: dict[str, tuple[Callable[[], bytes | None], str]] = {}
        self._metrics_app = make_wsgi_app(metrics.registry)
        server_cls = _Server
        if ":" in host:
            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        self._httpd = make_server(host, port, self._app, server_class=server_cls,
                                  handler_class=_Handler)
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._closed = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": poll_interval},
            name=f"streamdp-observability-{self.port}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- WSGI
    def _app(self, environ: dict, start_response: Callable) -> list[bytes]:
        """/metrics through prometheus_client's WSGI app, /healthz, /readyz and the routes the
        service added; HEAD answers as GET without a body; a failing route gives a 500."""
        path = _routed_path(environ)
        method = environ.get("REQUEST_METHOD", "GET")
        head = method == "HEAD"

        def send(status: int, body: bytes, headers: list[tuple[str, str]]) -> list[bytes]:
            gzip_ok = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
            if gzip_ok and len(body) > 1024 and not any(k == "Content-Encoding" for k, _ in headers):
                body = gzip.compress(body)
                headers = [*headers, ("Content-Encoding", "gzip")]
            start_response(f"{status} {HTTPStatus(status).phrase}",
                           [*headers, ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store")])
            return [] if head else [body]

        def send_json(status: int, obj: Any) -> list[bytes]:
            return send(status, _encode_json(obj), [("Content-Type", "application/json")])

        if method not in ("GET", "HEAD"):
            return send(405, b"", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
        try:
            if path == "/metrics":
                reply: dict[str, Any] = {}
                body = b"".join(self._metrics_app(
                    {**environ, "REQUEST_METHOD": "GET"},
                    lambda status, headers: reply.update(status=status, headers=headers)))
                return send(int(reply["status"].split()[0]), body, list(reply["headers"]))
            if path in ("/healthz", "/readyz"):
                ok, info = (self.health.liveness() if path == "/healthz"
                            else self.health.readiness())
                return send_json(200 if ok else 503, info)
            if path in self._raw_routes:
                fn, ctype = self._raw_routes[path]
                raw = fn()
                if raw is None:
                    return send_json(404, {"error": "not found", "path": path})
                return send(200, raw, [("Content-Type", ctype)])
            if path in self._routes:
                obj = self._routes[path]()
                if obj is None:
                    return send_json(404, {"error": "not found", "path": path})
                return send_json(200, obj)
            return send_json(404, {"error": "not found", "path": path, "routes": self.routes()})
        except Exception as exc:  # a failing route must not kill the server
            log.exception("error serving %s", path)
            return send_json(500, {"error": type(exc).__name__, "detail": str(exc)})

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def add_json_route(self, path: str, fn: Callable[[], Any]) -> None:
        """Serve ``fn()`` as JSON at ``path`` (GET); 404 when it returns ``None``.

        ``fn`` runs in a server thread: it must be thread-safe and quick (return
        a prepared object, e.g. the latest snapshot's dict). numpy values are
        converted with ``tolist()``; non-finite floats give a 500.
        """
        if not path.startswith("/") or path in ("/metrics", "/healthz", "/readyz"):
            raise ValueError(f"invalid or reserved route {path!r}")
        self._routes[path.rstrip("/") or "/"] = fn

    def add_bytes_route(self, path: str, fn: Callable[[], bytes | None], content_type: str) -> None:
        """Serve the bytes ``fn()`` returns at ``path`` (GET), as ``content_type``; 404 when it
        returns ``None``. Same rules for ``fn`` as :meth:`add_json_route`."""
        if not path.startswith("/") or path in ("/metrics", "/healthz", "/readyz"):
            raise ValueError(f"invalid or reserved route {path!r}")
        self._raw_routes[path.rstrip("/") or "/"] = (fn, content_type)

    def routes(self) -> list[str]:
        return ["/metrics", "/healthz", "/readyz", *sorted({*self._routes, *self._raw_routes})]

    def close(self) -> None:
        """Stop serving and release the port (idempotent; ~poll_interval)."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "ObservabilityServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
