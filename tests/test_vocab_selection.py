"""Private vocabulary selection (issue 11): sensitivity, accounting, attack, API."""
import json
import math
import warnings

import msgpack
import numpy as np
import pytest

from streamdp.privacy.accountant import Accountant, BudgetExhausted
from streamdp.privacy.conversions import zcdp_epsilon, zcdp_rho
from streamdp.privacy.events import VOCABULARY, GaussianEvent
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.text.vocab_selection import (CandidateHistogram, InsufficientSelection,
                                           SelectionConfig, _threshold_privacy, document_key,
                                           in_selection_slice, plan_selection, select_vocabulary,
                                           selection_epsilon)
from streamdp.text.vocabulary import Vocabulary

CANDS = Vocabulary([f"w{i}" for i in range(200)])


def _hist(docs, m=4, m_new=3):
    return CandidateHistogram(CANDS, max_words_per_doc=m, max_new_words_per_doc=m_new).add_documents(docs)


def _random_doc(rng, n):
    pool = [f"w{i}" for i in range(200)] + [f"new{i}" for i in range(50)]
    return [pool[j] for j in rng.integers(0, len(pool), size=n)]


def test_histogram_add_remove_sensitivity_against_adversarial_documents():
    """Adding any one document moves the candidate counts by a 0/1 vector with ≤ m ones
    (L2 ≤ √m) and the new-word counts by ≤ m' words of 1 each (ℓ0 ≤ m', ℓ∞ = 1)."""
    rng = np.random.default_rng(0)
    base_docs = [_random_doc(rng, 30) for _ in range(40)]
    base = _hist(base_docs)
    adversarial = [["w1"] * 500, [f"w{i}" for i in range(200)] * 3,
                   [f"zz{i}" for i in range(1000)], _random_doc(rng, 5000), [], ["new1", "w1"] * 99]
    for doc in adversarial + [_random_doc(rng, 60) for _ in range(50)]:
        after = _hist(base_docs + [doc])
        diff = after.counts - base.counts
        assert set(np.unique(diff)) <= {0, 1}
        assert np.linalg.norm(diff) <= math.sqrt(4) + 1e-12
        new_diff = {w: after.new_counts[w] - base.new_counts.get(w, 0) for w in after.new_counts}
        changed = {w: v for w, v in new_diff.items() if v}
        assert len(changed) <= 3 and all(v == 1 for v in changed.values())


def test_clip_keeps_the_documents_own_first_words():
    h = _hist([["new9", "w5", "w5", "w7", "w1", "w2", "w3", "new1", "new2", "new3", "new4"]])
    assert {CANDS[j] for j in np.flatnonzero(h.counts)} == {"w5", "w7", "w1", "w2"}
    assert set(h.new_counts) == {"new9", "new1", "new2"}


def test_merge_by_addition_equals_one_pass_and_roundtrips_through_msgpack():
    rng = np.random.default_rng(1)
    docs = [_random_doc(rng, 25) for _ in range(90)]
    whole = _hist(docs)
    parts = [_hist(docs[i::3]) for i in range(3)]
    wire = [msgpack.unpackb(msgpack.packb(p.to_dict())) for p in parts]
    merged = CandidateHistogram.from_dict(wire[0], CANDS)
    for w in wire[1:]:
        merged.merge(CandidateHistogram.from_dict(w, CANDS))
    assert np.array_equal(merged.counts, whole.counts)
    assert merged.new_counts == whole.new_counts and merged.n_docs == whole.n_docs
    assert np.array_equal((parts[0] + parts[1] + parts[2]).counts, whole.counts)
    other = CandidateHistogram(CANDS, max_words_per_doc=5, max_new_words_per_doc=3)
    with pytest.raises(ValueError, match="same public parameters"):
        merged.merge(other)
    with pytest.raises(ValueError, match="not the given"):
        CandidateHistogram.from_dict(wire[0], Vocabulary(["a", "b"]))


def test_plan_uses_opendp_map_and_the_whole_vocabulary_atom():
    cfg = SelectionConfig(max_words_per_doc=16, max_new_words_per_doc=4)
    plan = plan_selection(cfg, epsilon=2.0, delta=1e-6)
    cand, new = plan.events
    assert cand.partition == new.partition == VOCABULARY
    assert cand.sensitivity == 4.0 and new.sensitivity == 2.0 and cand.delta == 0.0
    rho_map, delta_map = _threshold_privacy(plan.sigma_new_words, plan.threshold_new_words, 4)
    assert rho_map == pytest.approx(new.rho, rel=1e-9) and delta_map == new.delta
    assert 0 < new.delta <= 0.5e-6
    # a slightly lower threshold would exceed δ': the threshold is the smallest that fits
    assert _threshold_privacy(plan.sigma_new_words, plan.threshold_new_words * 0.99, 4)[1] > 0.5e-6
    assert cand.rho + new.rho == pytest.approx(zcdp_rho(2.0, 1e-6 - new.delta), rel=1e-6)
    assert selection_epsilon(plan, 1e-6) == pytest.approx(2.0, rel=1e-6)


