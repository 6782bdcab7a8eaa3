"""Accountant + FileLedger: budget filter, partitions, durability, concurrency."""
import json
import math
import multiprocessing as mp
import os
import threading
from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streamdp.privacy.accountant import (Accountant, BudgetExhausted, LedgerMismatch,
                                         Reservation, atom_loads)
from streamdp.privacy.conversions import RHO_RTOL, zcdp_epsilon
from streamdp.privacy.events import (BudgetSpender, GaussianEvent, Partition, epoch_partition,
                                     parse_partition, sigma_for_rho)
from streamdp.privacy.ledger import (FileLedger, LedgerCorrupt, LedgerRecord, encode_line, scan)

EPS, DELTA = 1.0, 1e-6


def ev(rho, partition="stream", block="z", sens=0.7):
    return GaussianEvent(block, sens, sigma_for_rho(sens, rho), partition=partition)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "ledger.jsonl"


# ------------------------------------------------------------------ basics
def test_reserve_commit_report(path):
    acc = Accountant(EPS, DELTA, path)
    assert isinstance(acc, BudgetSpender)
    B = acc.rho_budget
    t = acc.reserve([ev(B / 4, "warmup", "warmup")], label="warm-up")
    assert isinstance(t, Reservation)
    acc.commit(t)
    acc.commit(t)                                    # idempotent
    t2 = acc.reserve([ev(B / 8), ev(B / 8, block="s3")], label="release 1")
    rep = acc.report()
    assert rep["unit"] == "one document, add/remove"
    assert (rep["epsilon"], rep["delta"], rep["rho_budget"]) == (EPS, DELTA, B)
    assert rep["rho_spent_by_partition"] == pytest.approx({"warmup": B / 4, "stream": B / 4})
    assert rep["rho_worst_case"] == pytest.approx(B / 4)        # max, not sum, over atoms
    assert rep["epsilon_worst_case"] == pytest.approx(zcdp_epsilon(B / 4, DELTA))
    assert rep["rho_remaining"] == pytest.approx(3 * B / 4)
    assert (rep["reservations"], rep["uncommitted"], rep["refusals"]) == (2, 1, 0)
    json.dumps(rep)
    acc.commit(t2)
    assert acc.report()["uncommitted"] == 0


def test_refusal_says_what_where_and_what_remains(path):
    acc = Accountant(EPS, DELTA, path)
    B = acc.rho_budget
    acc.reserve([ev(0.7 * B, epoch_partition(1, 2))], label="node 1-2")
    with pytest.raises(BudgetExhausted) as info:
        acc.reserve([ev(0.2 * B), ev(0.2 * B, epoch_partition(2, 5))], label="release 7")
    err = info.value
    msg = str(err)
    assert "release 7" in msg and "stream:epochs=2-5" in msg and "stream epoch 2" in msg
    assert err.atom == "stream epoch 2"
    assert err.remaining == pytest.approx(0.3 * B)
    assert err.load_after == pytest.approx(1.1 * B)
    assert err.requested == pytest.approx({"stream": 0.2 * B, "stream:epochs=2-5": 0.2 * B})
    # nothing was spent by the refusal; it is on the ledger for audit
    rep = acc.report()
    assert rep["rho_worst_case"] == pytest.approx(0.7 * B) and rep["refusals"] == 1
    # a request that fits on untouched epochs is still accepted
    acc.reserve([ev(0.9 * B, epoch_partition(3, 9))])


def test_parallel_composition_over_warmup_and_epochs(path):
    acc = Accountant(EPS, DELTA, path)
    B = acc.rho_budget
    acc.reserve([ev(B, "warmup")])                          # warm-up documents: all spent
    for a in range(1, 6):                                   # disjoint epochs: each its own atom
        acc.reserve([ev(B / 2, epoch_partition(a, a)), ev(B / 2, epoch_partition(a, a), "s3")])
    with pytest.raises(BudgetExhausted):
        acc.reserve([ev(B * 1e-3, epoch_partition(5, 6))])  # epoch 5 is full
    acc.reserve([ev(B, epoch_partition(6, 8))])              # epochs 6-8 are fresh
    with pytest.raises(BudgetExhausted):
        acc.reserve([ev(B * 1e-3, "stream")])                # "stream" covers every epoch
    with pytest.raises(BudgetExhausted):
        acc.reserve([ev(B * 1e-3, "warmup")])
    assert acc.report()["rho_worst_case"] == pytest.approx(B)


