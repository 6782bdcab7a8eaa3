"""Metrics, liveness/readiness and a small HTTP endpoint for streamdp services.

Four modules, each one idea and usable alone (DESIGN §6 "Conventions"):

:mod:`~streamdp.observability.catalogue`
    Every exported metric declared once, :data:`METRIC_SPECS` (name, type, help, labels,
    roles, unit); dashboards, alert rules and tests import that list (or :data:`METRIC_NAMES`,
    :func:`metric_specs`) instead of repeating names.
:mod:`~streamdp.observability.service_metrics`
    :class:`ServiceMetrics`: the metrics of one service (``role="sketcher"`` or
    ``role="release"``) on its own registry, with typed update methods; consumer lag from
    librdkafka's statistics JSON (no ``confluent_kafka`` import).
:mod:`~streamdp.observability.health`
    :class:`HealthState`: liveness = the poll loop beat within ``liveness_timeout`` seconds;
    readiness = a flag the service sets, with a human-readable reason.
:mod:`~streamdp.observability.http_server`
    :class:`ObservabilityServer`: prometheus_client's WSGI app in a daemon thread, serving
    ``/metrics``, ``/healthz``, ``/readyz`` and JSON routes the service registers.

This package re-exports their public names (docs/metrics.md documents every metric, the
endpoints and the suggested alerts).
"""
from streamdp.observability.catalogue import (
    COUNTER, EXACT_COUNT_METRICS, GAUGE, HISTOGRAM, KNOWN_SKIP_REASONS, MAX_LABEL_VALUES,
    METRIC_NAMES, METRIC_SPECS, OVERFLOW_LABEL, PAUSE_REASONS, POLL_LOOP_LONGEST_SECONDS,
    REBALANCE_KINDS, RELEASE, RELEASE_OUTCOMES, RELEASES_ENDED_REASONS, ROLES, SKETCHER,
    STATE_REFUSED_REASONS, MetricSpec, metric_specs, names_for_role)
from streamdp.observability.health import HealthState
from streamdp.observability.http_server import ObservabilityServer
from streamdp.observability.service_metrics import ServiceMetrics

__all__ = [
    "ROLES", "SKETCHER", "RELEASE", "MetricSpec", "METRIC_SPECS", "METRIC_NAMES",
    "metric_specs", "names_for_role", "RELEASE_OUTCOMES", "RELEASES_ENDED_REASONS",
    "REBALANCE_KINDS", "KNOWN_SKIP_REASONS", "PAUSE_REASONS", "STATE_REFUSED_REASONS",
    "ServiceMetrics", "HealthState", "ObservabilityServer", "EXACT_COUNT_METRICS",
    "COUNTER", "GAUGE", "HISTOGRAM", "MAX_LABEL_VALUES", "OVERFLOW_LABEL",
    "POLL_LOOP_LONGEST_SECONDS",
]
