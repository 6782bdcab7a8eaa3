"""The compiled fold-in (streamdp._fold_in_kernel via streamdp.refinement.fold_in and
RefinementModel.document_terms) against straightforward per-document (parallel) CVB0 sweeps.

Cases the kernel's branches must get right: words every topic gives probability 0 (their
responsibilities are the leave-one-out topic shares), empty documents (θ = prior mean, no responsibilities), a single-word
document, one iteration only, α entries below the 10⁻³ floor, and long documents. Each
document's values must be its own: bit-identical alone, in any block, in any position.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from streamdp import refinement as R


def reference_fold_in(counts: np.ndarray, phi: np.ndarray, alpha: np.ndarray, n_iter: int):
    """One document (dense counts, d) under Φ (k, d): the CVB0 sweeps written out."""
    alpha = np.maximum(alpha, 1e-3)
    words = np.flatnonzero(counts)
    c = counts[words]
    p = phi[:, words] * alpha[:, None]                          # (k, m) start: prior mean
    s = p.sum(axis=0)
    g = np.where(s > 0, p / np.where(s > 0, s, 1.0), (alpha / alpha.sum())[:, None]).T   # (m, k)
    for _ in range(n_iter):
        N = (c[:, None] * g).sum(axis=0)                       # one N for the whole sweep
        new = np.empty_like(g)
        for j in range(words.size):
            rest = alpha + N - g[j]                             # this token left out
            v = phi[:, words[j]] * rest
            new[j] = v / v.sum() if v.sum() > 0 else rest / rest.sum()
        g = new
    th = (alpha + (c[:, None] * g).sum(axis=0)) / (alpha.sum() + c.sum())
    return th, g


def reference_terms(counts: np.ndarray, phi, alpha, n_iter):
    _, r = reference_fold_in(counts, phi, alpha, n_iter)
    c = counts[np.flatnonzero(counts)]
    return (c / np.linalg.norm(c))[:, None] * r if c.size else r


def _model(rng, k, d, zero_words=(0, 1)):
    phi = rng.dirichlet(np.full(d, 0.3), size=k)
    phi[rng.random(phi.shape) < 0.4] = 0.0
    phi[:, list(zero_words)] = 0.0                   # words no topic can emit
    phi /= phi.sum(axis=1, keepdims=True)
    alpha = rng.uniform(0.05, 2.0, size=k)
    alpha[0] = 1e-6                                  # below the floor
    return phi, alpha


def _corpus(rng, d):
    X = rng.poisson(0.6, size=(30, d)).astype(float)
    X[3] = 0.0                                        # empty
    X[7] = 0.0
    X[7, 5] = 4.0                                     # a single word (4 times)
    X[8] = 0.0
    X[8, 0] = 2.0                                     # a single unemittable word
    X[9, :2] = [3.0, 1.0]                             # unemittable words among others
    X[11] = rng.integers(0, 300, size=d)              # long
    X[12] = 0.0
    X[12, [0, 1]] = 1.0                               # only unemittable words
    X[29] = 0.0                                       # empty, last
    return sp.csr_matrix(X)


@pytest.mark.parametrize("n_iter", [1, 2, 5, 10])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fold_in_equals_the_per_document_fixed_point(seed, n_iter):
    rng = np.random.default_rng(seed)
    k, d = 6, 25
    phi, alpha = _model(rng, k, d)
    X = _corpus(rng, d)
    theta, resp = R.fold_in(X, phi, alpha, n_iter=n_iter)
    assert theta.shape == (X.shape[0], k) and resp.shape == (X.nnz, k)
    for n in range(X.shape[0]):
        th, r = reference_fold_in(X[n].toarray().ravel(), phi, alpha, n_iter)
        np.testing.assert_allclose(theta[n], th, rtol=1e-10, atol=0)
        np.testing.assert_allclose(resp[X.indptr[n]:X.indptr[n + 1]], r, rtol=1e-10, atol=0)
    # the cases themselves: empty → prior mean; a document of unemittable words only keeps
    # the prior mean's responsibilities (each word's leave-one-out shares are the other's)
    a = np.maximum(alpha, 1e-3)
    np.testing.assert_allclose(theta[3], a / a.sum(), rtol=1e-15)
    np.testing.assert_allclose(resp.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(resp[X.indptr[12]:X.indptr[13]], np.tile(a / a.sum(), (2, 1)),
                               rtol=1e-12)


def test_fold_in_accepts_a_precomputed_transpose_and_checks_it():
    rng = np.random.default_rng(5)
    phi, alpha = _model(rng, 4, 15)
    X = _corpus(rng, 15)
    a = R.fold_in(X, phi, alpha, n_iter=4)
    b = R.fold_in(X, phi, alpha, n_iter=4, topic_word_t=np.ascontiguousarray(phi.T))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    with pytest.raises(ValueError, match="topic_word_t"):
        R.fold_in(X, phi, alpha, topic_word_t=phi)
    with pytest.raises(ValueError, match="alpha"):
        R.fold_in(X, phi, alpha[:-1])


@pytest.mark.parametrize("seed", [0, 1])
def test_document_terms_equal_the_reference_and_are_row_by_row(seed):
    rng = np.random.default_rng(seed)
    k, d = 5, 25
    phi, alpha = _model(rng, k, d)
    model = R.RefinementModel(phi, alpha, fold_in_iter=5)
    X = _corpus(rng, d)
    vals, n = model.document_terms(X)
    assert n == int((np.asarray(X.sum(axis=1)).ravel() > 0).sum())
    for i in range(X.shape[0]):
        part = vals[X.indptr[i]:X.indptr[i + 1]]
        ref = reference_terms(X[i].toarray().ravel(), phi, alpha, 5)
        np.testing.assert_allclose(part, ref, rtol=1e-10, atol=0)
        assert np.linalg.norm(part) <= 1.0
        # the same document alone, and after a shuffled block: bit-identical values
        alone, _ = model.document_terms(X[i])
        assert np.array_equal(alone, part)
    perm = rng.permutation(X.shape[0])
    shuffled, _ = model.document_terms(X[perm])
    Y = X[perm]
    for pos, i in enumerate(perm):
        assert np.array_equal(shuffled[Y.indptr[pos]:Y.indptr[pos + 1]],
                              vals[X.indptr[i]:X.indptr[i + 1]])


def test_frobenius_guard_scales_terms_the_kernel_got_wrong(monkeypatch):
    """The sensitivity does not rest on the kernel: responsibilities that do not sum to 1
    (a wrong kernel) are still scaled back to norm 1 per document by the guard."""
    rng = np.random.default_rng(3)
    phi, alpha = _model(rng, 4, 20)
    model = R.RefinementModel(phi, alpha)
    X = _corpus(rng, 20)
    kernel = R._kernel()

    def inflated(indptr, indices, counts, phiT, a, n_iter, theta, resp, norms, scaled):
        kernel(indptr, indices, counts, phiT, a, n_iter, theta, resp, norms, scaled)
        resp *= 7.0

    monkeypatch.setattr(R, "_kernel", lambda: inflated)
    vals, _ = model.document_terms(X)
    for i in range(X.shape[0]):
        part = vals[X.indptr[i]:X.indptr[i + 1]]
        if part.size:
            assert np.linalg.norm(part) == pytest.approx(1.0, rel=1e-12)
            assert np.linalg.norm(part) <= 1.0 + 1e-9


def _random_batch(rng, n, d):
    """Rows of random length (0 to 3·k words, a tenth empty, a tenth one word), counts 1–4."""
    rows = []
    for _ in range(n):
        kind = rng.random()
        m = 0 if kind < 0.1 else 1 if kind < 0.2 else int(rng.integers(2, 61))
        row = np.zeros(d)
        row[rng.choice(d, size=m, replace=False)] = rng.integers(1, 5, size=m)
        rows.append(row)
    return sp.csr_matrix(np.array(rows))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_matches_the_reference_on_random_batches(seed):
    """The compiled sweeps (words' normalisers summed eight words side by side) give the
    written-out sweeps' values on random batches at k = 20: lengths from 0 to 60 words (so
    every number of whole eight-word groups and remainders), empty and one-word rows, and
    the R_d values the kernel scales as it writes them."""
    rng = np.random.default_rng(100 + seed)
    k, d = 20, 150
    phi, alpha = _model(rng, k, d)
    X = _random_batch(rng, 80, d)
    assert {0, 1} <= set(np.diff(X.indptr)) and np.diff(X.indptr).max() > 40
    theta, resp = R.fold_in(X, phi, alpha, n_iter=5)
    vals, n = R.RefinementModel(phi, alpha, fold_in_iter=5).document_terms(X)
    assert n == int((np.diff(X.indptr) > 0).sum())
    for i in range(X.shape[0]):
        row = X[i].toarray().ravel()
        th, r = reference_fold_in(row, phi, alpha, 5)
        part = slice(X.indptr[i], X.indptr[i + 1])
        np.testing.assert_allclose(theta[i], th, rtol=1e-12, atol=0)
        np.testing.assert_allclose(resp[part], r, rtol=1e-12, atol=0)
        np.testing.assert_allclose(vals[part], reference_terms(row, phi, alpha, 5),
                                   rtol=1e-12, atol=0)


def test_kernel_compiled_equals_its_python_semantics():
    """No reassociation or contraction by the compiler: the kernel run as plain Python
    (NUMBA_DISABLE_JIT=1, another process) gives the compiled kernel's values bit for bit."""
    rng = np.random.default_rng(7)
    phi, alpha = _model(rng, 20, 60)
    X = _random_batch(rng, 12, 60)
    args = (X.indptr, X.indices, X.data, np.ascontiguousarray(phi.T), np.maximum(alpha, 1e-3), 3)
    norms = np.sqrt(R._segment_sum(X.data * X.data, X.indptr))
    norms[norms == 0] = 1.0
    script = ("import pickle, sys, numpy as np\n"
              "from streamdp._fold_in_kernel import fold_in_rows\n"
              "args, norms = pickle.load(sys.stdin.buffer)\n"
              "out = []\n"
              "for scaled in (False, True):\n"
              "    th, r = np.empty((len(args[0]) - 1, 20)), np.empty((len(args[1]), 20))\n"
              "    fold_in_rows(*args, th, r, norms, scaled)\n"
              "    out.append((th, r))\n"
              "sys.stdout.buffer.write(pickle.dumps(out))\n")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    done = subprocess.run([sys.executable, "-c", script], input=pickle.dumps((args, norms)),
                          capture_output=True, env=env, timeout=120, check=True,
                          cwd=Path(R.__file__).resolve().parents[1])     # this checkout's kernel
    python_out = pickle.loads(done.stdout)
    kernel = R._kernel()
    for scaled, (th_py, r_py) in zip((False, True), python_out):
        th, r = np.empty_like(th_py), np.empty_like(r_py)
        kernel(*args, th, r, norms, scaled)
        assert np.array_equal(th, th_py) and np.array_equal(r, r_py)
