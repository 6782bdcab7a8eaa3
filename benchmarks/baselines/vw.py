"""Non-private peer: Vowpal Wabbit's online variational LDA (``--lda``, C++, PyPI ``vowpalwabbit``).

VW's ``--lda`` is Hoffman, Blei & Bach's online variational Bayes (as gensim's and scikit-learn's
online LDA) written in C++ with SIMD digamma/exp approximations. Same vocabulary and k as every
other model of ``benchmarks/compare.py``: document i is written in VW's text format as
``| j:c j:c …`` with j the *column index* of the counts matrix; VW's default ``--hash strings``
maps an integer feature name in the default namespace to that integer, so feature j is weight
row j (``-b`` is the smallest number of bits with 2^b ≥ d; no collisions). One online pass, in the
order given.

The documents go through VW's own C++ text parser: ``vowpalwabbit.Workspace("--lda k … -d FILE")``
drives the whole file in the constructor (``run_parser``) and, at the end of the examples, learns
the last partial minibatch and applies the lazily deferred decay to every word's λ (VW's
``end_pass`` / ``end_examples``). Feeding examples one by one through ``Workspace.learn`` is not
usable for ``--lda`` in vowpalwabbit 9.11: the Python wrapper cannot build an example for VW's
no-label parser (``RuntimeError: unsupported label parser used``), and forcing another label type
skips both end-of-data steps, so the last minibatch is lost and λ is left undecayed. VW's parser
runs in a thread of its own beside the learner; ``info["cpu_per_wall"]`` shows how much of a second
core that used. Writing the text file is not timed in ``fit_seconds`` (it is ``write_seconds``),
just as the other models get their input matrix ready-made.

Settings: ``--lda_alpha`` = 1/k (α0 = 1, as every model of the comparison), ``--lda_rho`` = 1/k
(topic-word prior, gensim's and scikit-learn's default), ``--lda_D`` = n, and VW's documented LDA
recipe for the rest (``--minibatch 256 --power_t 0.5 --initial_t 1``, learning rate 0.5, the
default): ρ_t = 0.5 · t^−0.5 per minibatch.

    topic_word, info = fit_vw(counts_csr, 20, seed=0)

``topic_word`` is (k, d), rows on the simplex: (λ_kw + ρ) normalised over our d columns, read with
``Workspace.get_weight(j, topic)`` (what ``--readable_model`` prints is the same λ + ρ). VW's own
progressive loss (−variational bound per word, summed over documents, averaged by
``get_sum_loss() / get_weighted_examples()``) is ``info["own_average_loss"]``: an estimate on the
training stream, not comparable with compare.py's held-out document-completion perplexity.
"""
from __future__ import annotations

import math
import os
import tempfile
import time

import numpy as np
import scipy.sparse as sp

DEFAULT_MINIBATCH = 256
DEFAULT_POWER_T = 0.5
DEFAULT_INITIAL_T = 1.0
DEFAULT_LEARNING_RATE = 0.5


def write_vw_text(X: sp.csr_matrix, path: str) -> None:
    """One line ``| j:c j:c …`` per row (an empty row is ``|``: a document with no words)."""
    indptr, indices, data = X.indptr, X.indices, X.data
    with open(path, "w") as f:
        for i in range(X.shape[0]):
            s, e = indptr[i], indptr[i + 1]
            f.write("| " + " ".join(f"{j}:{c:g}" for j, c in zip(indices[s:e].tolist(),
                                                              data[s:e].tolist())) + "\n")


def fit_vw(counts, n_topics: int, *, seed: int, alpha: float | None = None,
           rho: float | None = None, minibatch: int = DEFAULT_MINIBATCH,
           power_t: float = DEFAULT_POWER_T, initial_t: float = DEFAULT_INITIAL_T,
           learning_rate: float = DEFAULT_LEARNING_RATE, workdir: str | None = None,
           extra_args: str = ""):
    """VW ``--lda`` over the rows of ``counts``, one pass (see module doc)."""
    import vowpalwabbit

    X = sp.csr_matrix(counts, dtype=np.float64)
    if X.nnz and X.data.min() < 0:
        raise ValueError("VW LDA needs non-negative counts")
    n, d = X.shape
    k = int(n_topics)
    alpha = 1.0 / k if alpha is None else float(alpha)
    rho = 1.0 / k if rho is None else float(rho)
    bits = max(1, math.ceil(math.log2(d)))
    # vowpalwabbit 9.11.9 segfaults when --minibatch exceeds its example queue (256 by default):
    # --lda then swaps in a larger parser queue and crashes. A queue that holds a minibatch from
    # the start avoids that path.
    queue = max(256, 1 << max(0, int(minibatch) - 1).bit_length())
    with tempfile.TemporaryDirectory(dir=workdir, prefix="vw_lda_") as tmp:
        data = os.path.join(tmp, "train.vw")
        t0 = time.perf_counter()
        write_vw_text(X, data)
        write_seconds = time.perf_counter() - t0
        args = (f"--lda {k} --lda_D {n} --lda_alpha {alpha!r} --lda_rho {rho!r} "
                f"--minibatch {int(minibatch)} --power_t {power_t!r} --initial_t {initial_t!r} "
                f"--learning_rate {learning_rate!r} -b {bits} --random_seed {int(seed)} "
                f"--example_queue_limit {queue} "
                f"--quiet --no_stdin {extra_args} -d {data}")
        cpu0, t1 = time.process_time(), time.perf_counter()
        ws = vowpalwabbit.Workspace(args)          # parses and learns the whole file
        fit = time.perf_counter() - t1
        cpu = time.process_time() - cpu0
        try:
            lam = np.array([[ws.get_weight(j, t) for j in range(d)] for t in range(k)])
            examples = ws.get_weighted_examples()
            loss = ws.get_sum_loss() / examples if examples else None
        finally:
            ws.finish()
    B = lam + rho
    if not np.all(np.isfinite(B)) or B.min() <= 0:
        raise RuntimeError("VW returned non-finite or non-positive topic weights")
    B /= B.sum(axis=1, keepdims=True)
    return B, {
        "library": "vowpalwabbit", "version": vowpalwabbit.__version__,
        "fit_seconds": fit, "write_seconds": write_seconds, "cpu_seconds": cpu,
        "cpu_per_wall": cpu / fit, "docs_per_s": n / fit, "n_docs": n, "passes": 1,
        "examples_seen": examples, "own_average_loss": loss,
        "settings": {"args": args.replace(data, "FILE"), "lda_alpha": alpha, "lda_rho": rho,
                     "minibatch": int(minibatch), "power_t": power_t, "initial_t": initial_t,
                     "learning_rate": learning_rate, "bits": bits, "example_queue_limit": queue}}
