"""Issue 24: one sketcher that takes over many partitions with a backlog catches up.

On the embedded broker: 24 documents partitions pre-filled with a backlog, the production
path (token-id documents, a subspace, released refinement models: every document is folded
in), one real :class:`Sketcher` running ``step()``. Before the fix its periodic
``checkpoint_all`` wrote the 24 states (≈ 6.5 MB each here) in one loop, ran past
``max.poll.interval.ms`` (20 s), librdkafka left the group ("MAXPOLL ... leaving group") and
the sketcher lost every partition without a checkpoint. Now a loop does one bounded batch
and one bounded round of checkpoints (services/processor.py).
"""
from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

PARTITIONS = 24
DOCS = 24_000
D, K = 20_000, 20          # k × d float64 refinement sums per open epoch: the large state


@pytest.mark.slow
def test_one_sketcher_takes_over_24_partitions_with_a_backlog(kafka_broker, tmp_path):
    from confluent_kafka import Producer

    from pipeline import (CLOSED_EPOCHS, EPOCH_SECONDS, encode_messages, make_corpus, pseudo_words,
                          public_subspace, write_release_models)
    from streamdp.kafka.state_store import StateStore
    from streamdp.kafka.topics import TopicNames, client_config, ensure_topics
    from streamdp.moments.clipping import ClipBounds
    from streamdp.observability import POLL_LOOP_LONGEST_SECONDS
    from streamdp.services.config import ServiceConfig
    from streamdp.services.processor import MAX_POLL_INTERVAL_MS
    from streamdp.services.sketcher import Sketcher
    from streamdp.text.vocabulary import Vocabulary
    from streamdp.whitening.subspace import Subspace

    bootstrap = kafka_broker.bootstrap
    prefix = f"test.backlog.{uuid.uuid4().hex[:8]}"
    names = TopicNames.from_prefix(prefix)
    ensure_topics(bootstrap, names, partitions=PARTITIONS)

    # the backlog: DOCS documents of the two open stream epochs, round-robin over the partitions
    X = make_corpus(D, K, DOCS, seed=0)
    vocab = Vocabulary(pseudo_words(D))
    vocab_path = tmp_path / "vocabulary.txt"
    vocab.save(str(vocab_path))
    stream_start = float(int(time.time()) - 7 * 86400)
    ts = stream_start + (CLOSED_EPOCHS + np.sort(np.random.default_rng(2).random(DOCS)) * 2) * EPOCH_SECONDS
    msgs = encode_messages(X, "counts", list(vocab.words), ts, 3)
    prod = Producer({**client_config(bootstrap, "producer"), "linger.ms": 20, "acks": "all"})
    expected_docs = np.zeros(PARTITIONS, int)
    expected_tokens = np.zeros(PARTITIONS, int)
    lengths = np.asarray(X.sum(axis=1)).ravel().astype(int)
    for i, (doc_id, t, raw) in enumerate(msgs):
        p = i % PARTITIONS
        while True:
            try:
                prod.produce(names.documents, key=doc_id.encode(), value=raw, partition=p,
                             timestamp=int(t * 1000))
                break
            except BufferError:
                prod.poll(0.1)
        expected_docs[p] += 1
        expected_tokens[p] += lengths[i]
    assert prod.flush(60) == 0

    class Args:
        d, k, seed = D, K, 0
    Q, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((D, 2 * K)))
    sub = Subspace(Q)
    with StateStore(None, bootstrap, names.state) as store:
        public_subspace(store, prefix, sub, ClipBounds.for_length(20.0), vocab.id)
        write_release_models(store, Args, prefix)

    cfg = ServiceConfig(bootstrap=bootstrap, topic_prefix=prefix, group_id=f"{prefix}-sketchers",
                        vocabulary=str(vocab_path), vocabulary_public_by_assumption=True, n_topics=K,
                        stream_start=stream_start, refinement=True, epoch_seconds=EPOCH_SECONDS,
                        batch_size=5000, checkpoint_seconds=5.0, poll_seconds=0.2, seed=0,
                        non_production=True, confirm_backfill=True)
    sk = Sketcher(cfg, instance="backlog-0")
    try:
        sk._refresh_subspace()
        sk.processor.subscribe()
        deadline = time.monotonic() + 600

        def caught_up() -> bool:
            return (len(sk.states) == PARTITIONS
                    and all(sk.states[p].counters["documents"] >= expected_docs[p] for p in sk.states))

        while not caught_up():
            assert time.monotonic() < deadline, "the sketcher did not catch up in 600 s"
            sk.step()
            kinds = {kind for kind, _ in sk.processor.rebalance_log}
            assert kinds <= {"assign"}, f"a rebalance: {list(sk.processor.rebalance_log)}"
        # a few more loops: the periodic checkpoints keep coming without a rebalance
        for _ in range(20):
            sk.step()
        log = list(sk.processor.rebalance_log)
        assert [kind for kind, _ in log] == ["assign"] and log[0][1] == list(range(PARTITIONS)), log
        # exact against a clean run: every document once, no more, none late or dead-lettered
        for p in range(PARTITIONS):
            c = sk.states[p].counters
            assert (c["documents"], c["tokens"], c["late"], c["dlq"]) == \
                (expected_docs[p], expected_tokens[p], 0, 0), (p, c)
        assert sk.fenced_writes == 0
        longest = sk.processor.longest_loop
        assert longest < MAX_POLL_INTERVAL_MS / 1000 / 2, longest     # well inside
        scraped = sk.metrics.registry.get_sample_value(POLL_LOOP_LONGEST_SECONDS)
        assert scraped == pytest.approx(longest)
        assert sk.metrics.registry.get_sample_value("streamdp_checkpoints_total") >= 1
        # the checkpoints written are the truth: a restore reads the same counts
        sk.checkpoint_all()
    finally:
        sk.close()
    from streamdp.services.partition_state import PartitionState, state_key
    with StateStore(None, bootstrap, names.state) as store:
        found = store.read_all_latest(prefix=f"sketch/{names.documents}/")
    for p in range(PARTITIONS):
        st = PartitionState.from_bytes(found[state_key(names.documents, p)].payload, sub)
        assert st.counters["documents"] == expected_docs[p]
        assert st.next_offset == expected_docs[p]
