"""streamdp.observability: metrics over real HTTP, librdkafka lag parsing, health
endpoints, JSON routes and the metric naming conventions (DESIGN §6)."""
import gzip
import json
import re
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamdp import observability as obs
from streamdp.observability import (METRIC_NAMES, METRIC_SPECS, ROLES, HealthState,
                                    ObservabilityServer, ServiceMetrics, metric_specs)


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def get(url: str, headers: dict | None = None):
    """(status, headers, body) of a GET; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()


def get_json(url: str):
    status, headers, body = get(url)
    assert headers["Content-Type"] == "application/json"
    return status, json.loads(body)


def scrape(server: ObservabilityServer):
    """Scrape /metrics; return (families by name, {(sample name, labels): value})."""
    status, headers, body = get(server.url + "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for f in families.values() for s in f.samples}
    return families, samples


def val(samples, name, **labels):
    return samples[(name, frozenset((k, str(v)) for k, v in labels.items()))]


@pytest.fixture
def sketcher():
    clock = FakeClock()
    health = HealthState(liveness_timeout=10, clock=clock, wall_clock=clock)
    metrics = ServiceMetrics("sketcher", version="9.9.9-test", clock=clock)
    with ObservabilityServer(metrics, health) as server:
        yield metrics, health, server, clock


@pytest.fixture
def release():
    clock = FakeClock()
    health = HealthState(liveness_timeout=10, clock=clock, wall_clock=clock)
    metrics = ServiceMetrics("release", version="9.9.9-test", clock=clock)
    with ObservabilityServer(metrics, health) as server:
        yield metrics, health, server, clock


# ------------------------------------------------------------------ sketcher
def test_sketcher_counters_scraped_over_http(sketcher):
    m, health, server, clock = sketcher
    assert server.port > 0
    m.observe_batch(10, 200, 15, 0.02, partition=0)
    m.observe_batch(5, 80, 0, 0.5, partition={1: 3, 2: 2})
    m.observe_batch(0, 0, 0, 0.001, partition=3)  # an empty batch
    m.skipped("too_short", 4)
    m.skipped("empty")
    m.dlq("MsgpackDecodeError")
    m.dlq("MsgpackDecodeError", dropped=True)
    m.dlq("SchemaVersionError", n=3, dropped=True)
    m.checkpointed(3_500_000)
    m.checkpointed(4_000_000)
    m.rebalance("assign", assigned=3)
    m.rebalance("revoke", assigned=1)

    fam, s = scrape(server)
    assert val(s, "streamdp_documents_total", partition=0) == 10
    assert val(s, "streamdp_documents_total", partition=1) == 3
    assert val(s, "streamdp_documents_total", partition=2) == 2
    assert ("streamdp_documents_total", frozenset({("partition", "3")})) not in s
    assert val(s, "streamdp_documents_skipped_total", reason="too_short") == 4
    assert val(s, "streamdp_documents_skipped_total", reason="empty") == 1
    assert val(s, "streamdp_tokens_total") == 280
    assert val(s, "streamdp_unknown_tokens_total") == 15
    assert val(s, "streamdp_dlq_messages_total", error_class="MsgpackDecodeError") == 2
    assert val(s, "streamdp_dlq_messages_total", error_class="SchemaVersionError") == 3
    assert val(s, "streamdp_dlq_dropped_total") == 4
    assert val(s, "streamdp_checkpoints_total") == 2
    assert val(s, "streamdp_checkpoint_bytes") == 4_000_000
    assert val(s, "streamdp_assigned_partitions") == 1
    assert val(s, "streamdp_rebalances_total", kind="assign") == 1
    assert val(s, "streamdp_rebalances_total", kind="revoke") == 1
    assert val(s, "streamdp_rebalances_total", kind="lost") == 0  # pre-initialised

    assert fam["streamdp_batch_duration_seconds"].type == "histogram"
    assert val(s, "streamdp_batch_duration_seconds_count") == 3
    assert val(s, "streamdp_batch_duration_seconds_sum") == pytest.approx(0.521)
    assert val(s, "streamdp_batch_duration_seconds_bucket", le="0.025") == 2
    assert val(s, "streamdp_batch_size_documents_count") == 3
    assert val(s, "streamdp_batch_size_documents_sum") == 15
    assert val(s, "streamdp_batch_size_documents_bucket", le="5.0") == 2
    assert val(s, "streamdp_build_info", version="9.9.9-test", role="sketcher") == 1
    # a sketcher exports no release metric
    assert "streamdp_releases" not in fam and "streamdp_privacy_rho_spent" not in fam


def test_checkpoint_age_grows_with_injected_clock(sketcher):
    m, _, server, clock = sketcher
    clock.advance(12.5)  # no checkpoint yet: age since start
    assert val(scrape(server)[1], "streamdp_checkpoint_age_seconds") == pytest.approx(12.5)
    m.checkpointed(1024)
    assert val(scrape(server)[1], "streamdp_checkpoint_age_seconds") == 0
    clock.advance(30)
    assert val(scrape(server)[1], "streamdp_checkpoint_age_seconds") == pytest.approx(30)
    clock.advance(45)
    assert val(scrape(server)[1], "streamdp_checkpoint_age_seconds") == pytest.approx(75)
    m.checkpointed(1024, at=clock() - 5)
    assert val(scrape(server)[1], "streamdp_checkpoint_age_seconds") == pytest.approx(5)


# ------------------------------------------------------------- librdkafka lag
def _partition(pid: int, *, lag: int, lag_stored: int, desired: bool = True,
               hi: int = 5000) -> dict:
    """One entry of librdkafka's topics.<t>.partitions (fields per STATISTICS.md)."""
    return {
        "partition": pid, "broker": 1 if pid >= 0 else -1, "leader": 1 if pid >= 0 else -1,
        "desired": desired, "unknown": False, "msgq_cnt": 0, "msgq_bytes": 0,
        "xmit_msgq_cnt": 0, "xmit_msgq_bytes": 0, "fetchq_cnt": 12, "fetchq_size": 40960,
        "fetch_state": "active" if desired else "none", "query_offset": -1001,
        "next_offset": hi - max(lag_stored, 0), "app_offset": hi - max(lag_stored, 0),
        "stored_offset": hi - lag_stored if lag_stored >= 0 else -1001,
        "stored_leader_epoch": 0, "commited_offset": hi - lag if lag >= 0 else -1001,
        "committed_offset": hi - lag if lag >= 0 else -1001, "committed_leader_epoch": 0,
        "eof_offset": -1001, "lo_offset": 0, "hi_offset": hi if pid >= 0 else -1001,
        "ls_offset": hi if pid >= 0 else -1001, "consumer_lag": lag,
        "consumer_lag_stored": lag_stored, "leader_epoch": 0, "txmsgs": 0, "txbytes": 0,
        "rxmsgs": 4000, "rxbytes": 2_000_000, "msgs": 4000, "rx_ver_drops": 0,
        "msgs_inflight": 0, "next_ack_seq": 0, "next_err_seq": 0, "acked_msgid": 0,
    }