def test_stream_covers_future_epochs(path):
    acc = Accountant(EPS, DELTA, path)
    B = acc.rho_budget
    acc.reserve([ev(0.6 * B, "stream")])
    with pytest.raises(BudgetExhausted):
        acc.reserve([ev(0.5 * B, epoch_partition(1000, 1000))])
    acc.reserve([ev(0.4 * B, epoch_partition(1000, 1000))])
    assert acc.report()["rho_remaining_by_atom"]["stream_new_epoch"] == pytest.approx(0.4 * B)


def test_budget_split_in_float_parts_is_not_refused(path):
    acc = Accountant(EPS, DELTA, path)
    B = acc.rho_budget
    for i in range(7):
        acc.reserve([ev(B / 7, block=f"b{i}")])
    with pytest.raises(BudgetExhausted):
        acc.reserve([ev(B * 1e-6)])
    rep = acc.report()
    assert rep["rho_worst_case"] <= B * (1 + RHO_RTOL)
    assert rep["epsilon_worst_case"] <= EPS


def test_invalid_requests(path):
    acc = Accountant(EPS, DELTA, path)
    with pytest.raises(ValueError):
        acc.reserve([ev(1e-4, "streem")])
    with pytest.raises(ValueError):
        acc.reserve([ev(1e-4, "stream:epochs=3-1")])
    with pytest.raises(TypeError):
        acc.reserve([("z", 1.0)])
    with pytest.raises(KeyError):
        acc.commit(Reservation("0" * 32, "never reserved", ()))
    assert acc.report()["reservations"] == 0


def test_ledger_remembers_budget(path):
    Accountant(EPS, DELTA, path)
    with pytest.raises(LedgerMismatch):
        Accountant(2 * EPS, DELTA, path)
    with pytest.raises(LedgerMismatch):
        Accountant(EPS, DELTA / 10, path)
    Accountant(EPS, DELTA, path)


# ---------------------------------------------------------- crash semantics
def test_restart_and_uncommitted_reservations_count(path):
    acc = Accountant(EPS, DELTA, path)
    B = acc.rho_budget
    acc.commit(acc.reserve([ev(0.3 * B)]))
    acc.reserve([ev(0.5 * B)])            # "crash": never committed
    del acc
    acc = Accountant(EPS, DELTA, path)
    rep = acc.report()
    assert rep["rho_worst_case"] == pytest.approx(0.8 * B) and rep["uncommitted"] == 1
    with pytest.raises(BudgetExhausted):
        acc.reserve([ev(0.3 * B)])


def test_torn_last_line_is_ignored_then_cut(path):
    acc = Accountant(EPS, DELTA, path)
    B = acc.rho_budget
    acc.reserve([ev(0.5 * B)])
    good = path.read_bytes()
    torn = encode_line(LedgerRecord("reserve", "dead", {"label": "", "events": [ev(0.4 * B).to_dict()]}))
    with open(path, "ab") as f:
        f.write(torn[:-7])                # writer died mid-line, before its fsync
    assert Accountant(EPS, DELTA, path).report()["rho_worst_case"] == pytest.approx(0.5 * B)
    acc2 = Accountant(EPS, DELTA, path)
    acc2.reserve([ev(0.5 * B)])           # cuts the torn tail, appends on a clean line
    data = path.read_bytes()
    assert data.startswith(good) and data.endswith(b"\n") and b"dead" not in data
    records, valid = scan(data)
    assert valid == len(data) and len(records) == 3          # budget + 2 reservations
    assert acc.report()["rho_worst_case"] == pytest.approx(B)


def test_damaged_line_before_the_end_is_corruption(path):
    acc = Accountant(EPS, DELTA, path)
    acc.reserve([ev(1e-3)])
    acc.reserve([ev(1e-3)])
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"count":1', b'"count":0')   # CRC no longer matches
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorrupt):
        FileLedger(path).read()
    with pytest.raises(LedgerCorrupt):
        Accountant(EPS, DELTA, path)


