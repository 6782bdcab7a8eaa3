"""The privacy accountant: a zCDP budget filter backed by a write-ahead ledger.

Guarantee
---------
Unit: one document; neighbouring streams differ by adding or removing one
document. Every noise draw is a Gaussian mechanism (:class:`GaussianEvent`)
whose cost ρ = count·Δ²/(2σ²) is reserved here before the noise is drawn.
The configured (ε, δ) is converted once into a zCDP budget
ρ_budget = zcdp_rho(ε, δ) (Canonne–Kamath–Steinke 2020, rounded down).

Composition over partitions (the sums: :mod:`streamdp.privacy.atom_loads`)
---------------------------------------------------------------------------
Documents are split by their own timestamp into disjoint *atoms*: the warm-up,
and each stream epoch 1, 2, 3, .... An event's ``partition`` says which atoms
its released sum covers:

* ``"warmup"``               → the warm-up atom;
* ``"vocabulary"``           → the vocabulary-selection atom (documents of the private
  vocabulary selection, a slice disjoint from the warm-up and the stream);
* ``"stream"``               → every stream epoch, present and future;
* ``"stream:epochs=a-b"``    → stream epochs a..b (inclusive).

A document in atom A is affected only by events covering A, and ρ adds up
under (adaptive) sequential composition, so its loss is ρ(A) = Σ ρ of events
covering A. Its worst case over all documents is max_A ρ(A) (parallel
composition: the max, not the sum, over atoms). That maximum must stay
≤ ρ_budget; it is converted back to ε with the same CKS formula in
:meth:`Accountant.report`.

Approximate events (the vocabulary atom and stream atoms)
--------------------------------------------------------
An event with ``delta > 0`` is δ-approximately ρ-zCDP: ρ-zCDP except on an event of
probability ≤ δ (Bun & Steinke 2016, Def. 8.1) — OpenDP's ``make_gaussian_threshold``
partition selection, or the continual release's noised premise check (streamdp.continual,
docs/privacy.md "The premise check"). Under composition ρ's and δ's add per atom (ibid.,
Lemma 8.3), so an atom A carries δ_A = Σ δ of the events covering it and a document of A is
(ε_CKS(ρ_A, δ − δ_A), δ)-DP: its ρ must stay ≤ zcdp_rho(ε, δ − δ_A) (the δ it has left for the
conversion, rounded down), and δ_A < δ; ``reserve`` refuses otherwise. Such events are accepted
on the ``"vocabulary"`` partition and on stream partitions (``"stream"``,
``"stream:epochs=a-b"``); the stream atoms are checked together, conservatively: the worst
stream ρ against the limit of the worst stream δ (the limit only falls as δ_A grows). The
warm-up atom accepts them too (its noised premise check, docs/privacy.md "The premise check"),
with its own δ_w. Atoms with δ_A = 0 have the plain ρ_budget.

Filter semantics
----------------
``reserve`` refuses (:class:`BudgetExhausted`) any request after which some
atom would exceed the budget, and accepts any request that fits. Spend never
decreases — no refunds, and a reservation never committed (a crash between
reserve and release) counts forever — so a request refused once is refused
forever, and an exhausted atom stays exhausted; a later *smaller* request that
still fits (or one on another atom) may be accepted. This is a valid privacy
filter under adaptivity (Rogers et al. 2016; Feldman & Zrnic 2021 for RDP/zCDP):
the decision depends only on the ρ's asked for, never on the data, and every
executed mechanism keeps Σρ ≤ ρ_budget on every atom.

Durability and concurrency
--------------------------
``reserve`` runs under the ledger's exclusive lock: re-read the ledger (other
processes may have spent), check, append the reservation durably, return. Only
then may the caller draw noise. Two accountants (threads, processes) on one
ledger are therefore serialised and cannot both spend the last of the budget.

Lock order (one order everywhere): the accountant's own lock first, then the
ledger's (``exclusive()`` and the ledger's internal lock taken by ``read()``).
``reserve``, ``commit``, ``report`` and the constructor all follow it, so a
thread reporting while another reserves cannot deadlock.

Idempotency keys
----------------
``reserve(events, key=K)`` names exactly what the reservation pays for (e.g.
``"tree:epoch=5"``, ``"warmup:warmup"``). A second ``reserve`` with the same key
and the same events, while the first is *uncommitted*, returns the same
reservation without a new charge (``Reservation.fulfilling`` is True): this is
how a release whose noised output was lost in a crash is fulfilled by a fresh
draw (docs/privacy_accounting.md §Crash-safe spending,
:mod:`streamdp.privacy.spend`). A committed key is never reserved again
(:class:`AlreadySpent`), and a key reused with other events is an error.
"""
from __future__ import annotations

