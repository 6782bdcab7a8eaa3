"""Binary tree mechanism for continual release (Dwork–Naor–Pitassi–Rothblum 2010;
Chan–Shi–Song 2011).

The stream is cut into epochs t = 1, 2, …, T (T = ``horizon``) by document
timestamp. Epoch sums are the leaves of a binary tree; node (ℓ, j) at level ℓ
covers epochs [(j−1)·2^ℓ + 1, j·2^ℓ] and is *complete* at epoch j·2^ℓ. Each node
is noised exactly once, when it completes, and the release at epoch t is the
sum of the noised nodes of the binary decomposition of t — one per set bit of
t, so at most ⌊log2 t⌋ + 1 nodes, and its noise variance is popcount(t)·σ² per
coordinate (σ² for the node mechanism's noise).

Accounting
----------
Only nodes that complete within the horizon are ever noised: levels
ℓ = 0 … ⌊log2 T⌋, so a document (one epoch) is in at most
depth = ⌊log2 T⌋ + 1 noised nodes and costs depth·ρ_node over all T releases
together. Each node is reserved as events with partition
``"stream:epochs=a-b"`` (its epoch range), so the :class:`Accountant` computes
exactly this (max over epochs of the ρ of nodes covering it). Past the horizon
:meth:`TreeAggregator.add_epoch` raises :class:`HorizonExceeded`: a longer
stream needs a new tree (a new, separately budgeted, partition of epochs).

Order of operations at each epoch (atomic per epoch)
----------------------------------------------------
1. ``mechanism.plan(partition)`` for every node completing now → events;
2. one ``spender.reserve(all those events)`` — if it raises (e.g.
   ``BudgetExhausted``) the aggregator is unchanged and the epoch is not closed;
3. ``mechanism.privatize(raw node sum, its events)`` for each node;
4. state update (raw sums of completed nodes dropped); 2-3 plus the commit
   are :func:`streamdp.privacy.spend.spend`, the one spend protocol.
A crash or exception after 2 leaves the reservation counted (safe). The
reservation's label ``f"{label}:epoch={t}"`` names exactly the nodes completing
at t, so it serves as the idempotency key of the spend protocol
(:mod:`streamdp.privacy.spend`): with a :class:`SpendSession` as spender, the
commit is deferred until the caller has persisted the noised nodes, and a tree
restored from an older state re-closing epoch t fulfils the uncommitted
reservation instead of charging it again.

Raw state
---------
The raw epoch value is dropped once it has been added to the partial sums. A
raw (un-noised, sensitive) partial sum is kept only for each *incomplete* node
that will complete within the horizon: at most one per level ≥ 1, i.e. ≤
⌊log2 T⌋ values. These partials are in :meth:`state_dict` too: checkpoints are
sensitive and must be protected like raw data. Noised nodes are DP outputs; only
the latest noised node per level is kept (enough for every future release),
unless ``keep_history`` is set.

Values are treated as immutable: the aggregator combines them with ``+`` only
and never mutates them; callers must not mutate a value after passing it in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar

import numpy as np

from streamdp.privacy.events import BudgetSpender, EventLog, GaussianEvent, epoch_partition
from streamdp.privacy.noise import GaussianSampler
from streamdp.privacy.spend import Codec, spend

V = TypeVar("V")

SCHEMA_VERSION = 1


class HorizonExceeded(RuntimeError):
    """An epoch past the tree's horizon T was added; nothing was spent."""


class NodeMechanism(Protocol[V]):
    """How one tree node is privatised.

    ``plan(partition)`` returns the events noising one node will cost, every
    one with ``partition`` set to the given string (checked); ``privatize``
    returns the noised value and must draw exactly the planned noise.
    Keeping the two apart lets the aggregator reserve before any draw.
    """

    def plan(self, partition: str) -> Sequence[GaussianEvent]: ...

    def privatize(self, value: V, events: Sequence[GaussianEvent]) -> V: ...


@dataclass(frozen=True)
class GaussianNodeMechanism:
    """Gaussian noise N(0, σ²) on every coordinate of an array node.

    Attributes
    ----------
    sensitivity : float   L2 sensitivity Δ of one node (the per-document clip bound)
    sigma : float         noise standard deviation σ
    sampler : GaussianSampler
    block : str           event label
    mechanism : str       event mechanism tag
    """

    sensitivity: float
    sigma: float
    sampler: GaussianSampler
    block: str = "tree_node"
    mechanism: str = "tensor"

    def plan(self, partition: str) -> tuple[GaussianEvent, ...]:
        return (GaussianEvent(self.block, self.sensitivity, self.sigma,
                              partition=partition, mechanism=self.mechanism),)

    def privatize(self, value: np.ndarray, events: Sequence[GaussianEvent]) -> np.ndarray:
        value = np.asarray(value, dtype=np.float64)
        return self.sampler.add_noise(value, self.sigma)