def test_ledger_that_shrinks_is_refused(path):
    acc = Accountant(EPS, DELTA, path)
    acc.reserve([ev(1e-3)])
    data = path.read_bytes()
    with open(path, "r+b") as f:                            # same inode, records deleted
        f.truncate(len(data.split(b"\n")[0]) + 1)
    with pytest.raises(LedgerCorrupt):
        acc.reserve([ev(1e-3)])


def test_append_outside_lock_is_an_error(path):
    with pytest.raises(RuntimeError):
        FileLedger(path).append(LedgerRecord("x", "y"))


# --------------------------------------------------------- atom loads model
def brute_loads(items, max_epoch):
    warm = sum((Fraction(r) for p, r in items if p.kind == "warmup"), Fraction(0))
    per_epoch = [sum((Fraction(r) for p, r in items if p.covers_epoch(e)), Fraction(0))
                 for e in range(1, max_epoch + 2)]
    return max([warm] + per_epoch)


partition_st = st.one_of(
    st.just(Partition("warmup")), st.just(Partition("stream")),
    st.tuples(st.integers(1, 12), st.integers(0, 6)).map(
        lambda t: Partition("stream", (t[0], t[0] + t[1]))))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(partition_st, st.floats(1e-6, 1.0)), max_size=25))
def test_atom_loads_is_max_over_atoms(items):
    got = atom_loads(items).worst
    exact = brute_loads(items, 20)
    assert got >= exact and got == pytest.approx(float(exact), rel=1e-15, abs=0)
    assert str(parse_partition(str(items[0][0]))) == str(items[0][0]) if items else True


# ----------------------------------------------------- stateful (hypothesis)
UNITS = 16                               # the budget in whole units
machine_partition_st = st.one_of(
    st.just(Partition("warmup")), st.just(Partition("stream")),
    st.tuples(st.integers(1, 8), st.integers(0, 3)).map(
        lambda t: Partition("stream", (t[0], min(9, t[0] + t[1])))))


class AccountantMachine(RuleBasedStateMachine):
    """reserve / commit / crash / restart / torn write on one ledger file.

    The model counts whole units per atom (warm-up, epochs 1..8, "stream"),
    so acceptance is exact: a request is accepted iff no atom exceeds UNITS.
    """

    def __init__(self):
        super().__init__()
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "ledger.jsonl")
        self.acc = Accountant(EPS, DELTA, self.path)
        self.unit = self.acc.rho_budget / UNITS
        self.model: list[tuple[Partition, int]] = []
        self.pending: list[Reservation] = []
        self.refused: list[tuple[str, int]] = []
        self.last_worst = 0.0

    def teardown(self):
        self.dir.cleanup()

    def model_worst(self, extra=()):
        items = list(self.model) + list(extra)
        return brute_loads([(p, n) for p, n in items], 10)

    @precondition(lambda self: self.acc is not None)
    @rule(part=machine_partition_st, units=st.integers(1, 7))
    def reserve(self, part, units):
        request = [ev(self.unit * units, str(part))]
        fits = self.model_worst([(part, units)]) <= UNITS
        try:
            token = self.acc.reserve(request, label=f"{part}x{units}")
        except BudgetExhausted:
            assert not fits, "refused a request that fits"
            self.refused.append((str(part), units))
            return
        assert fits, "accepted a request that exceeds the budget"
        self.model.append((part, units))
        self.pending.append(token)

    @precondition(lambda self: self.acc is not None and self.pending)
    @rule(i=st.integers(0, 100))
    def commit(self, i):
        self.acc.commit(self.pending.pop(i % len(self.pending)))

    @precondition(lambda self: self.acc is not None and self.refused)
    @rule(i=st.integers(0, 100))
    def retry_refused(self, i):
        part, units = self.refused[i % len(self.refused)]
        with pytest.raises(BudgetExhausted):             # refused once, refused forever
            self.acc.reserve([ev(self.unit * units, part)])

    @precondition(lambda self: self.acc is not None)
    @rule()
    def crash(self):
        self.acc = None                                  # pending tokens die with it
        self.pending = []

    @rule()
    def restart(self):
        self.acc = Accountant(EPS, DELTA, self.path)
        self.pending = []

    @rule(cut=st.integers(1, 400), units=st.integers(1, 7))
    def torn_write(self, cut, units):
        rec = LedgerRecord("reserve", os.urandom(8).hex(),
                           {"label": "torn", "events": [ev(self.unit * units).to_dict()]})
        line = encode_line(rec)
        with open(self.path, "ab") as f:                 # died before finishing the line
            f.write(line[: min(cut, len(line) - 1)])

    @invariant()
    def spend_is_bounded_and_monotone(self):
        fresh = Accountant(EPS, DELTA, self.path)        # what a restart would see
        loads = fresh.loads()
        assert loads.worst <= fresh.rho_budget * (1 + RHO_RTOL)
        assert loads.worst >= self.last_worst
        assert loads.worst == pytest.approx(self.model_worst() * self.unit, rel=1e-9, abs=1e-300)
        self.last_worst = loads.worst


