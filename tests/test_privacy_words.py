"""What a snapshot says about its own privacy (issue 23 items 5, 7, 8).

* item 7 — the plain words match the unit: a user-level snapshot never says "document by
  document"; a document-level one never claims to protect a person;
* item 8 — a model without ε warns (``non_private=True`` silences it) and its snapshot says
  NON-PRIVATE and names no unit of privacy;
* item 5 — unvetted samplers ("fast", "google") are refused without ``non_production`` (the
  estimator, ``fit`` and the service configuration), and the snapshot names the status.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import streamdp
from streamdp.estimator import NonPrivateWarning
from streamdp.privacy.noise import NON_PRODUCTION, VETTED, sampler_status
from streamdp.privacy.report import describe, is_non_private
from streamdp.services.config import ConfigError, from_mapping
from streamdp.synthetic import make_lda_model, sample_documents


def _data(n=3000, seed=0):
    X = sample_documents(make_lda_model(120, 3, seed=seed), n, seed=seed)
    users = (np.random.default_rng(seed).zipf(1.8, n) % 700).astype(str)
    return X, users, np.arange(n, dtype=float)


def _words(snap) -> str:
    return " ".join(f"{h}: {t}" for h, t in describe(snap.privacy))


@pytest.mark.parametrize("unit", ["document", "user"])
def test_plain_words_name_the_unit(unit):
    X, users, ts = _data()
    extra = dict(privacy_unit="user", users=users, max_docs_per_user_epoch=5) if unit == "user" else {}
    snap = streamdp.fit(X, 3, epsilon=4.0, timestamps=ts, stream_start=800.0, seed=0,
                        refinement=None, **extra)
    words = _words(snap)
    assert snap.privacy["sampler_status"] == VETTED and "NOT a vetted" not in words
    if unit == "user":
        assert "document by document" not in words
        assert "differential privacy for every user" in words
        assert "whether any single user contributed" in words
        assert "all the documents of one user" in words
        assert "most-charged user" in words and "most-charged document" not in words
        assert "differ by one document" not in words
    else:
        assert "differential privacy for every document" in words
        assert "protected document by document" in words
        assert "differ by one document" in words and "user" not in words


def test_fit_without_epsilon_warns_and_says_non_private():
    X, _, ts = _data(1500)
    with pytest.warns(NonPrivateWarning, match="NON-PRIVATE"):
        snap = streamdp.fit(X, 3, timestamps=ts, stream_start=500.0, seed=0, refinement=None)
    p = snap.privacy
    assert p["non_private"] is True and p["privacy_mode"].startswith("NON-PRIVATE")
    assert "one document" not in p["unit"] and "one document" not in p["neighbouring"]
    assert is_non_private(p)
    words = dict(describe(p))
    assert words["Guarantee"].startswith("NONE") and "Unit of privacy" not in words
    assert "Neighbouring datasets" not in words
    # the explicit intent is silent, and still NON-PRIVATE
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonPrivateWarning)
        snap = streamdp.fit(X, 3, timestamps=ts, stream_start=500.0, seed=0, refinement=None,
                            non_private=True)
        est = streamdp.StreamingSpectralLDA(3, non_private=True)
    assert snap.privacy["non_private"] is True and est.non_private
    with pytest.warns(NonPrivateWarning):
        streamdp.StreamingSpectralLDA(3)
    with pytest.raises(ValueError, match="either private"):
        streamdp.StreamingSpectralLDA(3, epsilon=1.0, non_private=True)


@pytest.mark.parametrize("kind", ["fast", "google"])
def test_unvetted_samplers_need_non_production(kind):
    X, _, ts = _data(1500)
    with pytest.raises(ValueError, match="not a vetted sampler"):
        streamdp.StreamingSpectralLDA(3, epsilon=1.0, sampler=kind)
    with pytest.raises(ValueError, match="non_production"):
        streamdp.fit(X, 3, epsilon=1.0, timestamps=ts, stream_start=500.0, sampler=kind)
    with pytest.raises(ConfigError, match="sampler.*not a vetted sampler"):
        from_mapping({"epsilon": 1.0, "sampler": kind}, env={})
    snap = streamdp.fit(X, 3, epsilon=4.0, timestamps=ts, stream_start=500.0, seed=0,
                        sampler=kind, non_production=True, refinement=None)
    assert snap.privacy["sampler_status"] == NON_PRODUCTION
    assert "NOT a vetted sampler" in dict(describe(snap.privacy))["Noise"]


def test_sampler_status_is_one_rule():
    from streamdp.privacy.noise import make_sampler
    assert [sampler_status(k) for k in ("opendp-lattice", "opendp", "google", "fast")] == [
        VETTED, VETTED, NON_PRODUCTION, NON_PRODUCTION]
    assert sampler_status(make_sampler("opendp-lattice", workers=1)) == VETTED
    assert sampler_status(make_sampler("fast")) == NON_PRODUCTION
