"""The one chunked compensated accumulator (streamdp.moments.accumulator): chunks are counted in
its own row sequence, whatever the callers' batches, in both ways of holding the open chunk."""
import numpy as np
import pytest
import scipy.sparse as sp

from streamdp.moments.accumulator import ChunkedAccumulator

D, CHUNK = 7, 5


def _rows(n, seed=0):
    X = sp.random(n, D, density=0.6, random_state=seed, format="csr")
    X.data = np.ceil(X.data * 9)
    return X


def _fed(X, cuts, seen):
    acc = ChunkedAccumulator({"s": (D,)}, CHUNK, rows_of=D)

    def update(rows, w):
        seen.append(rows.shape[0])
        acc.add("s", np.asarray(rows.multiply(w[:, None]).sum(axis=0)).ravel() * 0.1)
    a = 0
    for b in cuts + [X.shape[0]]:
        acc.feed(X[a:b], None, update)
        a = b
    return acc, update


def test_rows_mode_chunks_do_not_depend_on_the_callers_batches():
    X, one, many = _rows(23), [], []
    a, up_a = _fed(X, [], one)
    b, up_b = _fed(X, [1, 2, 9, 10, 17], many)
    assert one == many == [CHUNK] * 4 and a.open_rows == b.open_rows == 3
    a.close(up_a), b.close(up_b)
    assert a.hi["s"].tobytes() == b.hi["s"].tobytes() and a.lo["s"].tobytes() == b.lo["s"].tobytes()
    assert np.allclose(a.value("s"), np.asarray(X.sum(axis=0)).ravel() * 0.1)


def test_running_sums_mode_closes_each_chunk_once_and_reads_on_a_copy():
    acc = ChunkedAccumulator({"s": ()}, CHUNK)
    terms = np.arange(13, dtype=float) * 0.1
    pieces = []
    for lo, hi in ((0, 3), (3, 11), (11, 13)):
        for a, b in acc.segments(hi - lo):
            pieces.append((lo + a, lo + b))
            start = acc.open_sums()
            acc.open = {"s": (0.0 if start is None else start["s"]) + terms[lo + a:lo + b].sum()}
    assert pieces == [(0, 3), (3, 5), (5, 10), (10, 11), (11, 13)] and acc.open_rows == 3
    read = acc.closed()
    assert read is not acc and acc.open_rows == 3 and read.open_rows == 0
    assert read.value("s") == pytest.approx(terms.sum())


def test_a_merge_never_puts_two_sequences_in_one_chunk():
    X = _rows(8)
    a, _ = _fed(X, [], [])
    b, up_b = _fed(X, [], [])
    with pytest.raises(ValueError, match="close the open chunks"):
        b.merge(a)               # a's 3 open rows: only its owner can sum them
    a.close(lambda rows, w: None)
    with pytest.raises(ValueError, match="close the open chunks"):
        b.merge(a)               # b's own open rows
    b.close(up_b)
    b.merge(a)