TestAccountantMachine = AccountantMachine.TestCase
TestAccountantMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# -------------------------------------------------------------- concurrency
def _spend_worker(path, unit_rho, attempts, barrier, out):
    acc = Accountant(EPS, DELTA, path)
    barrier.wait()
    ok = 0
    for _ in range(attempts):
        try:
            acc.reserve([ev(unit_rho)], label=f"pid {os.getpid()}")
            ok += 1
        except BudgetExhausted:
            pass
    out.put(ok)


def _run_processes(path, unit_rho, attempts, n):
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_spend_worker, args=(str(path), unit_rho, attempts, barrier, out))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_processes_cannot_both_spend_the_last_of_the_budget(path):
    acc = Accountant(EPS, DELTA, path)
    B = acc.rho_budget
    acc.reserve([ev(0.5 * B)])
    results = _run_processes(path, 0.4 * B, 1, 4)
    assert sorted(results) == [0, 0, 0, 1]
    assert acc.report()["reservations"] == 2


def test_processes_spend_exactly_the_budget(path):
    B = Accountant(EPS, DELTA, path).rho_budget
    results = _run_processes(path, B / 25, 10, 4)
    assert sum(results) == 25
    rep = Accountant(EPS, DELTA, path).report()
    assert rep["reservations"] == 25 and rep["refusals"] == 40 - 25
    assert rep["rho_worst_case"] <= B * (1 + RHO_RTOL)


