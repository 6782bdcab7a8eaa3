"""The Prometheus metrics of one service on its own registry, with typed update methods.

:class:`ServiceMetrics` (``role="sketcher"`` or ``role="release"``) lives on its **own**
:class:`~prometheus_client.CollectorRegistry`, never the process-global one, so several services
can share a test process. Consumer lag is read from librdkafka's statistics JSON string
(``stats_cb``, :meth:`ServiceMetrics.set_lag_from_stats`): this module does not import
``confluent_kafka``.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from importlib import metadata
from typing import Any, Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from streamdp.observability.catalogue import (ASSIGNED_PARTITIONS, BATCH_DURATION_SECONDS,
                                              BATCH_SIZE_DOCUMENTS, BUILD_INFO, CHECKPOINTS_TOTAL,
                                              CHECKPOINT_AGE_SECONDS, CHECKPOINT_BYTES,
                                              CONSUMER_LAG_MESSAGES, CONTROL_REJECTED_TOTAL,
                                              COUNTER, DEDUP_IDS, DLQ_DROPPED_TOTAL,
                                              DLQ_MESSAGES_TOTAL, DOCUMENTS_SKIPPED_TOTAL,
                                              DOCUMENTS_TOTAL, EPOCHS_CLOSED_TOTAL,
                                              EXACT_COUNT_METRICS, GAUGE, HISTOGRAM,
                                              KNOWN_SKIP_REASONS, LAST_PROGRESS_TIMESTAMP_SECONDS,
                                              LAST_RELEASE_TIMESTAMP_SECONDS, MAX_LABEL_VALUES,
                                              METRIC_NAMES, MetricSpec, OVERFLOW_LABEL,
                                              PARTITIONS_PAUSED, PARTITION_HELD_SECONDS,
                                              PAUSE_REASONS, POLL_LOOP_DURATION_SECONDS,
                                              POLL_LOOP_LONGEST_SECONDS, PRIVACY_EPSILON_BUDGET,
                                              PRIVACY_EPSILON_SPENT, PRIVACY_RHO_REMAINING,
                                              PRIVACY_RHO_SPENT, REBALANCES_TOTAL, REBALANCE_KINDS,
                                              RELEASES_ENDED, RELEASES_ENDED_REASONS,
                                              RELEASES_TOTAL, RELEASE_DURATION_SECONDS,
                                              RELEASE_OUTCOMES, SKETCHER, STATE_REFUSED_REASONS,
                                              STATE_REFUSED_TOTAL, TOKENS_TOTAL, TOPIC_SHARE,
                                              TOPIC_SHARE_CHANGES_TOTAL, TOPIC_SHARE_LOWER,
                                              TOPIC_SHARE_UPPER, TRACKED_USERS, TREE_EPOCH,
                                              TREE_HORIZON, UNKNOWN_TOKENS_TOTAL, _check_role,
                                              metric_specs)
from streamdp.observability.health import HealthState


log = logging.getLogger(__name__)


class _Dropped:
    """Stands in for a metric that is not exported (``exact_counts=False``): updates vanish."""

    def labels(self, *args: Any, **kwargs: Any) -> "_Dropped":
        return self

    def inc(self, *args: Any, **kwargs: Any) -> None:
        pass

    observe = set = dec = inc

    def remove(self, *args: Any) -> None:
        pass


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