def consumer_stats(partitions: dict[str, list[dict]], *, name="rdkafka#consumer-1",
                   type_="consumer") -> str:
    """A librdkafka statistics JSON string shaped like a real consumer's stats_cb payload."""
    window = {"min": 0, "max": 0, "avg": 0, "sum": 0, "stddev": 0, "p50": 0, "p75": 0,
              "p90": 0, "p95": 0, "p99": 0, "p99_99": 0, "outofrange": 0, "hdrsize": 15472,
              "cnt": 0}
    return json.dumps({
        "name": name, "client_id": "streamdp-sketcher", "type": type_,
        "ts": 5016483227792, "time": 1700000000, "age": 60_000_000, "replyq": 0,
        "msg_cnt": 0, "msg_size": 0, "msg_max": 100000, "msg_size_max": 1073741824,
        "simple_cnt": 0, "metadata_cache_cnt": 2,
        "brokers": {"localhost:9092/1": {
            "name": "localhost:9092/1", "nodeid": 1, "nodename": "localhost:9092",
            "source": "learned", "state": "UP", "stateage": 59_000_000, "outbuf_cnt": 0,
            "outbuf_msg_cnt": 0, "waitresp_cnt": 1, "waitresp_msg_cnt": 0, "tx": 300,
            "txbytes": 40000, "txerrs": 0, "txretries": 0, "req_timeouts": 0, "rx": 299,
            "rxbytes": 2_100_000, "rxerrs": 0, "rxcorriderrs": 0, "rxpartial": 0,
            "int_latency": window, "outbuf_latency": window, "rtt": window,
            "throttle": window, "req": {"Fetch": 250, "Heartbeat": 20},
            "toppars": {f"{t}-{p['partition']}": {"topic": t, "partition": p["partition"]}
                        for t, ps in partitions.items() for p in ps if p["partition"] >= 0},
        }},
        "topics": {t: {"topic": t, "age": 59000, "metadata_age": 4000,
                       "batchsize": window, "batchcnt": window,
                       "partitions": {str(p["partition"]): p for p in ps}}
                   for t, ps in partitions.items()},
        "cgrp": {"state": "up", "stateage": 58000, "join_state": "steady",
                 "rebalance_age": 57000, "rebalance_cnt": 1,
                 "rebalance_reason": "group join", "assignment_size": 2},
        "tx": 300, "tx_bytes": 40000, "rx": 299, "rx_bytes": 2_100_000,
        "txmsgs": 0, "txmsg_bytes": 0, "rxmsgs": 8000, "rxmsg_bytes": 4_000_000,
    })


