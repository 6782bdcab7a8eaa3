"""The estimator's one-shot calls decide the rounding premise N_max by the noised, charged check
(issue 23, "No data-dependent halt"; docs/privacy.md "The premise check"), never by the exact
count: ``release()``, a refinement pass (``refine``), the clustering start (centre draw, Lloyd
iterations, mapping pass). Before, each refused a sum of N_max + 1 documents with
DocumentCountExceeded (an exception where its neighbour at N_max got a release). The start rule's
count is an exact integer and needs no premise at all.

Each call is run on neighbouring inputs, n = N_max and n = N_max + 1 documents: both give a
release. The check's draw is on the ledger before the statistic's; its ρ comes out of the step's
ρ (fit's budget plan is unchanged) and its δ = Φ(−12) is charged to the stream atom (known
answers); a failure after the check's draw reuses ñ."""
from __future__ import annotations

import numpy as np
import pytest

import streamdp
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.plan import PREMISE_BLOCK, PREMISE_SHARE, PREMISE_Z, gaussian_tail
from streamdp.synthetic import make_lda_model, sample_documents

N_MAX = 150
WARM = 200


@pytest.fixture(scope="module")
def docs():
    model = make_lda_model(60, 3, alpha0=1.0, beta=0.1, seed=31)
    return sample_documents(model, WARM + N_MAX + 1, mean_length=30, seed=32)


def _model(epsilon=1.0, n_max=N_MAX, **kw):
    kw.setdefault("refinement", None)
    return streamdp.StreamingSpectralLDA(3, epsilon=epsilon, delta=1e-6, clip_length=20, seed=0,
                                         sampler="fast", non_production=True,
                                         max_documents_per_sum=n_max, **kw)


def _release(est, stream):
    return est.release()


def _refine(est, stream):
    est.release(0.5)
    return est.refine(stream, 0.5)


def _cluster(est, stream):
    return est.cluster_start(stream, 1.0)


def _start_count(est, stream):
    return est.choose_start(0.01)


CALLS = {"release": _release, "refine": _refine, "cluster": _cluster,
         "start-count": _start_count}


def _reserved(est) -> list[tuple[str, list[dict]]]:
    """(label, events) of every reservation on the estimator's ledger, in order."""
    return [(r.payload["label"].split(":", 1)[1], r.payload["events"])
            for r in est.accountant.ledger.read() if r.kind == "reserve"]


def _run(call, docs, n, **kw):
    """(the estimator, the call's result or the name of the exception it raised) on a stream of
    ``n`` documents."""
    est = _model(**kw)
    est.warmup(docs[:WARM]).partial_fit(docs[WARM:WARM + n])
    try:
        return est, CALLS[call](est, docs[WARM:WARM + n])
    except Exception as exc:        # the outcome an observer of the caller sees
        return est, type(exc).__name__


@pytest.mark.parametrize("call", list(CALLS))
def test_one_document_over_max_documents_per_sum_still_releases(docs, call):
    """Neighbours: the stream holds N_max and N_max + 1 documents. Both calls return a release
    (before: the second raised DocumentCountExceeded, nothing reserved). At ε = 1, σ_p ≈ 10³ ≫
    N_max, so both fail the check and are drawn from noise only: the same kind of outcome."""
    runs = {n: _run(call, docs, n) for n in (N_MAX, N_MAX + 1)}
    kinds = {n: out if isinstance(out, str) else "release" for n, (_, out) in runs.items()}
    assert kinds == {N_MAX: "release", N_MAX + 1: "release"}, kinds
    for est, out in runs.values():
        labels = [label for label, _ in _reserved(est)]
        if call == "start-count":
            # an exact integer count: float(n) has no rounding, so no premise and no check
            assert out["start"] in ("tensor", "cluster")
            assert not any("premise#" in x for x in labels)
            continue
        check = out.privacy["premise_check"]
        assert check["max_documents"] == N_MAX and check["partition"] == "stream"
        assert check["threshold"] < 0 and not check["passed"], check    # noise only
        # the check's reservation comes right before the statistic's first draw
        draw = {"release": "release#1", "refine": "refine#1", "cluster": "cluster#1"}[call]
        assert labels.index(f"{call}-premise#1") == labels.index(draw) - 1, labels
        assert np.allclose(out.topic_word.sum(axis=1), 1.0)


@pytest.mark.parametrize("call", ["release", "refine", "cluster"])
def test_the_check_is_sharp_at_a_large_epsilon_and_draws_from_the_sums_within_the_premise(docs, call):
    """ε = 10⁹ makes σ_p tiny (zσ_p < 1 document, the check's margin): N_max − 1 documents pass
    and are drawn from their sums; N_max (inside the margin) and N_max + 1 fail and are drawn from
    noise only — a release either way."""
    mass = {}
    for n in (N_MAX - 1, N_MAX, N_MAX + 1):
        _, out = _run(call, docs, n, epsilon=1e9)
        assert not isinstance(out, str), out
        check = out.privacy["premise_check"]
        assert PREMISE_Z * check["sigma"] < 1.0
        assert check["passed"] == (n == N_MAX - 1), check
        mass[n] = out.n_docs
    # within the premise the release counts its documents; over it, noise only (≈ 0 at ε = 10⁹)
    assert mass[N_MAX - 1] > N_MAX / 2 and abs(mass[N_MAX]) < 1.0 and abs(mass[N_MAX + 1]) < 1.0, mass