def test_accountant_composes_the_approximate_event_soundly():
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    limit = zcdp_rho(1.0, 1e-6 - 4e-7)
    assert limit < acc.rho_budget
    sigma_over = 1.0 / math.sqrt(2 * limit * 1.001)        # ρ just above the δ-reduced limit
    with pytest.raises(BudgetExhausted, match="vocabulary"):
        acc.reserve([GaussianEvent("v", 1.0, sigma_over, partition=VOCABULARY, delta=4e-7)])
    with pytest.raises(BudgetExhausted):                   # δ_v ≥ δ can never be converted
        acc.reserve([GaussianEvent("v", 1.0, 1e6, partition=VOCABULARY, delta=1e-6)])
    ok = 1.0 / math.sqrt(2 * limit * 0.999)
    acc.reserve([GaussianEvent("v", 1.0, ok, partition=VOCABULARY, delta=4e-7)])
    rep = acc.report()
    assert rep["delta_of_approximate_events_by_atom"]["vocabulary"] == pytest.approx(4e-7)
    assert rep["epsilon_worst_case"] == pytest.approx(zcdp_epsilon(0.999 * limit, 6e-7), rel=1e-6)
    assert rep["epsilon_worst_case"] <= 1.0
    # the warm-up and the stream keep their whole budget (parallel composition)
    acc.reserve([GaussianEvent("w", 1.0, 1.0 / math.sqrt(2 * acc.rho_budget * 0.999),
                               partition="warmup")])
    # and the ledger replays the δ (a second accountant on the same ledger sees it)
    acc2 = Accountant(1.0, 1e-6, acc.ledger)
    assert acc2.loads().vocabulary_delta == pytest.approx(4e-7)
    with pytest.raises(BudgetExhausted):
        acc2.reserve([GaussianEvent("v2", 1.0, 10.0, partition=VOCABULARY)])


class _Recorder:
    """Spender recording the order of calls; optionally refuses."""

    def __init__(self, refuse=False):
        self.calls, self.refuse = [], refuse

    def reserve(self, events, *, label=""):
        self.calls.append(("reserve", label, [e.to_dict() for e in events]))
        if self.refuse:
            raise BudgetExhausted("no", label=label, requested={}, atom="vocabulary",
                                  load_after=1, remaining=0, budget=0)
        return "tok"

    def commit(self, token):
        self.calls.append(("commit", token))


class _CountingSampler(CSPRNGGaussianSampler):
    def __init__(self, seed):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(seed)
        self.draws = 0

    def add_noise(self, value, sigma):
        self.draws += 1
        return super().add_noise(value, sigma)


def _docs_with(word_counts, rng):
    docs = []
    for w, n in word_counts.items():
        docs += [[w] for _ in range(n)]
    rng.shuffle(docs)
    return docs


def test_reserve_before_draw_and_nothing_drawn_when_refused():
    rng = np.random.default_rng(2)
    docs = _docs_with({"w3": 400, "w8": 300, "brandnew": 400}, rng)
    cfg = SelectionConfig(size=5, max_words_per_doc=4, max_new_words_per_doc=3, min_words=1)
    plan = plan_selection(cfg, epsilon=1.0, delta=1e-6)
    h = CandidateHistogram.for_config(CANDS, cfg).add_documents(docs)
    sampler = _CountingSampler(0)
    with pytest.raises(BudgetExhausted):
        select_vocabulary(h, plan, spender=_Recorder(refuse=True), sampler=sampler)
    assert sampler.draws == 0
    rec = _Recorder()
    sel = select_vocabulary(h, plan, spender=rec, sampler=sampler)
    assert [c[0] for c in rec.calls] == ["reserve", "commit"] and sampler.draws == 1
    assert rec.calls[0][2] == [e.to_dict() for e in plan.events]
    assert sel.vocabulary.words[:2] == ("w3", "w8")          # well above the noise
    assert "brandnew" in sel.vocabulary                        # 400 documents pass the threshold
    assert len(sel.vocabulary) == 5 + 1                        # filled from the public order
    assert sel.report["vocabulary_id"] == sel.vocabulary.vocabulary_id
    json.dumps(sel.report)


