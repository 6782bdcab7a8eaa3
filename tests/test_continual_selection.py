"""Issue 22 item 4: the continual selection rule — a refined continual release publishes the
spectral decomposition of the same released sums where the released tensor's signal-to-noise
index says the tensor is reliable, its refined topics otherwise (streamdp.start.
choose_continual_topics on streamdp.release.tensor_snr: released values only)."""
from __future__ import annotations

import warnings

import numpy as np

from streamdp import EpochClock, RefinementConfig, StreamingSpectralLDA
from streamdp.evaluation import matched_topic_error
from streamdp.evaluation.corpora import synthetic_corpus
from streamdp.release import tensor_snr
from streamdp.start import SPECTRAL_MIN_SNR, choose_continual_topics

D, K, WARM = 400, 5, 20_000


def _run(n_stream: int, epsilon: float, epochs: int = 4, seed: int = 0):
    """A refined continual run on synthetic LDA; returns (snapshots, truth, estimator)."""
    corpus = synthetic_corpus(D, K, alpha0=1.0, n_docs=WARM + n_stream, seed=seed)
    X = corpus.counts
    ts = (np.arange(n_stream) + 0.5) * (epochs / n_stream)
    est = StreamingSpectralLDA(K, 1.0, epsilon=epsilon, delta=1e-6, seed=seed,
                               noise_seed=100 + seed, sampler="fast", non_production=True,
                               epochs=EpochClock(0.0, 1.0), horizon=epochs,
                               refinement=RefinementConfig())
    snaps = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.warmup(X[:WARM])
        for t in range(1, epochs + 1):
            idx = np.flatnonzero((ts >= t - 1) & (ts < t))
            est.partial_fit(X[WARM + idx], ts[idx])
            snaps += est.close_epochs(float(t))
    return snaps, corpus.true_topics, est


def test_the_rule_reads_its_index_and_the_fold_models_index_only():
    # spectral only where the tensor is informative now and some refinement rows were folded
    # into a model that was noise by the same index
    assert choose_continual_topics(SPECTRAL_MIN_SNR, 0.0)["published"] == "spectral"
    assert choose_continual_topics(SPECTRAL_MIN_SNR * 0.99, 0.0)["published"] == "refinement"
    assert choose_continual_topics(0.0, 0.0)["published"] == "refinement"
    assert choose_continual_topics(50.0, SPECTRAL_MIN_SNR)["published"] == "refinement"
    assert choose_continual_topics(50.0, SPECTRAL_MIN_SNR * 0.99)["published"] == "spectral"
    assert choose_continual_topics(50.0, float("inf"))["published"] == "refinement"  # public start
    assert choose_continual_topics(50.0)["published"] == "spectral"       # fold index unknown
    # non-private (no noise): the refinement is kept, as before the rule
    assert choose_continual_topics(None, 0.0)["published"] == "refinement"


def test_informative_fold_models_keep_the_refinement_small_noisy_stream_too():
    """Behaviour, not numbers: on a large synthetic stream whose first releases were already
    informative (index ≥ 1), the refined releases continue to publish the refinement — and it
    is the better estimate there (the rule before the fold-model condition published the
    spectral half, 3× further from the truth); on a small stream at a small ε every refined
    release publishes the refinement."""
    big, truth, est = _run(120_000, 1.0)
    refined = [s for s in big if s.stage == "refined"]
    assert refined and all(s.topic_source == "refinement" for s in refined)
    sel = refined[-1].privacy["topic_selection"]
    assert sel["snr"] >= SPECTRAL_MIN_SNR and sel["fold_model_snr"] >= SPECTRAL_MIN_SNR
    # the spectral decomposition of the same released sums is the worse estimate here
    spectral = [s for s in big if s.stage == "spectral"]
    assert (matched_topic_error(truth, refined[-1].topic_word)["l2_mean"]
            < 0.5 * matched_topic_error(truth, spectral[-1].topic_word)["l2_mean"])
    small, _, _ = _run(4_000, 0.3)
    refined = [s for s in small if s.stage == "refined"]
    assert refined and all(s.topic_source == "refinement" for s in refined)
    assert all(s.privacy["topic_selection"]["snr"] < SPECTRAL_MIN_SNR for s in refined)
    # spectral-stage releases (before the first refined epoch) say so too
    assert all(s.topic_source == "spectral" and "topic_selection" not in s.privacy
               for s in small if s.stage == "spectral")


