"""The one spend protocol (streamdp/privacy/spend.py) on the one-shot engine path.

A one-shot ``streamdp.fit`` on a file ledger is SIGKILLed at each step of each of its
draws (after reserve, after the draw, after persist, after commit) and re-run with the
same ``run_id``: the re-run completes, nothing is charged twice (the ledger's report
equals a clean run's), and a committed output is never drawn again (a further run
returns the same topics without touching the budget). A guard checks that no module
outside spend.py calls ``reserve``/``commit`` on an accountant by hand.
"""
from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streamdp
from streamdp.privacy.accountant import Accountant, AlreadySpent, BudgetExhausted
from streamdp.privacy.events import EventLog, GaussianEvent
from streamdp.privacy.ledger import FileLedger
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.spend import FileOutputStore, SpendSession, spend

ROOT = Path(__file__).resolve().parents[1]
EPS, DELTA = 1.0, 1e-6

# The one-shot fit of these tests: auto clip bounds (clip histogram), the range finder,
# the spectral release and two refinement passes -- 5 draws.
# 2000 stream documents at ε = 1: the start rule (its noised count) picks the clustering start
# the clustering start: its centre draw (cluster#1), then 4 Lloyd iterations
# the warm-up's premise check (its noised count against N_max) comes before its two draws; the
# clustering start's (one for all its draws) and each refinement pass's before theirs
DRAWS = ("warmup-premise", "warmup-clip-histogram", "warmup", "start-count#1", "cluster-premise#1",
         "cluster#1", "cluster#2", "cluster#3", "cluster#4", "cluster#5", "cluster-map#1",
         "refine-premise#1", "refine#1", "refine-premise#2", "refine#2")
FIT = '''
import numpy as np, streamdp
from streamdp.privacy.accountant import Accountant
from streamdp.synthetic import make_lda_model, sample_documents

def run_fit(ledger, run_id="run-1"):
    model = make_lda_model(40, 3, alpha0=1.0, beta=0.1, seed=3)
    X = sample_documents(model, 3000, mean_length=30, seed=4)
    ts = np.r_[np.zeros(1000), np.ones(2000)]
    acc = Accountant(%r, %r, ledger)
    snap = streamdp.fit(X, 3, epsilon=%r, delta=%r, seed=0, sampler="fast", non_production=True, timestamps=ts,
                        stream_start=0.5, accountant=acc, run_id=run_id)
    return snap, acc
''' % (EPS, DELTA, EPS, DELTA)

KILLER = FIT + '''
import os, signal, sys
from pathlib import Path
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.spend import FileOutputStore

ledger, point, nth, marker = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
seen = {"n": 0}

def step(where):
    seen["n"] += 1
    if seen["n"] == nth:
        marker.write_text(where)
        os.kill(os.getpid(), signal.SIGKILL)

def wrap(cls, name, before=False):
    original = getattr(cls, name)
    def method(self, *a, **kw):
        if before:
            step(point)
        out = original(self, *a, **kw)
        if not before:
            step(point)
        return out
    setattr(cls, name, method)

# reserve: the reservation is durable, nothing drawn; draw: noise drawn, nothing persisted;
# persist: output durable, not committed; commit: the draw is complete
{"reserve": lambda: wrap(Accountant, "reserve"),
 "draw": lambda: wrap(FileOutputStore, "put", before=True),
 "persist": lambda: wrap(FileOutputStore, "put"),
 "commit": lambda: wrap(Accountant, "commit")}[point]()
run_fit(ledger)
sys.exit(3)                     # not killed: the test fails
'''


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _run_fit(ledger):
    ns: dict = {}
    exec(FIT, ns)
    return ns["run_fit"](str(ledger))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A run that is never interrupted: its topics and its ledger's report."""
    ledger = tmp_path_factory.mktemp("clean") / "ledger.jsonl"
    snap, acc = _run_fit(ledger)
    return snap, acc.report()


def _accounting(report):
    """The report's accounting, floats rounded to 12 significant digits: a draw fulfilled
    after a crash is fresh noise, so data-dependent sensitivities (auto clip bounds from
    the noised histogram) may differ in the last bit of each ρ, never in its sum."""
    keep = ("rho_spent_by_partition", "rho_by_atom", "rho_worst_case", "epsilon_worst_case",
            "rho_remaining", "reservations", "uncommitted", "refusals")

    def r(v):
        if isinstance(v, dict):
            return {k: r(x) for k, x in v.items()}
        return float(f"{v:.12g}") if isinstance(v, float) else v
    return {k: r(report[k]) for k in keep}