import math
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Sequence

from streamdp.privacy.atom_loads import AtomLoads, LoadTally, epsilon_worst_case
from streamdp.privacy.atom_loads import delta_left as _delta_left
# Tests import the load sums from here too (re-exports only)
from streamdp.privacy.atom_loads import atom_loads, events_loads  # noqa: F401
from streamdp.privacy.conversions import RHO_RTOL, zcdp_rho
from streamdp.privacy.events import STREAM, VOCABULARY, WARMUP, GaussianEvent, parse_partition
from streamdp.privacy.ledger import CHAIN_SEED, FileLedger, Ledger, LedgerRecord, chain_step

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["UNIT", "LEDGER_UNITS", "CONVERSION", "COMPOSITION", "BudgetExhausted", "LedgerMismatch",
           "AlreadySpent", "Reservation", "recorded_budget", "Accountant", "LoadTally",
           "atom_loads", "events_loads"]

UNIT = "one document, add/remove"
#: the ledger's unit by privacy unit (events.PRIVACY_UNITS); a "user" ledger refuses
#: document-level events (their sensitivities do not cover a whole user)
LEDGER_UNITS = {"document": UNIT, "user": "one user (all of its documents), add/remove"}
CONVERSION = ("Canonne-Kamath-Steinke 2020 zCDP->(eps,delta) (OpenDP cdp_epsilon; "
              "cross-checked against dp_accounting RdpAccountant)")
COMPOSITION = ("zCDP: rho adds up over events covering an atom (sequential, adaptive); "
               "a document's loss is the max over atoms (parallel composition); atoms are "
               "the warm-up and each stream epoch, assigned by document timestamp, and the "
               "vocabulary-selection slice; 'stream' covers every epoch, 'stream:epochs=a-b' "
               "epochs a..b; approximate (rho, delta) events on 'vocabulary', 'warmup' and "
               "stream partitions: delta adds per atom, whose rho limit is zcdp_rho(eps, delta - "
               "its delta sum)")


class BudgetExhausted(RuntimeError):
    """A reservation would push some atom's ρ over the budget; nothing was spent.

    Attributes
    ----------
    label : str                      the refused request's label
    requested : dict[str, float]     ρ asked for, per partition
    atom : str                       the atom that would overflow
    load_after : float               that atom's ρ had the request been accepted
    remaining : float                ρ still available on that atom
    budget : float                   ρ_budget
    """

    def __init__(self, message: str, *, label: str, requested: dict[str, float], atom: str,
                 load_after: float, remaining: float, budget: float) -> None:
        super().__init__(message)
        self.label = label
        self.requested = requested
        self.atom = atom
        self.load_after = load_after
        self.remaining = remaining
        self.budget = budget


class LedgerMismatch(ValueError):
    """The ledger was created for a different (ε, δ) budget."""


class AlreadySpent(ValueError):
    """A reservation with this idempotency key was already committed: its output exists."""


@dataclass(frozen=True)
class Reservation:
    """Token returned by :meth:`Accountant.reserve`; pass it to :meth:`Accountant.commit`."""

    id: str
    label: str
    events: tuple[GaussianEvent, ...]
    fulfilling: bool = False      # True: an earlier, uncommitted reservation of the same key

    @property
    def rho(self) -> float:
        return math.fsum(e.rho for e in self.events)


def _event_from_dict(d: dict) -> GaussianEvent:
    return GaussianEvent(block=d["block"], sensitivity=float(d["sensitivity"]),
                         sigma=float(d["sigma"]), count=int(d["count"]),
                         partition=d["partition"], mechanism=d["mechanism"],
                         delta=float(d.get("delta", 0.0)), unit=d.get("unit", "document"))


