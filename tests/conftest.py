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