def test_fit_charges_each_check_out_of_its_steps_rho_and_delta_to_the_stream_known_answers(docs):
    """fit at ε = 1: the start rule (exact count, no check), the clustering start (one check for
    its five draws and the mapping) and two refinement passes (one check each): three checks of
    δ = Φ(−12) on the stream atom, one on the warm-up atom. Each check gets PREMISE_SHARE of its
    step's ρ, so the stream's total is still the stream's ρ and ε stays 1."""
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    ts = np.r_[np.zeros(WARM), np.ones(N_MAX + 1)]
    snap = streamdp.fit(docs, 3, epsilon=1.0, delta=1e-6, seed=0, sampler="fast",
                        non_production=True, timestamps=ts, stream_start=0.5, accountant=acc,
                        max_documents_per_sum=N_MAX, start="cluster", run_id="known")
    checks = [(label, ev) for label, ev in
              ((r.payload["label"], r.payload["events"]) for r in acc.ledger.read()
               if r.kind == "reserve") if "premise" in label]
    assert [label for label, _ in checks] == ["known:warmup-premise", "known:cluster-premise#1",
                                              "known:refine-premise#1", "known:refine-premise#2"]
    for _, (event,) in checks:
        assert event["block"] == PREMISE_BLOCK and event["delta"] == gaussian_tail(PREMISE_Z)
    stream = [ev for _, (ev,) in checks[1:]]
    assert {e["partition"] for e in stream} == {"stream"}
    rep = acc.report()
    tail = gaussian_tail(PREMISE_Z)
    assert rep["delta_of_approximate_events_by_atom"]["stream_worst"] == pytest.approx(3 * tail,
                                                                                       rel=1e-12)
    assert rep["delta_of_approximate_events_by_atom"]["warmup"] == pytest.approx(tail, rel=1e-12)
    # the refine pass's check is PREMISE_SHARE of the pass's ρ (share 0.5 over 2 passes)
    est_rho = acc.rho_budget
    refine_events = [r.payload["events"] for r in acc.ledger.read() if r.kind == "reserve"
                     and r.payload["label"] == "known:refine#1"]
    (refine_event,), = refine_events
    pass_rho = est_rho * 0.5 / 2
    assert stream[1]["sensitivity"] == 1.0
    check_rho = stream[1]["sensitivity"] ** 2 / (2 * stream[1]["sigma"] ** 2)
    assert check_rho == pytest.approx(pass_rho * PREMISE_SHARE, rel=1e-9)
    refine_rho = refine_event["sensitivity"] ** 2 / (2 * refine_event["sigma"] ** 2)
    assert refine_rho == pytest.approx(pass_rho * (1 - PREMISE_SHARE), rel=1e-9)
    # the plan is kept: the stream's ρ is spent exactly, ε within the budget
    assert snap.privacy["rho_stream_spent"] == pytest.approx(est_rho, rel=1e-9)
    assert rep["epsilon_worst_case"] <= 1.0 * (1 + 1e-9)
    assert not snap.privacy["premise_check"]["passed"]        # N_max = 150 ≪ zσ_p


def test_a_failure_after_the_check_reuses_its_kept_draw(docs, monkeypatch):
    """Crash-after-draw, in process: the refinement pass's own draw raises after ñ was drawn.
    The retry reuses ñ (no second check on the ledger) and then releases."""
    est = _model()
    est.warmup(docs[:WARM]).partial_fit(docs[WARM:WARM + N_MAX + 1])
    est.release(0.5)
    real = est.sampler.add_noise
    calls = {"n": 0}

    def failing_once(value, sigma):
        if np.size(value) > 1:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("injected: the pass's draw fails after its premise check")
        return real(value, sigma)

    monkeypatch.setattr(est.sampler, "add_noise", failing_once)
    stream = docs[WARM:WARM + N_MAX + 1]
    with pytest.raises(RuntimeError, match="injected"):
        est.refine(stream, 0.25)
    snap = est.refine(stream, 0.25)
    labels = [label for label, _ in _reserved(est)]
    assert labels.count("refine-premise#1") == 1 and "refine-premise#2" not in labels
    assert snap.stage == "refined" and "premise_check" in snap.privacy


# ------------------------------------------------------- no document at all (an exact count 0)
@pytest.mark.parametrize("call", ["release", "refine", "cluster"])
def test_a_call_on_no_stream_document_and_its_neighbour_with_one_both_release(docs, call):
    """Neighbours: no stream document and one. Before, a private release of an empty stream
    sketch, and a refinement pass or clustering start without a non-empty document, raised
    ValueError (an exact count, 0, deciding between an exception and a release). Now both are
    releases: the empty one is noise only."""
    kinds = {}
    for n in (0, 1):
        _, out = _run(call, docs, n, n_max=10**9)
        kinds[n] = out if isinstance(out, str) else out.stage
    assert kinds[0] == kinds[1] and kinds[0] in ("spectral", "refined"), kinds


@pytest.mark.parametrize("side", ["warm-up", "stream"])
def test_fit_with_no_document_on_one_side_and_its_neighbour_both_release(docs, side):
    """fit's per-document boundary puts no row on one side, or one row: before, the empty side
    was refused ('both must be non-empty'); now a private fit releases either way (the empty side
    drawn from noise only). Without ε the refusal stays (nothing is protected there)."""
    kinds = {}
    for n in (0, 1):
        rows = docs[:WARM + n]
        ts = (np.r_[np.zeros(n), np.ones(WARM)] if side == "warm-up"
              else np.r_[np.zeros(WARM), np.ones(n)])
        try:
            snap = streamdp.fit(rows, 3, epsilon=1.0, delta=1e-6, seed=0, sampler="fast",
                                non_production=True, timestamps=ts, stream_start=0.5)
            kinds[n] = snap.stage
        except ValueError as exc:
            kinds[n] = str(exc)
    assert kinds == {0: "refined", 1: "refined"}, kinds
    with pytest.raises(ValueError, match="both must be non-empty"):
        streamdp.fit(docs[:WARM], 3, non_private=True, timestamps=np.zeros(WARM), stream_start=0.5)