def lag_series(metrics: ServiceMetrics) -> dict[tuple[str, str], float]:
    text = prometheus_client.generate_latest(metrics.registry).decode()
    fam = {f.name: f for f in text_string_to_metric_families(text)}
    return {(s.labels["topic"], s.labels["partition"]): s.value
            for s in fam["streamdp_consumer_lag_messages"].samples}


def test_lag_from_librdkafka_stats(sketcher):
    m, _, server, _ = sketcher
    stats = consumer_stats({"docs": [
        _partition(0, lag=-1, lag_stored=120),   # offsets not committed to Kafka (ours)
        _partition(1, lag=7, lag_stored=-1),     # committed only: falls back to consumer_lag
        _partition(2, lag=-1, lag_stored=-1, desired=False),  # not assigned here: no lag
        _partition(3, lag=0, lag_stored=0),      # caught up: 0 is a real value
        # the internal UnAssigned partition; a positive lag here must still be ignored
        _partition(-1, lag=5, lag_stored=5),
    ]})
    got = m.set_lag_from_stats(stats)
    assert got == {("docs", 0): 120, ("docs", 1): 7, ("docs", 3): 0}
    _, s = scrape(server)
    assert val(s, "streamdp_consumer_lag_messages", topic="docs", partition=0) == 120
    assert val(s, "streamdp_consumer_lag_messages", topic="docs", partition=1) == 7
    assert val(s, "streamdp_consumer_lag_messages", topic="docs", partition=3) == 0
    assert ("streamdp_consumer_lag_messages",
            frozenset({("topic", "docs"), ("partition", "2")})) not in s
    assert ("streamdp_consumer_lag_messages",
            frozenset({("topic", "docs"), ("partition", "-1")})) not in s

    # only the committed-offset lag, as the brief's librdkafka field
    m2 = ServiceMetrics("sketcher")
    assert m2.set_lag_from_stats(stats, fields=("consumer_lag",)) == {
        ("docs", 1): 7, ("docs", 3): 0, }