@pytest.mark.slow
@pytest.mark.parametrize("nth", range(1, len(DRAWS) + 1), ids=DRAWS)
@pytest.mark.parametrize("point", ["reserve", "draw", "persist", "commit"])
def test_fit_killed_at_each_step_reruns_without_spending_twice(tmp_path, clean, point, nth):
    clean_snap, clean_report = clean
    ledger = tmp_path / "ledger.jsonl"
    marker = tmp_path / "killed"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    p = subprocess.run([sys.executable, str(script), str(ledger), point, str(nth), str(marker)],
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    assert marker.read_text() == point
    after_crash = Accountant(EPS, DELTA, ledger).report()
    # the reservation of the interrupted draw is on the ledger (spent) from step 1 on
    assert after_crash["reservations"] == nth
    assert after_crash["uncommitted"] == (0 if point == "commit" else 1)
    assert after_crash["rho_worst_case"] <= clean_report["rho_worst_case"] * (1 + 1e-12)

    snap, acc = _run_fit(ledger)                 # the re-run, same run_id
    rep = acc.report()
    assert _accounting(rep) == _accounting(clean_report)     # nothing charged twice
    assert rep["uncommitted"] == 0 and rep["refusals"] == 0
    assert rep["epsilon_worst_case"] <= EPS * (1 + 1e-9)
    assert snap.topic_word.shape == clean_snap.topic_word.shape

    # committed outputs are never drawn again: a third run returns the same release,
    # appending nothing to the ledger
    n_records = len(FileLedger(ledger).read())
    again, acc2 = _run_fit(ledger)
    np.testing.assert_array_equal(again.topic_word, snap.topic_word)
    assert len(FileLedger(ledger).read()) == n_records + 0
    assert _accounting(acc2.report()) == _accounting(clean_report)


def test_a_rerun_returns_the_persisted_release_and_a_new_run_id_spends_anew(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    first, acc = _run_fit(ledger)
    rep = acc.report()
    assert rep["reservations"] == len(DRAWS) and rep["uncommitted"] == 0
    second, acc = _run_fit(ledger)
    np.testing.assert_array_equal(first.topic_word, second.topic_word)
    assert acc.report()["reservations"] == len(DRAWS)
    # another run on the same ledger is another spend: the budget (fully used) refuses it
    ns: dict = {}
    exec(FIT, ns)
    with pytest.raises(BudgetExhausted, match="budget exhausted"):
        ns["run_fit"](str(ledger), run_id="run-2")


def test_a_file_ledger_needs_a_run_id(tmp_path):
    acc = Accountant(EPS, DELTA, tmp_path / "ledger.jsonl")
    with pytest.raises(ValueError, match="run_id"):
        streamdp.StreamingSpectralLDA(3, epsilon=EPS, delta=DELTA, accountant=acc)
    with pytest.raises(ValueError, match="run_id"):
        streamdp.StreamingSpectralLDA(3, epsilon=EPS, delta=DELTA, accountant=acc, run_id="")


def test_persisted_output_without_its_ledger_is_refused(tmp_path):
    """Outputs kept, ledger replaced: refuse rather than hand out an unaccounted output."""
    ledger = tmp_path / "ledger.jsonl"
    _run_fit(ledger)
    ledger.rename(tmp_path / "moved.jsonl")
    with pytest.raises(RuntimeError, match="no reservation"):
        _run_fit(ledger)


def test_spend_orders_the_steps_and_a_failed_draw_is_fulfilled(tmp_path):
    acc = Accountant(EPS, DELTA, tmp_path / "l.jsonl")
    store = FileOutputStore.next_to(tmp_path / "l.jsonl")
    session = SpendSession(acc, scope="r", store=store)
    ev = [GaussianEvent("z", 1.0, 10.0)]
    order = []

    def failing():
        order.append(("draw", acc.report()["reservations"], acc.report()["uncommitted"]))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        spend(session, ev, label="x", draw=failing)
    assert order == [("draw", 1, 1)]                    # reserved (durably) before the draw
    assert store.get("r:x") is None
    out = spend(session, ev, label="x", draw=lambda: np.arange(3.0))
    rep = acc.report()
    assert rep["reservations"] == 1 and rep["uncommitted"] == 0   # fulfilled, not re-charged
    np.testing.assert_array_equal(store.get("r:x")["value"]["nd"]["data"],
                                  np.arange(3.0).tobytes())
    # committed: the persisted output comes back, the draw never runs again
    again = spend(session, ev, label="x", draw=lambda: pytest.fail("drew a committed output"))
    np.testing.assert_array_equal(again, out)
    # a session without a store cannot redraw a committed key either
    with pytest.raises(AlreadySpent):
        spend(SpendSession(acc, scope="r"), ev, label="x", draw=lambda: 0)
    # changed events under the same key: refused
    with pytest.raises(ValueError, match="other events"):
        spend(session, [GaussianEvent("z", 1.0, 20.0)], label="x", draw=lambda: 0)


def test_an_in_memory_estimator_goes_through_keyed_sessions():
    acc = Accountant(EPS, DELTA, MemoryLedger())
    est = streamdp.StreamingSpectralLDA(3, epsilon=EPS, delta=DELTA, accountant=acc,
                                        sampler="fast", non_production=True, refinement=None)
    assert isinstance(est._spender, SpendSession)
    log = EventLog()
    assert streamdp.StreamingSpectralLDA(3, epsilon=EPS, accountant=log)._spender is log


# ------------------------------------------------------------------ regression guard
def _direct_spend_calls(path: Path) -> list[str]:
    """Calls ``<x>.reserve(...)`` / ``<x>.commit(...)`` whose receiver names an accountant
    (``acc``, ``acct``, ``accountant``, ``self.accountant``), or any ``.reserve(`` call:
    every reservation must go through streamdp.privacy.spend."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("reserve", "commit"):
            continue
        recv = ast.unparse(node.func.value)
        if node.func.attr == "reserve" or "acc" in recv.lower() or "spend" in recv.lower():
            out.append(f"{path.name}:{node.lineno}: {recv}.{node.func.attr}(...)")
    return out


def test_no_reserve_or_commit_outside_the_spend_protocol():
    allowed = {ROOT / "streamdp/privacy/spend.py", ROOT / "streamdp/privacy/accountant.py"}
    found = []
    for top in ("streamdp", "services", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")) if (ROOT / top).exists() else []:
            if path not in allowed:
                found += _direct_spend_calls(path)
    assert found == [], "reserve/commit outside streamdp/privacy/spend.py:\n" + "\n".join(found)


def test_the_guard_sees_a_hand_written_protocol(tmp_path):
    bad = tmp_path / "hand_written.py"
    bad.write_text("def f(accountant, ev):\n    t = accountant.reserve(ev)\n"
                   "    accountant.commit(t)\n")
    assert len(_direct_spend_calls(bad)) == 2


@pytest.mark.parametrize("aggregator", ["tree", "blt"])
def test_continual_estimator_on_a_file_ledger_reruns_from_its_persisted_draws(tmp_path, aggregator):
    """Continual mode: each epoch's draw (the tree's noised nodes; the BLT's y_t) goes to the output store too, so a re-run of the same run returns the same
    snapshots and spends nothing more."""
    from streamdp.synthetic import make_lda_model, sample_documents

    model = make_lda_model(40, 3, alpha0=1.0, beta=0.1, seed=3)
    X = sample_documents(model, 2400, mean_length=30, seed=4)
    ledger = tmp_path / "ledger.jsonl"

    def run():
        acc = Accountant(EPS, DELTA, ledger)
        est = streamdp.StreamingSpectralLDA(3, epsilon=EPS, delta=DELTA, seed=0, sampler="fast", non_production=True,
                                            epochs=streamdp.EpochClock(0.0, 10.0), horizon=3,
                                            accountant=acc, run_id="continual-1",
                                            continual_aggregator=aggregator)
        est.warmup(X[:800])
        snaps = []
        for t in range(3):
            rows = slice(800 + 500 * t, 1300 + 500 * t)
            est.partial_fit(X[rows], np.full(500, 10.0 * t + 5.0))
            snaps += est.close_epochs(10.0 * (t + 1))
        return snaps, acc.report()

    first, rep1 = run()
    n_records = len(FileLedger(ledger).read())
    second, rep2 = run()
    assert len(first) == len(second) == 3
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.topic_word, b.topic_word)
    assert len(FileLedger(ledger).read()) == n_records
    assert _accounting(rep1) == _accounting(rep2) and rep2["uncommitted"] == 0