def recorded_budget(ledger: Ledger, epsilon: float, delta: float,
                    unit: str = "document") -> dict | None:
    """The budget record of ``ledger`` (its payload; None: a new ledger, no budget yet).

    Raises :class:`LedgerMismatch` unless it records this (ε, δ, privacy unit): the budget of a
    ledger never changes. Read-only, so a service can refuse a start before any side effect
    (the release service runs it before it takes its lease); :class:`Accountant` runs it again
    under the ledger's lock.
    """
    recorded_unit = LEDGER_UNITS[unit]
    budget = [r for r in ledger.read() if r.kind == "budget"]
    if not budget:
        return None
    p = budget[0].payload
    if (p.get("epsilon"), p.get("delta"), p.get("unit")) != (float(epsilon), float(delta),
                                                             recorded_unit):
        raise LedgerMismatch(
            f"ledger {ledger!r} enforces (ε={p.get('epsilon')}, δ={p.get('delta')}, "
            f"unit={p.get('unit')!r}); this accountant was configured with "
            f"(ε={float(epsilon)}, δ={float(delta)}, unit={recorded_unit!r})")
    return p


# --------------------------------------------------------------- accountant
class _Fold:
    """Everything the accountant derives from the ledger, folded record by record.

    Purely a cache of the ledger: rebuilt from scratch whenever the ledger's
    history does not extend what was folded (e.g. the file was replaced).
    """

    def __init__(self) -> None:
        self.n = 0                                  # records folded
        self.last: LedgerRecord | None = None
        self.tally = LoadTally()
        self.by_partition: dict[str, list[float]] = {}
        self.keys: set[str] = set()                 # reservations (committed or not)
        self.committed: set[str] = set()
        self.reserved: dict[str, dict] = {}         # key → payload (label, events) as reserved
        self.refusals = 0
        self.head = CHAIN_SEED                      # hash chain over the folded records

    def extends(self, records: list[LedgerRecord]) -> bool:
        return len(records) >= self.n and (self.n == 0 or records[self.n - 1] == self.last)

    def fold(self, records: list[LedgerRecord]) -> None:
        for rec in records[self.n:]:
            if rec.kind in ("reserve", "commit"):
                # Reserve and commit records of one reservation carry the same
                # events (for compaction): count them once, whichever survives.
                if rec.key not in self.keys:
                    self.keys.add(rec.key)
                    self.reserved[rec.key] = rec.payload
                    for d in rec.payload["events"]:
                        e = _event_from_dict(d)
                        self.tally.add(parse_partition(e.partition), e.rho, e.delta)
                        self.by_partition.setdefault(e.partition, []).append(e.rho)
                if rec.kind == "commit":
                    self.committed.add(rec.key)
            elif rec.kind == "refuse":
                self.refusals += 1
            self.head = chain_step(self.head, rec)
        self.n = len(records)
        self.last = records[-1] if records else None


