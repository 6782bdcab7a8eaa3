"""Topic trends with error bars and the share-change test (issue 27, streamdp.trends).

The noise model is checked against the mechanisms themselves (Monte Carlo over many
coordinates of one aggregator run); the change test on a real continual release of a synthetic
stream: a topic whose share doubles at epoch e is reported at e, a stationary stream of 20
releases reports nothing at the stated level (α = 1 % per release, Bonferroni over k)."""
from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import streamdp
from streamdp import snapshots, trends
from streamdp.privacy.blt import BLTAggregator, GaussianArrayMechanism, default_params
from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.privacy.tree import GaussianNodeMechanism, TreeAggregator
from streamdp.refinement import topic_order
from streamdp.synthetic import LDAModel, make_lda_model, sample_documents

K, D, WARMUP, PER_EPOCH = 6, 300, 8000, 3000


# ----------------------------------------------------------------------- the noise model
def _fake(epoch, sd, privacy):
    return SimpleNamespace(topic_mass=np.zeros(1), epoch=epoch, release_id=f"r{epoch}",
                           privacy={"noise_sd": {"topic_word": sd}, **privacy})


def _check_differences(prefixes, fakes):
    """Empirical variances and covariances of consecutive epoch differences (over the
    coordinates, independent replications) against the coefficients' dot products."""
    coefs = [trends.noise_coefficients(f) for f in fakes]
    diffs = [prefixes[0]] + [b - a for a, b in zip(prefixes, prefixes[1:])]
    dcoef = [coefs[0]] + [trends._minus(b, a) for a, b in zip(coefs, coefs[1:])]
    for t in range(1, len(diffs)):
        var = trends._dot(dcoef[t], dcoef[t])
        assert diffs[t].var() == pytest.approx(var, rel=0.08), t
        cov = trends._dot(dcoef[t - 1], dcoef[t])
        emp = float(np.mean(diffs[t - 1] * diffs[t]))
        assert abs(emp - cov) < 0.06 * np.sqrt(trends._dot(dcoef[t - 1], dcoef[t - 1]) * var), t
    # the prefix itself: Σ coef² is the reported sd²
    for f, c in zip(fakes, coefs):
        assert trends._dot(c, c) == pytest.approx(f.privacy["noise_sd"]["topic_word"] ** 2, rel=1e-9)


def test_blt_noise_of_epoch_differences_is_what_the_coefficients_say():
    T, m, sigma = 9, 20000, 1.5
    params = default_params(T)
    agg = BLTAggregator(params, GaussianArrayMechanism(1.0, sigma, CSPRNGGaussianSampler(seed=5)),
                        max_epochs=T)
    prefixes, fakes = [], []
    for t in range(1, T + 1):
        prefixes.append(np.array(agg.add_epoch(np.zeros(m)), dtype=np.float64))
        fakes.append(_fake(t, sigma * agg.noise_multiplier(t), {"blt": params.to_dict()}))
    _check_differences(prefixes, fakes)


def test_tree_noise_of_epoch_differences_is_what_the_coefficients_say():
    T, m, sigma = 9, 20000, 1.5
    tree = TreeAggregator(T, GaussianNodeMechanism(1.0, sigma, CSPRNGGaussianSampler(seed=6)))
    prefixes, fakes = [], []
    for t in range(1, T + 1):
        prefixes.append(np.array(tree.add_epoch(np.zeros(m)), dtype=np.float64))
        nodes = tree.covering_nodes(t)
        fakes.append(_fake(t, sigma * np.sqrt(len(nodes)), {"nodes_summed": [list(n) for n in nodes]}))
    _check_differences(prefixes, fakes)


# ----------------------------------------------------------------------- a real stream
def _doubled(model: LDAModel, topic: int = 0) -> LDAModel:
    a = model.alpha / model.alpha0
    new = a * (1 - 2 * a[topic]) / (1 - a[topic])
    new[topic] = 2 * a[topic]
    return LDAModel(model.topics, new * model.alpha0)


def _release(epochs, *, change_at=None, seed=0, aggregator="blt"):
    base = make_lda_model(D, K, alpha0=1.0, beta=0.1, seed=3)
    est = streamdp.StreamingSpectralLDA(
        K, 1.0, epsilon=4.0, seed=0, noise_seed=seed, sampler="fast", non_production=True,
        epochs=streamdp.EpochClock(0.0, 10.0), horizon=epochs, continual_aggregator=aggregator,
        refinement=streamdp.RefinementConfig(model_lag=2))
    snaps = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.warmup(sample_documents(base, WARMUP, mean_length=40, seed=100 + seed))
        for t in range(1, epochs + 1):
            model = base if change_at is None or t < change_at else _doubled(base)
            X = sample_documents(model, PER_EPOCH, mean_length=40, seed=1000 * seed + t)
            est.partial_fit(X, np.full(PER_EPOCH, 10.0 * t - 5.0))
            snaps += est.close_epochs(10.0 * t)
    return snaps, int(topic_order(snaps[-1].topic_word, base.topics)[0])


