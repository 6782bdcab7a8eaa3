"""Per-document ρ and δ by atom: the exact sums behind the accountant's filter.

Documents are split by their own timestamp into disjoint atoms (the warm-up, the vocabulary
selection, each stream epoch); an event's partition says which atoms it covers. A document in
atom A loses the sum of ρ (and δ) over the events covering A; the worst document is the max
over atoms (:class:`LoadTally`, :func:`atom_loads`). Loads are summed exactly in fixed point
(every finite double is an integer multiple of 2^-1074) and rounded up once when reported;
:func:`epsilon_worst_case` converts them to ε. The filter that uses them:
:mod:`streamdp.privacy.accountant` (docs/privacy_accounting.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

from streamdp.privacy.conversions import zcdp_epsilon
from streamdp.privacy.events import (STREAM, VOCABULARY, WARMUP, GaussianEvent, Partition,
                                     parse_partition)

# Loads are summed exactly: every finite double is an integer multiple of
# 2^-1074, so ρ·2^1074 is an exact Python int and sums do not depend on event
# order or rounding; each reported value is rounded up to a float only once.
_SCALE_BITS = 1074


def _fixed(x: float) -> int:
    """x · 2^1074 exactly (x ≥ 0 finite)."""
    n, d = float(x).as_integer_ratio()
    return n << (_SCALE_BITS - (d.bit_length() - 1))


def _float_up(n: int) -> float:
    """Smallest float ≥ n · 2^-1074 (never under-reports a load)."""
    q = Fraction(n, 1 << _SCALE_BITS)
    f = float(q)
    return f if Fraction(f) >= q else math.nextafter(f, math.inf)


@dataclass(frozen=True)
class AtomLoads:
    """Per-document ρ by atom (exact sums, reported rounded up).

    Attributes
    ----------
    warmup : float          ρ of a warm-up document
    stream_all : float      ρ of events covering every stream epoch ("stream")
    worst_epoch : int|None  the stream epoch with the largest epoch-range load
    worst_epoch_extra : float  that epoch's ρ from "stream:epochs=…" events
    worst_stream : float    ρ of the worst stream document (stream_all + extra)
    worst : float           max over atoms = the per-document worst case
    worst_atom : str        which atom attains it
    vocabulary : float      ρ of a vocabulary-selection document
    vocabulary_delta : float  Σ δ of the approximate events on that atom (rounded up)
    stream_delta : float    the largest Σ δ of approximate events on one stream atom (rounded up)
    warmup_delta : float    Σ δ of the approximate events on the warm-up atom (rounded up)
    """

    warmup: float
    stream_all: float
    worst_epoch: int | None
    worst_epoch_extra: float
    worst_stream: float
    worst: float
    worst_atom: str
    vocabulary: float = 0.0
    vocabulary_delta: float = 0.0
    stream_delta: float = 0.0
    warmup_delta: float = 0.0


class LoadTally:
    """Running exact per-atom sums of (partition, ρ) spends.

    ``add`` is O(1); ``loads`` sweeps the epoch-range endpoints, O(E log E)
    for E distinct endpoints (about two per tree node), so an accountant can
    keep one tally and fold in only new ledger records.
    """

    def __init__(self) -> None:
        self.warm = 0
        self.all = 0
        self.delta: dict[int, int] = {}          # epoch → change of range coverage there
        self.vocab = 0
        self.vocab_delta = 0                      # Σ δ of approximate events (fixed point)
        self.warm_delta = 0                       # Σ δ of approximate "warmup" events
        self.all_delta = 0                        # Σ δ of approximate "stream" events
        self.range_delta: dict[int, int] = {}     # epoch → change of range δ coverage there

    def copy(self) -> "LoadTally":
        out = LoadTally()
        out.warm, out.all, out.delta = self.warm, self.all, dict(self.delta)
        out.vocab, out.vocab_delta = self.vocab, self.vocab_delta
        out.warm_delta = self.warm_delta
        out.all_delta, out.range_delta = self.all_delta, dict(self.range_delta)
        return out

    def add(self, part: Partition, rho: float, delta: float = 0.0) -> None:
        r = _fixed(rho)
        dl = _fixed(delta) if delta else 0
        if part.kind == VOCABULARY:
            self.vocab += r
            self.vocab_delta += dl
        elif part.kind == WARMUP:
            self.warm += r
            self.warm_delta += dl
        elif part.epochs is None:
            self.all += r
            self.all_delta += dl
        else:
            a, b = part.epochs
            self.delta[a] = self.delta.get(a, 0) + r
            self.delta[b + 1] = self.delta.get(b + 1, 0) - r
            if dl:
                self.range_delta[a] = self.range_delta.get(a, 0) + dl
                self.range_delta[b + 1] = self.range_delta.get(b + 1, 0) - dl

    def atom(self, *, warmup: bool = False, epoch: int | None = None,
             vocabulary: bool = False) -> float:
        """ρ of a warm-up document, of a vocabulary-selection document, of a document in
        stream ``epoch``, or (none of them) of a stream document in an epoch no range covers."""
        if vocabulary:
            return _float_up(self.vocab)
        if warmup:
            return _float_up(self.warm)
        extra = 0 if epoch is None else sum(v for pos, v in self.delta.items() if pos <= epoch)
        return _float_up(self.all + extra)

    def loads(self) -> AtomLoads:
        best, best_epoch, run = 0, None, 0
        for pos in sorted(self.delta):
            run += self.delta[pos]                 # coverage of epochs [pos, next pos)
            if run > best:
                best, best_epoch = run, pos
        stream = self.all + best
        if self.warm >= stream:
            worst, atom = self.warm, WARMUP
        elif best_epoch is None:
            worst, atom = stream, f"{STREAM} (every epoch)"
        else:
            worst, atom = stream, f"{STREAM} epoch {best_epoch}"
        if self.vocab > worst:
            worst, atom = self.vocab, VOCABULARY
        best_delta, run = 0, 0
        for pos in sorted(self.range_delta):
            run += self.range_delta[pos]
            best_delta = max(best_delta, run)
        return AtomLoads(warmup=_float_up(self.warm), stream_all=_float_up(self.all),
                         worst_epoch=best_epoch, worst_epoch_extra=_float_up(best),
                         worst_stream=_float_up(stream), worst=_float_up(worst),
                         worst_atom=atom, vocabulary=_float_up(self.vocab),
                         vocabulary_delta=_float_up(self.vocab_delta),
                         stream_delta=_float_up(self.all_delta + best_delta),
                         warmup_delta=_float_up(self.warm_delta))


def atom_loads(items: Iterable[tuple]) -> AtomLoads:
    """Per-document worst-case ρ of a multiset of (partition, ρ) or (partition, ρ, δ) spends.

    A document in atom A (the warm-up, or stream epoch e) loses the sum of ρ
    over spends whose partition covers A; the result is the max over atoms.
    Epochs covered by no range carry the "stream" spends only.
    """
    tally = LoadTally()
    for item in items:
        tally.add(*item)
    return tally.loads()


def events_loads(events: Iterable[GaussianEvent]) -> AtomLoads:
    """:func:`atom_loads` of GaussianEvents (partitions parsed strictly)."""
    return atom_loads((parse_partition(e.partition), e.rho, e.delta) for e in events)


def delta_left(delta: float, used: float) -> float:
    """δ − used, rounded down (a conversion must never get more δ than is left)."""
    rest = delta - used
    if used > 0 and Fraction(rest) > Fraction(delta) - Fraction(used):
        rest = math.nextafter(rest, -math.inf)
    return rest


def epsilon_worst_case(loads: AtomLoads, delta: float) -> float:
    """ε of the worst-off document at total δ: an atom with approximate events converts with
    δ − its δ sum (the stream atoms, conservatively, all with the worst stream δ)."""
    def conv(rho: float, used: float) -> float:
        if rho <= 0:
            return 0.0
        rest = delta_left(delta, used)
        return zcdp_epsilon(rho, rest) if rest > 0 else math.inf
    eps = max(conv(loads.warmup, loads.warmup_delta),
              conv(loads.worst_stream, loads.stream_delta))
    if loads.vocabulary > 0:
        eps = max(eps, conv(loads.vocabulary, loads.vocabulary_delta))
    if loads.warmup > 0 or loads.worst_stream > 0 or loads.vocabulary > 0:
        return eps
    return zcdp_epsilon(loads.worst, delta)