class Accountant:
    """ρ-zCDP budget filter on a durable ledger (implements ``BudgetSpender``).

    Parameters
    ----------
    epsilon, delta : float
        The guarantee to enforce, per document (add/remove), over the ledger's
        whole life. Converted once to ``rho_budget`` (CKS 2020, rounded down).
    ledger : Ledger, str or PathLike
        A :class:`Ledger`, or a path for a :class:`FileLedger`. The first
        accountant on a ledger records its (ε, δ); later ones must match
        (:class:`LedgerMismatch` otherwise) so a restart can never silently
        enlarge the budget.

    The accountant holds no state of its own beyond a cache of the ledger:
    any number of accountants (threads, processes, restarts) on one ledger
    enforce one budget.
    """

    unit = UNIT

    def __init__(self, epsilon: float, delta: float, ledger: Ledger | str | os.PathLike, *,
                 unit: str = "document") -> None:
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        if unit not in LEDGER_UNITS:
            raise ValueError(f"unit must be one of {tuple(LEDGER_UNITS)}, got {unit!r}")
        self.privacy_unit = unit
        UNIT = LEDGER_UNITS[unit]       # noqa: N806 (the ledger's unit, as recorded)
        self.unit = UNIT
        self.ledger: Ledger = ledger if isinstance(ledger, Ledger) else FileLedger(ledger)
        self._lock = threading.RLock()
        self._fold = _Fold()
        rho = zcdp_rho(self.epsilon, self.delta)
        with self._lock, self.ledger.exclusive():
            p = recorded_budget(self.ledger, self.epsilon, self.delta, unit)
            if p is not None:
                # If the conversion code ever changes, keep the smaller budget.
                rho = min(rho, float(p["rho"]))
            else:
                self.ledger.append(LedgerRecord("budget", "budget", {
                    "epsilon": self.epsilon, "delta": self.delta, "rho": rho,
                    "unit": UNIT, "conversion": CONVERSION}))
        self.rho_budget = rho

    def __repr__(self) -> str:
        return (f"Accountant(epsilon={self.epsilon}, delta={self.delta}, "
                f"rho_budget={self.rho_budget:.6g}, ledger={self.ledger!r})")

    # ------------------------------------------------------------ ledger state
    def _state(self) -> _Fold:
        """The fold of the whole ledger as it is now (new records folded in)."""
        with self._lock:
            records = self.ledger.read()
            if not self._fold.extends(records):
                self._fold = _Fold()
            self._fold.fold(records)
            return self._fold

    def loads(self) -> AtomLoads:
        """Current per-document ρ by atom, from the ledger."""
        with self._lock:
            return self._state().tally.loads()

    def remaining(self) -> float:
        """ρ still available to the worst-off document (≥ 0)."""
        return max(0.0, self.rho_budget - self.loads().worst)

    # ---------------------------------------------------------------- spending
    def _within(self, load: float) -> bool:
        return load <= self.rho_budget * (1.0 + RHO_RTOL)

    def reserve(self, events: Sequence[GaussianEvent], *, label: str = "",
                key: str | None = None) -> Reservation:
        """Durably reserve ``events`` or raise :class:`BudgetExhausted`.

        Returns a :class:`Reservation` once the reservation is on stable
        storage; only then may the caller draw the noise. Raises
        ``TypeError``/``ValueError`` for non-GaussianEvents or unknown
        partition strings (nothing is recorded then).

        ``key``: idempotency key naming what is released (module docstring).
        An uncommitted reservation of the same key and events is returned
        again, uncharged (``fulfilling=True``); a committed one raises
        :class:`AlreadySpent`; other events under the same key raise ValueError.
        """
        events = tuple(events)
        parts = []
        for e in events:
            if not isinstance(e, GaussianEvent):
                raise TypeError(f"reserve() takes GaussianEvents, got {type(e).__name__}")
            parts.append(parse_partition(e.partition))      # strict: refuse to guess
            if self.privacy_unit == "user" and e.unit != "user":
                raise ValueError(f"event {e.block!r} is {e.unit}-level but the ledger "
                                 f"{self.ledger!r} protects users: its sensitivity does not "
                                 "cover all documents of a user (docs/privacy.md)")
        if key is not None and (not isinstance(key, str) or not key or key.startswith("refuse:")
                                or key == "budget"):
            raise ValueError(f"bad reservation key {key!r}")
        rid = key if key is not None else uuid.uuid4().hex
        requested: dict[str, float] = {}
        for e in events:
            requested[e.partition] = requested.get(e.partition, 0.0) + e.rho
        payload = {"label": label, "events": [e.to_dict() for e in events]}
        with self._lock, self.ledger.exclusive():          # lock order: accountant, then ledger
            st = self._state()
            if key is not None and key in st.keys:
                if key in st.committed:
                    raise AlreadySpent(
                        f"reservation {key!r} was already committed in {self.ledger!r}: its noised "
                        "output was persisted; use it instead of drawing again")
                if st.reserved[key]["events"] != payload["events"]:
                    raise ValueError(f"reservation key {key!r} is in {self.ledger!r} with other "
                                     "events: an idempotency key must name exactly one release")
                return Reservation(rid, st.reserved[key].get("label", label), events,
                                   fulfilling=True)
            self._refuse_unless_within(st, parts, events, label, requested, payload, key)
            self.ledger.append(LedgerRecord("reserve", rid, payload))
        return Reservation(rid, label, events)

    def admit(self, planned: Sequence[tuple[str | None, Sequence[GaussianEvent]]], *,
              label: str = "") -> None:
        """Refuse (:class:`BudgetExhausted`, with a ``refuse`` line on the ledger, as
        :meth:`reserve`) unless the ``planned`` draws *together* fit the budget now; reserves
        nothing. ``planned``: each draw's idempotency key (None: unkeyed) and events; a draw
        whose key is already on the ledger (a re-run's: its output is persisted or its
        reservation is fulfilled, uncharged) is not counted again.
        For an operation whose draws are planned up front but drawn one after another (the
        clustering start): admitted as a whole before its first draw, so a refusal comes
        before any draw and charges nothing (docs/privacy.md "The premise check")."""
        with self._lock, self.ledger.exclusive():          # lock order: accountant, then ledger
            st = self._state()
            events = tuple(e for key, evs in planned if key is None or key not in st.keys
                           for e in evs)
            parts = [parse_partition(e.partition) for e in events]
            requested: dict[str, float] = {}
            for e in events:
                requested[e.partition] = requested.get(e.partition, 0.0) + e.rho
            payload = {"label": label, "events": [e.to_dict() for e in events]}
            self._refuse_unless_within(st, parts, events, label, requested, payload, None)

    def _refuse_unless_within(self, st: _Fold, parts, events, label: str,
                              requested: dict[str, float], payload: dict,
                              key: str | None) -> None:
        """THE budget rule of :meth:`reserve` and :meth:`admit` (under both locks): raise the
        refusal, recorded on the ledger, if ``events`` on top of the ledger's loads exceed it."""
        before = st.tally
        after_tally = before.copy()
        for part, e in zip(parts, events):
            after_tally.add(part, e.rho, e.delta)
        after = after_tally.loads()
        err = None
        if not self._within(after.worst):
            err = self._refusal(label, requested, before, after)
        else:
            err = next((self._approximate_refusal(label, requested, *atom)
                        for atom in self._approximate_atoms(before, after)
                        if not self._approximate_within(atom[3], atom[4])), None)
        if err is not None:
            self.ledger.append(LedgerRecord("refuse", f"refuse:{uuid.uuid4().hex}", {
                **payload, "atom": err.atom, "load_after": err.load_after,
                "rho_budget": self.rho_budget, **({"for_key": key} if key else {})}))
            raise err

    def rho_limit(self, delta_used: float) -> float:
        """ρ an atom may reach when its approximate events use ``delta_used`` of δ:
        zcdp_rho(ε, δ − δ_used), δ − δ_used rounded down (0 if δ_used ≥ δ)."""
        if delta_used <= 0:
            return self.rho_budget
        if delta_used >= self.delta:
            return 0.0
        return min(self.rho_budget, zcdp_rho(self.epsilon, _delta_left(self.delta, delta_used)))

    def vocabulary_rho_limit(self, delta_vocabulary: float) -> float:
        """:meth:`rho_limit` of the vocabulary-selection atom."""
        return self.rho_limit(delta_vocabulary)

    def _approximate_atoms(self, before: LoadTally, after: AtomLoads):
        """Each atom that may carry approximate events, in the order refusals are checked:
        (atom, who, δ symbol, ρ load after, δ used after, ρ load before)."""
        stream_atom = (f"{STREAM} (every epoch)" if after.worst_epoch is None
                       else f"{STREAM} epoch {after.worst_epoch}")
        return ((VOCABULARY, f"documents of the {VOCABULARY} selection", "δ_v", after.vocabulary,
                 after.vocabulary_delta, lambda: before.atom(vocabulary=True)),
                (stream_atom, "stream documents", "δ_s", after.worst_stream, after.stream_delta,
                 lambda: before.atom(epoch=after.worst_epoch)),
                (WARMUP, "warm-up documents", "δ_w", after.warmup, after.warmup_delta,
                 lambda: before.atom(warmup=True)))

    def _approximate_within(self, load: float, delta_used: float) -> bool:
        """The one rule for an atom with approximate events: its δ sum below δ, and its ρ within
        zcdp_rho(ε, δ − δ_used) (Bun & Steinke 2016, Lemma 8.3: ρ's and δ's add per atom)."""
        if delta_used <= 0:
            return True
        return delta_used < self.delta and load <= self.rho_limit(delta_used) * (1.0 + RHO_RTOL)

    def _approximate_refusal(self, label: str, requested: dict[str, float], atom: str, who: str,
                             symbol: str, load: float, delta_used: float,
                             had_before) -> BudgetExhausted:
        limit = self.rho_limit(delta_used)
        had = had_before()
        msg = (f"privacy budget exhausted: refused {label or 'reservation'!r}: {who} would reach "
               f"ρ={load:.6g} with {symbol}={delta_used:.3g} of approximate events; with "
               f"δ − {symbol} left for the conversion their limit is ρ={limit:.6g} "
               f"(ε={self.epsilon:g}, δ={self.delta:g}, {UNIT}); ρ remaining there: "
               f"{max(0.0, limit - had):.6g}. Nothing was spent.")
        return BudgetExhausted(msg, label=label, requested=requested, atom=atom, load_after=load,
                               remaining=max(0.0, limit - had), budget=limit)

    def uncommitted(self) -> list[Reservation]:
        """Reservations on the ledger that were never committed, oldest first."""
        with self._lock:
            st = self._state()
            out = []
            for rec in self.ledger.read():
                if rec.kind == "reserve" and rec.key not in st.committed \
                        and rec.key not in {r.id for r in out}:
                    out.append(Reservation(rec.key, rec.payload.get("label", ""), tuple(
                        _event_from_dict(d) for d in rec.payload["events"])))
            return out

    def head(self) -> dict:
        """``{"records": n, "head": sha256 chain}`` of the ledger now (ledger.ledger_head)."""
        with self._lock:
            st = self._state()
            return {"records": st.n, "head": st.head}

    def _refusal(self, label: str, requested: dict[str, float], before: LoadTally,
                 after: AtomLoads) -> BudgetExhausted:
        atom = after.worst_atom
        had = before.atom(warmup=(atom == WARMUP), epoch=after.worst_epoch)
        remaining = max(0.0, self.rho_budget - had)
        asks = ", ".join(f"{p}: ρ={r:.6g}" for p, r in sorted(requested.items()))
        msg = (f"privacy budget exhausted: refused {label or 'reservation'!r}, which asks "
               f"{asks} (total ρ={math.fsum(requested.values()):.6g}); documents in {atom} "
               f"would reach ρ={after.worst:.6g} > budget ρ={self.rho_budget:.6g} "
               f"(ε={self.epsilon:g}, δ={self.delta:g}, {UNIT}); ρ remaining on {atom}: "
               f"{remaining:.6g}. Nothing was spent.")
        return BudgetExhausted(msg, label=label, requested=requested, atom=atom,
                               load_after=after.worst, remaining=remaining,
                               budget=self.rho_budget)

    def commit(self, token: Reservation) -> None:
        """Mark a reservation as released (idempotent). It stays spent either way."""
        if not isinstance(token, Reservation):
            raise TypeError(f"commit() takes the Reservation returned by reserve(), got {token!r}")
        with self._lock, self.ledger.exclusive():          # lock order: accountant, then ledger
            st = self._state()
            if token.id in st.committed:
                return
            if token.id not in st.keys:
                raise KeyError(f"reservation {token.id} ({token.label!r}) is not in {self.ledger!r}")
            self.ledger.append(LedgerRecord("commit", token.id, {
                "label": token.label, "events": [e.to_dict() for e in token.events]}))

    # ---------------------------------------------------------------- report
    def report(self) -> dict:
        """JSON-serialisable privacy report (see the module docstring)."""
        with self._lock:
            st = self._state()
            loads = st.tally.loads()
            rho_by_partition = {p: math.fsum(v) for p, v in sorted(st.by_partition.items())}
            reservations, uncommitted, refusals = (len(st.keys), len(st.keys - st.committed),
                                                   st.refusals)
        return {
            "unit": self.unit,
            "currency": "rho (zCDP)",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rho_budget": self.rho_budget,
            "conversion": CONVERSION,
            "composition": COMPOSITION,
            "rho_spent_by_partition": rho_by_partition,
            "rho_by_atom": {
                "warmup": loads.warmup,
                "vocabulary": loads.vocabulary,
                "stream_every_epoch": loads.stream_all,
                "stream_worst_epoch": loads.worst_epoch,
                "stream_worst_epoch_rho": loads.worst_stream,
            },
            "delta_of_approximate_events_by_atom": {"vocabulary": loads.vocabulary_delta,
                                                    "stream_worst": loads.stream_delta,
                                                    "warmup": loads.warmup_delta},
            "rho_worst_case": loads.worst,
            "worst_case_atom": loads.worst_atom,
            "epsilon_worst_case": epsilon_worst_case(loads, self.delta),
            "rho_remaining": max(0.0, self.rho_budget - loads.worst),
            "rho_remaining_by_atom": {
                "warmup": max(0.0, self.rho_limit(loads.warmup_delta) - loads.warmup),
                "vocabulary": max(0.0, self.vocabulary_rho_limit(loads.vocabulary_delta)
                                  - loads.vocabulary),
                "stream_worst_epoch": max(0.0, self.rho_limit(loads.stream_delta)
                                          - loads.worst_stream),
                "stream_new_epoch": max(0.0, self.rho_limit(loads.stream_delta)
                                        - loads.stream_all),
            },
            "reservations": reservations,
            "uncommitted": uncommitted,
            "refusals": refusals,
        }