@pytest.fixture(scope="module")
def doubling():
    return _release(13, change_at=11, seed=7)


def test_a_doubled_topic_share_is_reported_at_the_epoch_it_doubles(doubling):
    snaps, topic = doubling
    tr = trends.trends(snaps)
    # the first model_lag epochs carry no refined mass: no point, said so
    assert [p.valid for p in tr.points] == [False, False] + [True] * 11
    assert "not refined" in tr.points[0].note
    first = [p.epoch for p, cs in zip(tr.points, tr.changes)
             if any(c.significant and c.topic == topic for c in cs)]
    assert first and first[0] == 11, first
    before, after = tr.points[9], tr.points[10]
    assert after.share[topic] == pytest.approx(2 * before.share[topic], rel=0.25)
    # the interval is the released values' own noise: it covers the epoch's true share level
    assert before.lower[topic] < 1 / K + 0.03 and after.upper[topic] > 2 / K - 0.03
    assert np.all(after.lower <= after.share) and np.all(after.share <= after.upper)


def test_twenty_stationary_releases_report_no_change():
    snaps, _ = _release(20, seed=11)
    tr = trends.trends(snaps)
    assert sum(p.valid for p in tr.points) == 18
    # tests of k topics each: epochs 10 … 20 (the model of epoch e sums e − 2L refined epochs:
    # both sides need MIN_MODEL_EPOCHS = 5)
    assert [p.epoch for p, cs in zip(tr.points, tr.changes) if cs] == list(range(10, 21))
    assert tr.significant == [], [(c.epoch, c.topic, round(c.z, 2)) for c in tr.significant]


def test_snapshots_trends_reads_a_folder_and_the_cli_prints_it(doubling, tmp_path, capsys):
    snaps, topic = doubling
    for s in snaps:
        (tmp_path / f"epoch-{s.epoch}-{s.release_id}.msgpack").write_bytes(s.to_bytes())
    tr = snapshots.trends(str(tmp_path))
    direct = trends.trends(snaps)
    assert len(tr.points) == 13
    np.testing.assert_allclose(tr.points[-1].share, direct.points[-1].share)
    from streamdp.cli import main
    assert main(["topics", "--trends", "--snapshot-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "epoch 11:" in out and f"epoch 11 topic {topic}" in out and "significant change" in out
    assert main(["topics", "--trends", "--json", "--snapshot-dir", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "topic_trends" and doc["change_alpha"] == 0.01
    assert any(c["significant"] and c["topic"] == topic and c["epoch"] == 11
               for cs in doc["changes"] for c in cs)


def test_topic_mass_round_trips_and_a_snapshot_without_it_has_no_point(doubling):
    snaps, _ = doubling
    again = streamdp.snapshot.TopicSnapshot.from_bytes(snaps[-1].to_bytes())
    np.testing.assert_array_equal(again.topic_mass, snaps[-1].topic_mass)
    from dataclasses import replace
    p = trends.trend_point(replace(snaps[-1], topic_mass=None), snaps[-2])
    assert not p.valid and "no topic masses" in p.note


def test_the_change_threshold_is_bonferroni_over_k():
    from statistics import NormalDist
    assert trends.z_for_change(6) == pytest.approx(NormalDist().inv_cdf(1 - 0.01 / 12))
    assert trends.z_for_change(20, 0.05) == pytest.approx(NormalDist().inv_cdf(1 - 0.05 / 40))


def test_the_tracker_follows_releases_once_and_a_restart_tests_nothing_first(doubling):
    """The release service's TrendTracker: a re-publication (same release_id) is not a new
    point; after a restart (seed with the restored release) the next release gets its point and
    no change test; the one after is tested again."""
    snaps, topic = doubling
    tr = trends.TrendTracker()
    seen = [tr.observe(s) for s in snaps[:11]]
    assert seen[10] is not None and any(c.significant and c.topic == topic for c in seen[10][1])
    assert tr.observe(snaps[10]) is None                      # re-published: nothing
    again = trends.TrendTracker()
    again.seed(snaps[10])                                     # restart after epoch 11
    point, changes = again.observe(snaps[11])
    assert point.valid and changes == []
    np.testing.assert_allclose(point.share, trends.trends(snaps).points[11].share)
    assert again.observe(snaps[12])[1] != []