def test_lag_series_removed_when_no_longer_reported():
    m = ServiceMetrics("sketcher")
    m.set_lag_from_stats(consumer_stats({"docs": [
        _partition(0, lag=-1, lag_stored=10), _partition(1, lag=-1, lag_stored=20),
        _partition(-1, lag=-1, lag_stored=-1)]}))
    assert lag_series(m) == {("docs", "0"): 10, ("docs", "1"): 20}
    # partition 1 revoked: librdkafka still lists it, with lag -1; partition 0 moved on
    m.set_lag_from_stats(consumer_stats({"docs": [
        _partition(0, lag=-1, lag_stored=3),
        _partition(1, lag=-1, lag_stored=-1, desired=False)]}))
    assert lag_series(m) == {("docs", "0"): 3}
    # topic gone from the statistics altogether
    m.set_lag_from_stats(consumer_stats({}))
    assert lag_series(m) == {}


def test_lag_tracked_per_handle_and_robust_to_odd_input():
    m = ServiceMetrics("sketcher")
    m.set_lag_from_stats(consumer_stats({"docs": [_partition(0, lag=-1, lag_stored=10)]}))
    # a second consumer handle (e.g. the state-restore consumer) does not erase the first
    m.set_lag_from_stats(consumer_stats({"state": [_partition(0, lag=-1, lag_stored=2)]},
                                        name="rdkafka#consumer-2"))
    assert lag_series(m) == {("docs", "0"): 10, ("state", "0"): 2}
    # producer statistics (the state/DLQ producer) carry no consumer lag: ignored
    assert m.set_lag_from_stats(consumer_stats({"docs": []}, name="rdkafka#producer-1",
                                               type_="producer")) == {}
    assert lag_series(m) == {("docs", "0"): 10, ("state", "0"): 2}
    # structurally odd (but valid JSON) statistics from an unnamed handle: nothing usable
    for odd in ({"topics": {"docs": 3}}, {"topics": []},
                {"topics": {"docs": {"partitions": {"x": {"consumer_lag": 1}}}}},
                {"topics": {"docs": {"partitions": {"0": {"consumer_lag": "7"}}}}}):
        assert m.set_lag_from_stats(json.dumps(odd)) == {}
    assert lag_series(m) == {("docs", "0"): 10, ("state", "0"): 2}
    m.clear_lag()
    assert lag_series(m) == {}


def test_lag_malformed_json_leaves_series_unchanged():
    m = ServiceMetrics("sketcher")
    m.set_lag_from_stats(consumer_stats({"docs": [_partition(0, lag=-1, lag_stored=10)]}))
    for bad in ("{not json", "[]", b"null", "", 12):
        assert m.set_lag_from_stats(bad) == {}
    assert lag_series(m) == {("docs", "0"): 10}


# ------------------------------------------------------------------- release
def test_release_metrics_scraped_over_http(release):
    m, _, server, clock = release
    fam, s = scrape(server)
    for outcome in obs.RELEASE_OUTCOMES:  # pre-initialised: rate()/increase() work at once
        assert val(s, "streamdp_releases_total", outcome=outcome) == 0
    assert val(s, "streamdp_last_release_timestamp_seconds") == 0

    m.release_outcome("published", 1.5)
    published_at = clock()
    clock.advance(60)
    m.release_outcome("refused_budget", 0.02)
    m.release_outcome("failed")
    m.release_outcome("published", 3.0, at=clock() - 1)
    m.set_budget(rho_spent=0.25, rho_remaining=0.75, eps_spent=2.1, eps_budget=4.0)
    m.set_tree(epoch=5, horizon=64)
    m.epoch_closed(6)
    m.epoch_closed(7)

    fam, s = scrape(server)
    assert val(s, "streamdp_releases_total", outcome="published") == 2
    assert val(s, "streamdp_releases_total", outcome="refused_budget") == 1
    assert val(s, "streamdp_releases_total", outcome="failed") == 1
    assert val(s, "streamdp_release_duration_seconds_count") == 3
    assert val(s, "streamdp_release_duration_seconds_sum") == pytest.approx(4.52)
    assert val(s, "streamdp_last_release_timestamp_seconds") == published_at + 59
    assert val(s, "streamdp_privacy_rho_spent") == 0.25
    assert val(s, "streamdp_privacy_rho_remaining") == 0.75
    assert val(s, "streamdp_privacy_epsilon_spent") == 2.1
    assert val(s, "streamdp_privacy_epsilon_budget") == 4.0
    assert val(s, "streamdp_epochs_closed_total") == 2
    assert val(s, "streamdp_tree_epoch") == 7
    assert val(s, "streamdp_tree_horizon") == 64
    assert val(s, "streamdp_build_info", version="9.9.9-test", role="release") == 1
    assert "streamdp_documents" not in fam and "streamdp_consumer_lag_messages" not in fam

    # straight from an Accountant.report()
    m.set_budget_from_report({"rho_worst_case": 0.5, "rho_remaining": 0.5,
                              "epsilon_worst_case": 3.0, "epsilon": 4.0, "delta": 1e-6})
    _, s = scrape(server)
    assert val(s, "streamdp_privacy_rho_remaining") == 0.5
    assert val(s, "streamdp_privacy_epsilon_spent") == 3.0