def test_two_accountant_objects_in_one_process(path):
    a, b = Accountant(EPS, DELTA, path), Accountant(EPS, DELTA, path)
    B = a.rho_budget
    a.reserve([ev(0.5 * B)])
    barrier = threading.Barrier(2)
    wins = []

    def spend(acc, n):
        barrier.wait()
        for _ in range(n):
            try:
                acc.reserve([ev(B / 40)])
                wins.append(acc)
            except BudgetExhausted:
                pass

    threads = [threading.Thread(target=spend, args=(x, 15)) for x in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 20                      # exactly the remaining half, shared
    with pytest.raises(BudgetExhausted):
        b.reserve([ev(B / 40)])


def test_deleted_ledger_is_not_silently_recreated(path):
    acc = Accountant(EPS, DELTA, path)
    acc.reserve([ev(1e-3)])
    os.unlink(path)
    with pytest.raises(FileNotFoundError):
        acc.reserve([ev(1e-3)])


# ------------------------------------------------------------------ lock order (review finding)
class _SlowLedger:
    """A ledger whose one internal lock guards both exclusive() and read() (as FileLedger's
    thread lock does), slowed down so that two threads taking the accountant's lock and the
    ledger's lock in opposite orders would deadlock."""

    def __init__(self) -> None:
        from streamdp.privacy.memory_ledger import MemoryLedger
        self.inner = MemoryLedger()
        self.lock = threading.RLock()
        self.reading = threading.Event()
        self.in_exclusive = threading.Event()

    def exclusive(self):
        import contextlib
        import time as _t

        @contextlib.contextmanager
        def cm():
            with self.lock:
                self.in_exclusive.set()
                _t.sleep(0.05)            # another thread takes the accountant's lock meanwhile
                yield
        return cm()

    def read(self):
        import time as _t
        self.reading.set()
        _t.sleep(0.05)
        with self.lock:
            return self.inner.read()

    def append(self, record):
        with self.lock:
            self.inner.append(record)


def test_reserve_and_report_take_the_locks_in_one_order():
    ledger = _SlowLedger()
    acc = Accountant(EPS, DELTA, ledger)
    B = acc.rho_budget
    errors = []

    def reserver():
        try:
            for i in range(10):
                acc.commit(acc.reserve([ev(B / 100, epoch_partition(i + 1, i + 1))], label=f"r{i}"))
        except BaseException as exc:      # noqa: BLE001
            errors.append(exc)

    def reporter():
        try:
            for _ in range(20):
                acc.report()
        except BaseException as exc:      # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reserver, daemon=True),
               threading.Thread(target=reporter, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "reserve and report deadlocked"
    assert not errors
    assert acc.report()["reservations"] == 10


# ------------------------------------------------------------------ idempotency keys, head
def test_keyed_reservation_is_fulfilled_once_and_never_recharged(path):
    from streamdp.privacy.accountant import AlreadySpent
    acc = Accountant(EPS, DELTA, path)
    B = acc.rho_budget
    e = [ev(B / 2, epoch_partition(1, 1))]
    t1 = acc.reserve(e, label="tree:epoch=1", key="tree:epoch=1")
    assert not t1.fulfilling
    # a restart (new accountant) reserves the same key again: same reservation, no new charge
    acc2 = Accountant(EPS, DELTA, path)
    t2 = acc2.reserve(e, label="tree:epoch=1", key="tree:epoch=1")
    assert t2.fulfilling and t2.id == t1.id
    rep = acc2.report()
    assert rep["reservations"] == 1 and rep["uncommitted"] == 1
    assert rep["rho_worst_case"] == pytest.approx(B / 2)
    assert [r.id for r in acc2.uncommitted()] == ["tree:epoch=1"]
    # other events under the same key: refused, nothing recorded
    with pytest.raises(ValueError, match="other events"):
        acc2.reserve([ev(B / 3, epoch_partition(1, 1))], key="tree:epoch=1")
    acc2.commit(t2)
    assert acc2.uncommitted() == []
    with pytest.raises(AlreadySpent):
        acc2.reserve(e, key="tree:epoch=1")
    assert Accountant(EPS, DELTA, path).report()["rho_worst_case"] == pytest.approx(B / 2)


def test_ledger_head_is_a_hash_chain_over_the_records(path):
    from streamdp.privacy.ledger import ledger_head
    acc = Accountant(EPS, DELTA, path)
    h0 = acc.head()
    assert h0 == ledger_head(FileLedger(path).read()) and h0["records"] == 1
    acc.reserve([ev(acc.rho_budget / 4, "warmup", "warmup")], key="warmup")
    h1 = acc.head()
    assert h1["records"] == 2 and h1["head"] != h0["head"]
    assert ledger_head(FileLedger(path).read()[:1]) == h0
    # a fresh ledger with the same budget has a different head (different creation record)
    other = Accountant(EPS, DELTA, path.parent / "other.jsonl")
    assert other.head()["head"] != h0["head"]


# ---------------------------------------------------------------- δ on stream atoms
from streamdp.privacy.memory_ledger import MemoryLedger  # noqa: E402
def test_stream_atoms_carry_delta_per_atom_known_answers():
    """Bun & Steinke Lemma 8.3 per atom: δ's add over the events covering an atom; the stream's
    ρ limit is zcdp_rho(ε, δ − the worst stream atom's δ sum) (issue 23 item 2, premise check)."""
    from streamdp.privacy.accountant import atom_loads
    from streamdp.privacy.conversions import zcdp_rho
    # known answers of the per-atom sums: "stream" covers every epoch, ranges add where they meet
    loads = atom_loads([(Partition("stream"), 0.1, 1e-9),
                        (Partition("stream", (1, 3)), 0.2, 2e-9),
                        (Partition("stream", (3, 5)), 0.3, 4e-9),
                        (Partition("stream", (7, 7)), 0.05, 1e-8)])
    assert loads.worst_stream == pytest.approx(0.6) and loads.worst_epoch == 3
    assert loads.stream_delta == pytest.approx(1.1e-8)        # epoch 7: 1e-9 + 1e-8 (> epoch 3's 7e-9)
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    limit = zcdp_rho(1.0, 1e-6 - 4e-7)
    assert limit < acc.rho_budget
    # a stream event with δ 4e-7: ρ just above the δ-reduced limit is refused, just below accepted
    over = 1.0 / math.sqrt(2 * limit * 1.001)
    with pytest.raises(BudgetExhausted, match="δ_s"):
        acc.reserve([GaussianEvent("n", 1.0, over, partition=epoch_partition(2, 2), delta=4e-7)])
    ok = 1.0 / math.sqrt(2 * limit * 0.999)
    acc.reserve([GaussianEvent("n", 1.0, ok, partition=epoch_partition(2, 2), delta=4e-7)])
    rep = acc.report()
    assert rep["delta_of_approximate_events_by_atom"]["stream_worst"] == pytest.approx(4e-7)
    assert rep["epsilon_worst_case"] == pytest.approx(zcdp_epsilon(0.999 * limit, 6e-7), rel=1e-6)
    assert rep["epsilon_worst_case"] <= 1.0
    # a second δ on the same atom adds up: 4e-7 + 6e-7 = δ can never be converted
    with pytest.raises(BudgetExhausted):
        acc.reserve([GaussianEvent("m", 1.0, 1e6, partition="stream", delta=6e-7)])
    # the warm-up keeps its whole budget (parallel composition, no δ there)
    acc.reserve([GaussianEvent("w", 1.0, 1.0 / math.sqrt(2 * acc.rho_budget * 0.999),
                               partition="warmup")])
    # the ledger replays the δ
    assert Accountant(1.0, 1e-6, acc.ledger).loads().stream_delta == pytest.approx(4e-7)


def test_a_delta_below_float_resolution_still_rounds_the_limit_down():
    """δ_s = 1e-33 (one premise check at z = 12) vanishes in δ − δ_s in float arithmetic: the
    δ left for the conversion is rounded down, so the limit is never above the exact one."""
    from streamdp.privacy.accountant import _delta_left
    from streamdp.privacy.conversions import zcdp_rho
    delta, used = 1e-6, 1.78e-33
    rest = _delta_left(delta, used)
    assert rest < delta and Fraction(rest) <= Fraction(delta) - Fraction(used)
    assert _delta_left(delta, 0.0) == delta
    acc = Accountant(1.0, delta, MemoryLedger())
    assert acc.rho_limit(used) <= zcdp_rho(1.0, delta)
    assert acc.rho_limit(used) == pytest.approx(acc.rho_budget, rel=1e-9)


def test_the_warmup_atom_carries_its_own_delta_known_answers():
    """The warm-up's noised premise check is a δ-approximate event on the warm-up atom (issue 23
    item 2): its ρ limit is zcdp_rho(ε, δ − δ_w), the stream atoms keep theirs (parallel), and
    the report converts the warm-up at δ − δ_w."""
    from streamdp.privacy.conversions import zcdp_rho
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    limit = zcdp_rho(1.0, 1e-6 - 4e-7)
    over = 1.0 / math.sqrt(2 * limit * 1.001)
    with pytest.raises(BudgetExhausted, match="δ_w") as err:
        acc.reserve([GaussianEvent("p", 1.0, over, partition="warmup", delta=4e-7)])
    assert err.value.atom == "warmup"
    ok = 1.0 / math.sqrt(2 * limit * 0.999)
    acc.reserve([GaussianEvent("p", 1.0, ok, partition="warmup", delta=4e-7)])
    loads = acc.loads()
    assert loads.warmup_delta == pytest.approx(4e-7) and loads.stream_delta == 0.0
    rep = acc.report()
    assert rep["delta_of_approximate_events_by_atom"]["warmup"] == pytest.approx(4e-7)
    assert rep["epsilon_worst_case"] == pytest.approx(zcdp_epsilon(0.999 * limit, 6e-7), rel=1e-6)
    assert rep["rho_remaining_by_atom"]["warmup"] == pytest.approx(0.001 * limit, rel=1e-3)
    # the stream atoms are another atom: their whole ρ budget is left
    acc.reserve([GaussianEvent("s", 1.0, 1.0 / math.sqrt(2 * acc.rho_budget * 0.999),
                               partition="stream")])
    # a second warm-up δ adds up: 4e-7 + 6e-7 = δ can never be converted
    with pytest.raises(BudgetExhausted):
        acc.reserve([GaussianEvent("q", 1.0, 1e6, partition="warmup", delta=6e-7)])
    # the ledger replays the δ
    assert Accountant(1.0, 1e-6, acc.ledger).loads().warmup_delta == pytest.approx(4e-7)