def test_the_choice_is_a_function_of_the_released_sums():
    """Same released values -> same choice. The release service and the estimator both
    post-process a persisted draw through ContinualRelease.post_process: the rule recomputed
    from the pending noised sums gives the published source, and a second ContinualRelease
    loaded from the persisted state (as a restarted release service) publishes the same
    source and the same topics."""
    from streamdp.refinement import BLOCK as REFINE_BLOCK
    snaps, _, est = _run(120_000, 1.0, epochs=4)
    cr = est.continual_
    # re-draw nothing: rebuild the last epoch's post-processing from a copy holding its draw
    state = cr.state_dict()
    twin = type(cr)(cr.subspace, cr.clip, n_topics=cr.n_topics, alpha0=cr.alpha0, rho=cr.rho,
                    horizon=cr.horizon, split=cr.split, sampler=cr.sampler, power=cr.power,
                    denoise=cr.denoise, refinement=cr.refinement, aggregator=cr.aggregator)
    twin.load_state(state)
    assert twin.pending is None
    for c in (cr, twin):
        c.draw_epoch(None, refined=True)            # an empty fifth epoch: noise only
        released, sd = c.pending
        spectral_sd = {b: v for b, v in sd.items() if b != REFINE_BLOCK}
        want = choose_continual_topics(tensor_snr(released.sketch, n_topics=K, alpha0=1.0,
                                                  noise_sd=spectral_sd), c.fold_model_snr)
        persisted = c.state_dict()                  # the draw as the service persists it
        snap = c.post_process()
        assert snap.topic_source == want["published"]
        assert snap.privacy["topic_selection"] == want
        again = type(cr)(cr.subspace, cr.clip, n_topics=K, alpha0=1.0, rho=cr.rho,
                         horizon=cr.horizon, split=cr.split, sampler=cr.sampler,
                         power=cr.power, denoise=cr.denoise, refinement=cr.refinement,
                         aggregator=cr.aggregator).load_state(persisted)
        snap2 = again.post_process()
        assert snap2.topic_source == snap.topic_source
        np.testing.assert_array_equal(snap2.topic_word, snap.topic_word)
    del snaps


def test_identity_is_kept_across_a_switch():
    """A consumer following topic i over the releases of a run whose published estimate
    switches from refinement to spectral sees no index move more than half its mass unless the
    snapshot marks the topic new (at the switch itself the two estimates of one topic may
    differ by more than half their mass: marked, never silent), none at all between the
    spectral releases after the switch, and index i names the same true topic on both
    sides of the switch."""
    snaps, truth, _ = _run(100_000, 0.5, epochs=12)    # the index crosses the rule's level
    sources = [s.topic_source for s in snaps if s.stage == "refined"]
    assert "refinement" in sources and "spectral" in sources, sources
    switch = next(s for s in snaps if s.topic_source == "spectral" and s.stage == "refined")
    assert switch.privacy["topic_selection"]["fold_model_snr"] < SPECTRAL_MIN_SNR
    for a, b in zip(snaps, snaps[1:]):
        moved = 0.5 * np.abs(b.topic_word - a.topic_word).sum(axis=1)
        assert set(np.flatnonzero(moved > 0.5)) == set(b.new_topics)
        if a.stage == "refined" and a.topic_source == b.topic_source == "spectral":
            assert moved.max() <= 0.5, (a.epoch, b.epoch, a.topic_source, np.round(moved, 2))
    # index i names the same true topic after the switch as before it, for every index whose
    # topic before the switch was not a near-copy of another (a copy may become the topic it
    # hid: marked new above)
    first = next(i for i, s in enumerate(snaps)
                 if s.topic_source == "spectral" and s.stage == "refined")
    before, after = snaps[first - 1], snaps[first]
    assert before.topic_source == "refinement"
    nearest_before = np.abs(truth[:, None, :] - before.topic_word[None]).sum(axis=2).argmin(axis=0)
    nearest_after = np.abs(truth[:, None, :] - after.topic_word[None]).sum(axis=2).argmin(axis=0)
    unique = [i for i in range(K) if np.sum(nearest_before == nearest_before[i]) == 1]
    assert len(unique) >= K - 2, nearest_before
    np.testing.assert_array_equal(nearest_after[unique], nearest_before[unique])
    # and the spectral estimate the rule switched to is the better one there
    assert (matched_topic_error(truth, after.topic_word)["l2_mean"]
            < matched_topic_error(truth, before.topic_word)["l2_mean"])