def test_attack_a_word_of_one_document_is_never_published():
    """A surname used by a single document (however often) must not reach the vocabulary;
    the same word used by many documents does (the mechanism is not vacuous)."""
    rng = np.random.default_rng(3)
    crowd = [_random_doc(rng, 20) for _ in range(300)]
    cfg = SelectionConfig(size=20, max_words_per_doc=4, max_new_words_per_doc=3, min_words=1)
    plan = plan_selection(cfg, epsilon=8.0, delta=1e-6)
    victim = ["zxqsurname"] * 50 + ["w1"]
    for trial in range(30):
        h = CandidateHistogram.for_config(CANDS, cfg).add_documents(crowd + [victim])
        sel = select_vocabulary(h, plan, spender=_Recorder(), sampler=_CountingSampler(trial))
        assert "zxqsurname" not in sel.vocabulary
    many = crowd + [["zxqsurname", "w1"]] * 300
    h = CandidateHistogram.for_config(CANDS, cfg).add_documents(many)
    assert "zxqsurname" in select_vocabulary(h, plan, spender=_Recorder(),
                                             sampler=_CountingSampler(0)).vocabulary


def test_too_few_documents_fail_with_the_numbers_and_the_fix():
    cfg = SelectionConfig(size=50, max_words_per_doc=4, max_new_words_per_doc=3)
    plan = plan_selection(cfg, epsilon=0.5, delta=1e-6)
    h = CandidateHistogram.for_config(CANDS, cfg).add_documents([["w1", "w2"]] * 5)
    with pytest.raises(InsufficientSelection) as err:
        select_vocabulary(h, plan, spender=_Recorder(), sampler=_CountingSampler(0))
    msg = str(err.value)
    assert "5 documents" in msg and "min_words=10" in msg and "larger ε" in msg \
        and "streamdp vocab public" in msg


def test_slice_rule_depends_on_the_document_alone():
    docs = [[f"a{i}", "b"] for i in range(2000)]
    share = np.mean([in_selection_slice(document_key(d), 0.3) for d in docs])
    assert 0.26 < share < 0.34
    assert in_selection_slice(document_key(docs[7]), 0.3) == \
        in_selection_slice(document_key(list(docs[7])), 0.3)


def test_fit_selects_the_vocabulary_on_its_own_atom():
    from streamdp import fit
    rng = np.random.default_rng(4)
    topics = [[f"w{i}" for i in range(j * 20, j * 20 + 20)] for j in range(3)]
    docs = [list(rng.choice(topics[j % 3], size=30)) for j in range(3000)]
    ts = np.arange(3000, dtype=float)
    cfg = SelectionConfig(size=60, max_words_per_doc=8, new_words=False, slice_share=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        snap = fit(docs, 3, epsilon=4.0, timestamps=ts, stream_start=1500.0, seed=0,
                   vocabulary_selection=cfg, candidates=CANDS, sampler="fast", noise_seed=0,
                   refinement=False)
        with pytest.raises(ValueError, match="per-document boundary"):
            fit(docs, 3, epsilon=4.0, warmup_docs=1000, vocabulary_selection=cfg,
                candidates=CANDS)
    sel = snap.privacy["vocabulary_selection"]
    assert Vocabulary(sel["words"]).vocabulary_id == snap.vocabulary_id
    assert set(sel["words"][:60]) == {w for t in topics for w in t}   # every used word selected
    acc = snap.privacy["accountant"]
    assert acc["rho_by_atom"]["vocabulary"] > 0 and acc["rho_by_atom"]["warmup"] > 0
    assert acc["epsilon_worst_case"] <= 4.0 * (1 + 1e-6)


def test_cli_vocab_private_writes_vocabulary_and_report(tmp_path, capsys):
    from streamdp.cli import main
    CANDS.save(tmp_path / "cands.txt")
    docs = tmp_path / "docs.jsonl"
    with open(docs, "w") as fh:
        for i in range(600):
            fh.write(json.dumps({"tokens": ["w1", "w2", f"w{3 + i % 3}"]}) + "\n")
        fh.write(json.dumps({"text": "W1 and w2, plainly"}) + "\n")
    out = tmp_path / "v.txt"
    args = ["vocab", "private", "--in", str(docs), "--out", str(out), "--epsilon", "2",
            "--size", "5", "--candidates", str(tmp_path / "cands.txt"), "--min-words", "3",
            "--sampler", "fast", "--non-production"]
    assert main(args) == 0
    v = Vocabulary.load(out)
    assert {"w1", "w2"} <= set(v.words)
    rep = json.loads((tmp_path / "v.txt.json").read_text())
    assert rep["vocabulary_id"] == v.vocabulary_id and rep["accountant"]["epsilon_worst_case"] <= 2
    small = tmp_path / "small.txt"
    small.write_text("w1 w2\nw2 w3\n")
    # Two documents cannot lift 20 words above the cut; noise alone passes ≈ 1 of the 200
    # candidates (Poisson(1)), so with --min-words 3 this failed ≈ 8% of runs; 20 never does.
    small_args = args[:2] + ["--in", str(small)] + args[4:]
    small_args[small_args.index("--min-words") + 1] = "20"
    assert main(small_args) == 2
    assert "documents" in capsys.readouterr().err
