"""Every metric streamdp exports, declared once (docs/metrics.md).

:data:`METRIC_SPECS` holds each metric's name, type, help, labels, roles and unit; dashboards,
alert rules and tests import it (or :data:`METRIC_NAMES`, :func:`metric_specs`) instead of
repeating names. The allowed values of the closed labels live here too.
"""
from __future__ import annotations

from dataclasses import dataclass


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