def test_role_guard_and_argument_validation():
    rel, sk = ServiceMetrics("release"), ServiceMetrics("sketcher")
    with pytest.raises(LookupError, match="not exported by the release"):
        rel.observe_batch(1, 3, 0, 0.1, partition=0)
    with pytest.raises(LookupError):
        sk.release_outcome("published")
    with pytest.raises(LookupError, match="unknown metric"):
        sk.metric("streamdp_nope")
    with pytest.raises(ValueError):
        ServiceMetrics("both")
    with pytest.raises(ValueError):
        rel.release_outcome("ok")
    with pytest.raises(ValueError):
        sk.rebalance("moved")
    with pytest.raises(ValueError):
        sk.observe_batch(-1, 0, 0, 0.1)
    with pytest.raises(ValueError):
        sk.observe_batch(1, 3, 4, 0.1)  # more unknown tokens than tokens
    with pytest.raises(ValueError):
        rel.set_budget(float("nan"), 1, 1, 1)


def test_open_label_values_are_bounded():
    m = ServiceMetrics("sketcher")
    for i in range(obs.MAX_LABEL_VALUES + 20):
        m.dlq(f"Error{i}")
    text = prometheus_client.generate_latest(m.registry).decode()
    fam = {f.name: f for f in text_string_to_metric_families(text)}
    classes = [s.labels["error_class"] for s in fam["streamdp_dlq_messages"].samples
               if s.name.endswith("_total")]
    assert len(classes) == obs.MAX_LABEL_VALUES + 1
    assert m.registry.get_sample_value("streamdp_dlq_messages_total",
                                       {"error_class": obs.OVERFLOW_LABEL}) == 20


def test_services_use_private_registries():
    a, b = ServiceMetrics("sketcher"), ServiceMetrics("sketcher")
    a.dlq("X")
    assert a.registry.get_sample_value("streamdp_dlq_messages_total", {"error_class": "X"}) == 1
    assert b.registry.get_sample_value("streamdp_dlq_messages_total", {"error_class": "X"}) is None
    glob = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "streamdp_" not in glob


# -------------------------------------------------------------------- health
def test_healthz_flips_to_503_when_beat_is_stale(sketcher):
    m, health, server, clock = sketcher
    status, body = get_json(server.url + "/healthz")
    assert status == 200 and body["status"] == "ok"
    assert body["last_progress_age_seconds"] == 0
    clock.advance(9.5)
    status, body = get_json(server.url + "/healthz")
    assert status == 200 and body["last_progress_age_seconds"] == pytest.approx(9.5)
    clock.advance(1.0)  # 10.5 s > liveness_timeout=10
    status, body = get_json(server.url + "/healthz")
    assert status == 503 and body["status"] == "stalled"
    assert body["last_progress_age_seconds"] == pytest.approx(10.5)
    health.beat()  # an (empty) poll
    status, body = get_json(server.url + "/healthz")
    assert status == 200 and body["last_progress_age_seconds"] == 0
    # the last beat is exported as a Unix timestamp
    assert val(scrape(server)[1], "streamdp_last_progress_timestamp_seconds") == clock()


