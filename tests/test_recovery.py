"""Topic recovery on synthetic LDA, non-private and private (fixed seeds, margins)."""
import numpy as np
import pytest

import streamdp
from streamdp.evaluation import matched_topic_error
from streamdp.privacy.events import EventLog
from streamdp.synthetic import make_lda_model, sample_documents

K = 5


@pytest.fixture(scope="module")
def corpus():
    model = make_lda_model(300, K, alpha0=1.0, beta=0.1, seed=7)
    X = sample_documents(model, 80_000, mean_length=50, seed=8)
    return model, X


def err(model, snap):
    return matched_topic_error(model.topics, snap.topic_word)["l2_mean"]


def test_non_private_recovery(corpus):
    model, X = corpus
    snap = streamdp.fit(X, K, alpha0=1.0, epsilon=None, warmup_docs=20_000, seed=0)
    assert err(model, snap) < 0.006          # measured 0.0020; topic norms ≈ 0.2
    assert np.allclose(np.sort(snap.alpha), np.sort(model.alpha), atol=0.02)
    assert snap.privacy["rho"] == 0 and snap.mechanism == "none"


def test_private_tensor_recovery_at_moderate_epsilon(corpus):
    model, X = corpus
    errors = [err(model, streamdp.fit(X, K, alpha0=1.0, epsilon=2.0, delta=1e-6,
                                      warmup_docs=20_000, seed=0, noise_seed=s))
              for s in range(3)]
    assert max(errors) < 0.012               # measured ≈ 0.0042
    

def test_tensor_mechanism_beats_iterative(corpus):
    model, X = corpus
    kw = dict(alpha0=1.0, epsilon=2.0, delta=1e-6, warmup_docs=20_000, seed=0,
              accountant=EventLog())
    t = np.mean([err(model, streamdp.fit(X, K, noise_seed=s, **kw)) for s in range(2)])
    it = np.mean([err(model, streamdp.fit(X, K, noise_seed=s, mechanism="iterative", **kw))
                  for s in range(2)])
    assert t < it / 3                       # measured 0.004 vs 0.04 (DESIGN §7: √K more noise)
    assert it < 0.15                        # still recovers something


def test_noise_is_fresh_without_noise_seed(corpus):
    model, X = corpus
    a = streamdp.fit(X[:30_000], K, epsilon=1.0, warmup_docs=10_000, seed=0)
    b = streamdp.fit(X[:30_000], K, epsilon=1.0, warmup_docs=10_000, seed=0)
    assert not np.array_equal(a.topic_word, b.topic_word)


def test_refinement_keeps_what_the_spectral_release_got_right(corpus):
    """Issue 22 item 4 at test scale: ``fit`` at its defaults (spectral start + refinement
    passes) on data that really is LDA. Before the CVB0 E-step and the sparse-topic rule the
    refinement lost most of the spectral release's accuracy (measured at 8fdd122: 0.0048
    without privacy, 0.0061 at ε = 2, against spectral 0.0020 / 0.0032)."""
    model, X = corpus
    ts = np.r_[np.zeros(20_000), np.ones(X.shape[0] - 20_000)]
    kw = dict(alpha0=1.0, delta=1e-6, timestamps=ts, stream_start=0.5, seed=0, sampler="fast")
    exact = streamdp.fit(X, K, epsilon=None, non_private=True, **kw)
    assert exact.stage == "refined"
    assert err(model, exact) < 0.0035        # measured 0.0030 (spectral alone 0.0020)
    private = [streamdp.fit(X, K, epsilon=2.0, noise_seed=s, **kw) for s in range(2)]
    assert np.mean([err(model, s) for s in private]) < 0.0050   # measured 0.0040 (spectral 0.0032)