def tree_depth(horizon: int) -> int:
    """Number of levels, ⌊log2 T⌋ + 1: the most nodes any one epoch is in."""
    if not (isinstance(horizon, (int, np.integer)) and horizon >= 1):
        raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
    return int(horizon).bit_length()


def node_range(level: int, end: int) -> tuple[int, int]:
    """Epoch range (first, last) of the level-``level`` node ending at ``end``."""
    return end - (1 << level) + 1, end


def completing_levels(t: int, horizon: int) -> list[int]:
    """Levels of the nodes that complete at epoch t (0 … trailing zeros of t)."""
    top = tree_depth(horizon) - 1
    out, level = [], 0
    while level <= top and t % (1 << level) == 0:
        out.append(level)
        level += 1
    return out


def covering_levels(t: int) -> list[int]:
    """Levels of the nodes whose sum is the prefix [1, t]: the set bits of t, high first."""
    return [lv for lv in range(int(t).bit_length() - 1, -1, -1) if (t >> lv) & 1]


class TreeAggregator(Generic[V]):
    """Continual release of prefix sums Σ_{s≤t} x_s with the binary tree mechanism.

    Parameters
    ----------
    horizon : int
        T, the last epoch this tree may close (fixes depth = ⌊log2 T⌋ + 1).
    mechanism : NodeMechanism
        Plans and draws the noise for one node (e.g. :class:`GaussianNodeMechanism`,
        or one covering all blocks of a sketch).
    spender : BudgetSpender, optional
        Where nodes are reserved before noising (an :class:`Accountant`);
        defaults to an :class:`EventLog` that records and enforces nothing.
    label : str
        Prefix of reservation labels (``f"{label}:epoch={t}"``).
    codec : Codec, optional
        Encodes the list of noised nodes of an epoch for a spend session's
        output store (default: arrays).
    keep_history : bool
        Keep every noised node so :meth:`release` can answer any past t
        (memory O(T) values); otherwise only the latest node per level.
    """

    def __init__(self, horizon: int, mechanism: NodeMechanism[V],
                 spender: BudgetSpender | None = None, *, label: str = "tree",
                 keep_history: bool = False, codec: Codec | None = None) -> None:
        self.horizon = int(horizon)
        self.depth = tree_depth(horizon)
        self.mechanism = mechanism
        self.spender: BudgetSpender = spender if spender is not None else EventLog()
        self.label = label
        self.keep_history = bool(keep_history)
        self.codec = codec      # how an output store persists a list of noised nodes
        self.epoch = 0                                     # epochs closed so far
        self._raw: dict[int, V] = {}                       # level ≥ 1 → raw partial sum
        self._latest: dict[int, tuple[int, int, V]] = {}   # level → (first, last, noised)
        self._history: dict[tuple[int, int], V] = {}

    # ------------------------------------------------------------- planning
    def node_events(self, first: int, last: int) -> tuple[GaussianEvent, ...]:
        """Planned events of node [first, last], partition-checked."""
        part = epoch_partition(first, last)
        events = tuple(self.mechanism.plan(part))
        if not events:
            raise ValueError("mechanism.plan() returned no events: a node must cost something")
        for e in events:
            if not isinstance(e, GaussianEvent) or e.partition != part:
                raise ValueError(f"mechanism.plan({part!r}) returned {e!r}: every event must be "
                                 f"a GaussianEvent with partition {part!r}")
        return events

    def planned_events(self) -> list[GaussianEvent]:
        """Every event the tree will reserve over epochs 1 … T (for budget planning)."""
        out: list[GaussianEvent] = []
        for t in range(1, self.horizon + 1):
            for level in completing_levels(t, self.horizon):
                out.extend(self.node_events(*node_range(level, t)))
        return out

    def rho_per_document(self) -> float:
        """depth · ρ_node: what one document costs over the whole horizon."""
        return self.depth * sum(e.rho for e in self.node_events(1, 1))

    # ------------------------------------------------------------- updating
    @property
    def raw_partials(self) -> int:
        """How many raw (un-noised) partial sums are held (≤ depth − 1)."""
        return len(self._raw)

    def raw_partial(self, level: int) -> V | None:
        """The raw (un-noised) partial sum held for ``level`` ≥ 1, or None if none is held."""
        return self._raw.get(level)

    def empty_raw_partial(self, level: int, empty: V) -> None:
        """Replace the raw partial held for ``level`` by ``empty`` (a zero sum), so that its node
        is drawn from noise only (a failed premise check); a level holding none is left so."""
        if level in self._raw:
            self._raw[level] = empty

    def add_epoch(self, value: V) -> V:
        """Close epoch t = self.epoch + 1 with its raw sum ``value``; return the release for [1, t].

        Raises :class:`HorizonExceeded` past the horizon and whatever the
        spender raises (e.g. ``BudgetExhausted``); in both cases nothing changes.
        """
        t = self.epoch + 1
        if t > self.horizon:
            raise HorizonExceeded(
                f"{self.label}: epoch {t} is past the tree's horizon T={self.horizon} "
                f"(depth {self.depth}); its accounting only covers epochs 1..{self.horizon}. "
                "Start a new tree, budgeted separately, for later epochs.")
        top = self.depth - 1
        # Raw partial sums after this epoch, for levels ≥ 1 whose current node
        # completes within the horizon (others would never be released).
        raw: dict[int, V] = {}
        for level in range(1, top + 1):
            end = (((t - 1) >> level) + 1) << level   # node of t at this level
            if end <= self.horizon:
                prev = self._raw.get(level)
                raw[level] = value if prev is None else prev + value
        done = completing_levels(t, self.horizon)
        nodes = [(level, *node_range(level, t), value if level == 0 else raw[level])
                 for level in done]
        plans = [self.node_events(a, b) for _, a, b, _ in nodes]
        # the spend protocol (streamdp.privacy.spend): reserve → draw → persist → commit
        values = spend(self.spender, [e for p in plans for e in p], label=f"{self.label}:epoch={t}",
                       draw=lambda: [self.mechanism.privatize(v, ev)
                                     for (_, _, _, v), ev in zip(nodes, plans)],
                       codec=self.codec)
        noised = [(level, a, b, nv) for (level, a, b, _), nv in zip(nodes, values)]
        for level, a, b, nv in noised:
            raw.pop(level, None)                 # raw sum of a noised node: dropped
            self._latest[level] = (a, b, nv)
            if self.keep_history:
                self._history[(a, b)] = nv
        self._raw = raw
        self.epoch = t
        return self.prefix()

    # ------------------------------------------------------------- releasing
    def covering_nodes(self, t: int) -> list[tuple[int, int]]:
        """Epoch ranges of the noised nodes summed for the release at t."""
        out, start = [], 1
        for level in covering_levels(t):
            out.append((start, start + (1 << level) - 1))
            start += 1 << level
        return out

    def prefix(self) -> V:
        """The current release: noised Σ_{s≤t} x_s for t = self.epoch."""
        if self.epoch == 0:
            raise ValueError(f"{self.label}: no epoch closed yet")
        total = None
        for level in covering_levels(self.epoch):
            a, b, nv = self._latest[level]
            assert b == (self.epoch >> level) << level   # latest node ends where t's bit says
            total = nv if total is None else total + nv
        return total

    def release(self, t: int) -> V:
        """The release at a past epoch t (needs ``keep_history`` unless t is current)."""
        if not 1 <= t <= self.epoch:
            raise ValueError(f"{self.label}: epoch {t} not released yet (current {self.epoch})")
        if t == self.epoch:
            return self.prefix()
        if not self.keep_history:
            raise ValueError(f"{self.label}: past releases need keep_history=True")
        total = None
        for a, b in self.covering_nodes(t):
            nv = self._history[(a, b)]
            total = nv if total is None else total + nv
        return total

    # ------------------------------------------------------------- checkpoint
    def state_dict(self, encode: Callable[[V], Any]) -> dict:
        """msgpack-friendly checkpoint (str keys, lists, ``encode(value)`` leaves).

        Contains raw partial sums: sensitive, protect like raw data.
        """
        return {
            "kind": "tree_aggregator", "v": SCHEMA_VERSION,
            "horizon": self.horizon, "epoch": self.epoch, "label": self.label,
            "keep_history": self.keep_history,
            "raw": [[level, encode(v)] for level, v in sorted(self._raw.items())],
            "latest": [[level, a, b, encode(v)] for level, (a, b, v) in sorted(self._latest.items())],
            "history": [[a, b, encode(v)] for (a, b), v in sorted(self._history.items())],
        }

    @classmethod
    def from_state(cls, state: dict, decode: Callable[[Any], V], mechanism: NodeMechanism[V],
                   spender: BudgetSpender | None = None, *,
                   codec: Codec | None = None) -> "TreeAggregator[V]":
        """Rebuild from :meth:`state_dict` (mechanism, spender and codec are not serialised)."""
        if state.get("kind") != "tree_aggregator" or state.get("v") != SCHEMA_VERSION:
            raise ValueError(f"not a v{SCHEMA_VERSION} tree_aggregator state: "
                             f"{state.get('kind')!r} v{state.get('v')!r}")
        out = cls(int(state["horizon"]), mechanism, spender, label=str(state["label"]),
                  keep_history=bool(state["keep_history"]), codec=codec)
        out.epoch = int(state["epoch"])
        if not 0 <= out.epoch <= out.horizon:
            raise ValueError(f"tree state: epoch {out.epoch} outside 0..{out.horizon}")
        out._raw = {int(level): decode(v) for level, v in state["raw"]}
        out._latest = {int(level): (int(a), int(b), decode(v)) for level, a, b, v in state["latest"]}
        out._history = {(int(a), int(b)): decode(v) for a, b, v in state["history"]}
        if any(level not in out._latest for level in covering_levels(out.epoch)):
            raise ValueError("tree state: missing noised nodes for the current release")
        return out