def test_readyz_reflects_set_ready(sketcher):
    _, health, server, _ = sketcher
    status, body = get_json(server.url + "/readyz")
    assert (status, body) == (503, {"status": "not_ready", "reason": "starting"})
    health.set_ready(True, "3 partitions assigned, state restored")
    status, body = get_json(server.url + "/readyz")
    assert status == 200 and body == {"status": "ready",
                                      "reason": "3 partitions assigned, state restored"}
    health.set_ready(False, "shutting down")
    assert get_json(server.url + "/readyz") == (503, {"status": "not_ready",
                                                      "reason": "shutting down"})


def test_mark_progress_without_health():
    clock = FakeClock()
    m = ServiceMetrics("release", clock=clock)
    assert m.registry.get_sample_value("streamdp_last_progress_timestamp_seconds") == 0
    m.mark_progress()
    assert m.registry.get_sample_value("streamdp_last_progress_timestamp_seconds") == clock()


# -------------------------------------------------------------------- server
def test_json_routes(release):
    m, _, server, _ = release
    latest = {"value": None}
    server.add_json_route("/snapshot/latest", lambda: latest["value"])
    server.add_json_route("/boom", lambda: 1 / 0)
    status, body = get_json(server.url + "/snapshot/latest")
    assert status == 404 and body["error"] == "not found"
    latest["value"] = {"epoch": 3, "topics": np.eye(2, dtype=np.float32),
                       "n": np.int64(7)}
    status, body = get_json(server.url + "/snapshot/latest?x=1")
    assert status == 200 and body == {"epoch": 3, "topics": [[1.0, 0.0], [0.0, 1.0]], "n": 7}
    status, body = get_json(server.url + "/boom")
    assert status == 500 and body["error"] == "ZeroDivisionError"
    status, body = get_json(server.url + "/nope")
    assert status == 404 and "/snapshot/latest" in body["routes"]
    with pytest.raises(ValueError):
        server.add_json_route("/metrics", lambda: {})
    # the server survived the failing route
    assert get(server.url + "/metrics")[0] == 200


def test_metrics_content_negotiation_and_gzip(sketcher):
    _, _, server, _ = sketcher
    status, headers, body = get(server.url + "/metrics",
                                {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    status, headers, body = get(server.url + "/metrics", {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert b"streamdp_build_info" in gzip.decompress(body)


def test_server_close_is_prompt_and_releases_port():
    m, h = ServiceMetrics("sketcher"), HealthState()
    server = ObservabilityServer(m, h)
    port = server.port
    assert get(server.url + "/healthz")[0] == 200
    t0 = time.monotonic()
    server.close()
    server.close()  # idempotent
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


# ---------------------------------------------------------- naming contract
_FORBIDDEN_UNIT_TOKENS = {"ms", "msec", "millis", "milliseconds", "us", "micros",
                          "microseconds", "ns", "nanoseconds", "minutes", "hours", "days",
                          "kb", "mb", "gb", "kib", "mib", "kilobytes", "megabytes",
                          "gigabytes", "bits", "percent", "pct"}
_BASE_UNITS = {"", "seconds", "bytes", "documents", "tokens", "messages"}
_RESERVED_SUFFIXES = ("_count", "_sum", "_bucket", "_created", "_gcount", "_gsum")
_NAME = re.compile(r"^streamdp_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_LABEL = re.compile(r"^[a-z][a-z0-9_]*$")


def naming_problems(spec: obs.MetricSpec) -> list[str]:
    """Violations of DESIGN §6 / Prometheus naming practice for one metric."""
    p, name = [], spec.name
    if not _NAME.match(name):
        p.append("name must be streamdp_ + lower snake_case")
    if spec.type not in ("counter", "gauge", "histogram"):
        p.append(f"unknown type {spec.type}")
    if (spec.type == "counter") != name.endswith("_total"):
        p.append("counters, and only counters, end in _total")
    if name.endswith(_RESERVED_SUFFIXES):
        p.append("reserved suffix")
    if name.endswith("_info") and not (spec.type == "gauge" and spec.labels):
        p.append("_info is for labelled constant-1 gauges")
    base = name[:-len("_total")] if spec.type == "counter" else name
    tokens = base.split("_")
    if _FORBIDDEN_UNIT_TOKENS & set(tokens):
        p.append("use base units (seconds, bytes)")
    if spec.unit not in _BASE_UNITS:
        p.append(f"unit {spec.unit!r} is not a base unit")
    if spec.unit and not base.endswith("_" + spec.unit):
        p.append(f"name must end in _{spec.unit}" + ("_total" if spec.type == "counter" else ""))
    for unit in ("seconds", "bytes"):
        if unit in tokens and spec.unit != unit:
            p.append(f"'{unit}' must be the declared unit suffix")
    if spec.type == "histogram" and not spec.unit:
        p.append("histograms need a unit")
    if "timestamp" in tokens and not base.endswith("_timestamp_seconds"):
        p.append("timestamps end in _timestamp_seconds")
    if len(set(spec.labels)) != len(spec.labels) or any(
            not _LABEL.match(lb) or lb in ("le", "quantile") for lb in spec.labels):
        p.append("bad label names")
    if not spec.help or not spec.help.endswith("."):
        p.append("help must be a sentence")
    if not spec.roles or not set(spec.roles) <= set(ROLES):
        p.append("roles must be a non-empty subset of ROLES")
    return p


@pytest.mark.parametrize("spec", METRIC_SPECS, ids=lambda s: s.name)
def test_metric_follows_naming_conventions(spec):
    assert naming_problems(spec) == []


def test_naming_check_rejects_bad_names():
    bad = [
        obs.MetricSpec("streamdp_requests", "counter", "No _total."),
        obs.MetricSpec("streamdp_queue_total", "gauge", "Gauge with _total."),
        obs.MetricSpec("documents_total", "counter", "No prefix.", unit="documents"),
        obs.MetricSpec("streamdp_poll_latency_ms", "histogram", "Milliseconds.", unit="ms"),
        obs.MetricSpec("streamdp_poll_latency", "histogram", "No unit."),
        obs.MetricSpec("streamdp_state_size", "gauge", "Wrong suffix.", unit="bytes"),
        obs.MetricSpec("streamdp_seconds_since_release", "gauge", "Unit not a suffix."),
        obs.MetricSpec("streamdp_last_release_timestamp", "gauge", "No unit.", unit=""),
        obs.MetricSpec("streamdp_Lag", "gauge", "Case."),
        obs.MetricSpec("streamdp_x", "gauge", "Reserved label.", ("le",)),
        obs.MetricSpec("streamdp_x_bucket", "gauge", "Reserved suffix."),
    ]
    for spec in bad:
        assert naming_problems(spec), spec.name


def test_metric_list_is_unique_and_complete():
    assert len(set(METRIC_NAMES)) == len(METRIC_NAMES) == len(METRIC_SPECS)
    assert set(metric_specs()) == set(METRIC_NAMES)
    sk, rel = set(metric_specs("sketcher")), set(metric_specs("release"))
    assert sk | rel == set(METRIC_NAMES)
    assert sk & rel == {"streamdp_build_info", "streamdp_last_progress_timestamp_seconds"}
    assert metric_specs()["streamdp_consumer_lag_messages"].labels == ("topic", "partition")


@pytest.mark.parametrize("role", ROLES)
def test_every_declared_metric_is_exported_by_its_role(role):
    metrics, health = ServiceMetrics(role), HealthState()
    with ObservabilityServer(metrics, health) as server:
        families, _ = scrape(server)
    exported = {}
    for f in families.values():
        if f.name.startswith("streamdp_") and not f.name.endswith("_created"):
            exported[f.name + ("_total" if f.type == "counter" else "")] = f.type
    expected = {n: s.type for n, s in metric_specs(role).items()}
    assert exported == expected  # nothing missing, nothing undeclared, types match


# ------------------------------------------------------------------ trust boundary
def test_exact_counts_switch_drops_data_dependent_counts_from_metrics():
    """metrics_exact_counts: false (a widely shared Prometheus): no exact document counts."""
    stats = json.dumps({"type": "consumer", "name": "c1", "topics": {"docs": {"partitions": {
        "0": {"partition": 0, "consumer_lag_stored": 17}}}}})
    bodies = {}
    for exact in (True, False):
        m = ServiceMetrics("sketcher", version="t", exact_counts=exact)
        m.observe_batch(10, 200, 15, 0.02, partition=0)
        m.skipped("too_short", 4)
        m.dlq("MsgpackDecodeError", dropped=True)
        m.set_lag_from_stats(stats)
        m.checkpointed(1000)
        with ObservabilityServer(m, HealthState()) as server:
            status, _, body = get(server.url + "/metrics")
            assert status == 200
            bodies[exact] = body.decode()
    for name in obs.EXACT_COUNT_METRICS:
        assert name in bodies[True], name
        assert name not in bodies[False], name
    public = {f.name for f in text_string_to_metric_families(bodies[False])}
    # what stays: health, progress, throughput timing, checkpoints
    assert {"streamdp_batch_duration_seconds", "streamdp_checkpoints", "streamdp_build_info",
            "streamdp_last_progress_timestamp_seconds"} <= public
    assert not re.search(r"\b10(\.0)?\b", "\n".join(
        l for l in bodies[False].splitlines() if l.startswith("streamdp_") and "bucket" not in l
        and "duration" not in l and "build_info" not in l))


def test_exact_counts_switch_reaches_the_sketcher(kafka_broker, kafka_topics, tmp_path):
    from streamdp.services.config import from_mapping
    from streamdp.services.sketcher import Sketcher
    from streamdp.text.vocabulary import Vocabulary
    Vocabulary([f"w{i}" for i in range(30)]).save(tmp_path / "v.txt")
    cfg = from_mapping({"bootstrap": kafka_broker.bootstrap, "vocabulary": str(tmp_path / "v.txt"),
                        "vocabulary_public_by_assumption": True, "topic_prefix": kafka_topics.documents.rsplit(".", 1)[0], "n_topics": 2,
                        "non_production": True},
                       env={"STREAMDP_METRICS_EXACT_COUNTS": "false"})
    sk = Sketcher(cfg)
    try:
        assert sk.metrics.exact_counts is False
        body, _ = sk.metrics.exposition()
        assert b"streamdp_documents_total" not in body and b"streamdp_checkpoints_total" in body
    finally:
        sk.close()


def test_slow_clients_do_not_block_scrapes_or_shutdown():
    """200 clients that open a connection and send half a request line (a slow or hostile
    scraper) hold a thread each, not the server: their connections are accepted at once (a
    listen backlog of 5 made every few wait for a 1 s SYN retransmit: 33 s for 200), health
    and metrics still answer, and close() stays prompt (daemon handler threads with a socket
    timeout). The bounds are loose: the fast path takes well under a second."""
    m, h = ServiceMetrics("sketcher"), HealthState(liveness_timeout=3600)
    server = ObservabilityServer(m, h)
    slow = []
    try:
        t0 = time.monotonic()
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /metr")
            slow.append(s)
        assert get(server.url + "/healthz")[0] == 200
        families, _ = scrape(server)
        assert "streamdp_build_info" in families
        assert time.monotonic() - t0 < 15.0
    finally:
        t0 = time.monotonic()
        server.close()
        assert time.monotonic() - t0 < 2.0
        for s in slow:
            s.close()


def test_head_answers_like_get_without_a_body():
    m, h = ServiceMetrics("release"), HealthState()
    with ObservabilityServer(m, h) as server:
        server.add_json_route("/snapshot/latest", lambda: {"epoch": 1})
        for path in ("/metrics", "/healthz", "/snapshot/latest"):
            req = urllib.request.Request(server.url + path, method="HEAD")
            with urllib.request.urlopen(req, timeout=5) as r:
                assert r.status == 200 and r.read() == b""
                assert int(r.headers["Content-Length"]) > 0
                assert r.headers["Cache-Control"] == "no-store"
