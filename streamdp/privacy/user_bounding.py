"""User-level contribution bounding: per-document weights that depend only on the user's own
documents (issue 16; proof in docs/privacy.md, "The user-level unit").

Unit: one user, i.e. every document carrying the same user id. Each user's documents are
numbered in their arrival order (a user is keyed to one Kafka partition, so that order is fixed
by the user's own documents; in the estimator: row order). A document is *kept* while its
user has fewer than ``max_docs_per_epoch`` kept documents in the document's epoch and fewer
than ``max_docs`` kept documents overall; the j-th kept document of a user gets the weight
w_j of a public schedule with Σ_j w_j ≤ 1 (in float64, checked), every other document 0.

Why that is enough: every block's per-document contribution is clipped to C_b before it is
weighted, so a user's total contribution to block b is ≤ Σ_j w_j·C_b ≤ C_b — the document-level
sensitivity, with the unit relabelled. The weight of a document is a function of its user's
own earlier documents (and of public configuration) only: adding or removing one user changes
no other user's weights.

State: per user, a keyed hash of the id (BLAKE2b-128 under a random key kept in the state), the
number of kept documents and the kept counts of the user's open epochs. The state is as secret
as the documents (it holds per-user counts). It is bounded by ``max_users`` distinct users:
when one more user would be needed the bounder **fails closed** (:class:`UserCapacityExceeded`,
nothing changed) instead of evicting, merging or approximating users. Evicting a user would
reset its numbering to j = 1 (its weights could sum to more than 1); a shared approximate
counter (count-min sketch) would let one user's documents change another user's counts, hence
weights, which breaks the neighbouring argument. Per-epoch counts expire when the epoch closes
(:meth:`UserBounder.close_through`); lifetime counts never expire (a saturated user must stay
saturated over the whole horizon).
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
from typing import Iterable

import numpy as np

SCHEDULES = ("uniform", "decaying")
#: distinct users kept in memory by default (≈ 400 bytes each in CPython, measured with one
#: open epoch: ≈ 0.4 GB)
DEFAULT_MAX_USERS = 1_000_000
#: the epoch of every document when there are no epochs (one-shot streams, the warm-up)
NO_EPOCH = 0
_STATE_VERSION = 1


class UserCapacityExceeded(RuntimeError):
    """More distinct users than the configured ``max_users``: the bounder refuses (fails
    closed) rather than forget or merge users, which could raise the sensitivity."""


class MissingUser(ValueError):
    """A document without a user id in user mode (it cannot be bounded)."""


def _check_int(name: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def weight_schedule(schedule: str, max_docs: int) -> np.ndarray:
    """The public weights w_1 … w_M (float64) with math.fsum(w) ≤ 1 exactly.

    ``uniform``: w_j = 1/M. ``decaying``: w_j ∝ 1/j², normalised over j ≤ M — a user with
    one document keeps weight 1/H₂(M) ≥ 0.6 instead of 1/M (under a Zipf law most users have
    few documents).
    """
    M = _check_int("max_docs", max_docs)
    if schedule == "uniform":
        base = np.ones(M)
    elif schedule == "decaying":
        base = 1.0 / np.arange(1, M + 1, dtype=np.float64) ** 2
    else:
        raise ValueError(f"user weight schedule must be one of {SCHEDULES}, got {schedule!r}")
    w = base / math.fsum(base)
    # the float weights must not sum to more than 1 (each division rounds): shrink until they
    # do; the contribution bound Σ_j w_j·C_b ≤ C_b needs it exactly
    while math.fsum(w) > 1.0:
        w = w * (1.0 - 2.0 ** -50)
    return w


def _normalise_user(u) -> bytes:
    if u is None or (isinstance(u, float) and math.isnan(u)):
        raise MissingUser("a document has no user id: in user mode every document needs one "
                          "(the producer assigns it)")
    if isinstance(u, bytes):
        b = u
    elif isinstance(u, (str, numbers.Integral)) and not isinstance(u, bool):
        b = str(u).encode("utf-8")
    else:
        raise MissingUser(f"user ids must be strings, bytes or integers, got {type(u).__name__}")
    if not b:
        raise MissingUser("a document has an empty user id: in user mode every document "
                          "needs one")
    return b


def partition_for_user(user, n_partitions: int) -> int:
    """THE rule that puts a user's documents on one partition of the documents topic.

    ``BLAKE2b-64(user id as UTF-8) mod n_partitions``: unkeyed and public (the producer and
    every sketcher compute it), stable across processes, machines and library versions
    (unlike Python's ``hash``, or a client's default partitioner, which differ between
    librdkafka and the Java client). ``streamdp produce`` sets each record's partition with
    it; a sketcher in user mode dead-letters a document read from any other partition
    (``user_partition_mismatch``): a user split over P partitions would get P weight
    sequences, total weight up to P (docs/privacy.md, "The user-level unit in the services").
    """
    n = _check_int("n_partitions", n_partitions)
    digest = hashlib.blake2b(_normalise_user(user), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n


def bounding_report(bounder: "UserBounder") -> dict:
    """What a privacy report says about the bounding (estimator and release service alike)."""
    return {**bounder.config(),
            "warmup": "own weight sequence, charged to the stream partition (sequential "
                      "composition)",
            "clip_histogram": "each user's first warm-up document"}


class UserBounder:
    """Assigns each document its user-level weight, in arrival order (module docstring).

    Parameters
    ----------
    max_docs_per_epoch : int   m: kept documents per user per epoch
    max_docs : int             M: kept documents per user over the whole horizon; the schedule
                               has M weights summing to ≤ 1
    schedule : {"uniform", "decaying"}
    max_users : int            memory cap on distinct users (fail closed beyond it)
    key : bytes, optional      key of the user-id hash (random by default; kept in the state)
    """

    def __init__(self, *, max_docs_per_epoch: int, max_docs: int, schedule: str = "uniform",
                 max_users: int = DEFAULT_MAX_USERS, key: bytes | None = None) -> None:
        self.max_docs_per_epoch = _check_int("max_docs_per_epoch", max_docs_per_epoch)
        self.max_docs = _check_int("max_docs", max_docs)
        self.schedule = schedule
        self.weights_table = weight_schedule(schedule, self.max_docs)
        self.max_users = _check_int("max_users", max_users)
        self.key = os.urandom(16) if key is None else bytes(key)
        if not 1 <= len(self.key) <= 64:
            raise ValueError("the user-hash key must be 1 to 64 bytes")
        # hash → [kept so far, {epoch: kept in that epoch}]
        self._users: dict[bytes, list] = {}

    @property
    def n_users(self) -> int:
        return len(self._users)

    def config(self) -> dict:
        """The public part (what a privacy report states)."""
        return {"max_docs_per_user_epoch": self.max_docs_per_epoch,
                "max_docs_per_user": self.max_docs, "weights": self.schedule,
                "weight_sum": math.fsum(self.weights_table), "max_users": self.max_users}

    def _hash(self, user: bytes) -> bytes:
        return hashlib.blake2b(user, digest_size=16, key=self.key).digest()

    def assign(self, users: Iterable, epochs=None) -> tuple[np.ndarray, np.ndarray]:
        """Weights and ranks of a batch of documents, in order, updating the counters.

        ``users``: one id per document; ``epochs``: one epoch per document (None: all
        :data:`NO_EPOCH`). Returns ``(weights, ranks)``: rank j ≥ 1 is the document's number
        among its user's kept documents, 0 for a document that gets weight 0.
        Raises :class:`MissingUser` or :class:`UserCapacityExceeded` before changing anything.
        """
        hashes = [self._hash(_normalise_user(u)) for u in users]
        n = len(hashes)
        if epochs is None:
            ep = np.full(n, NO_EPOCH, dtype=np.int64)
        else:
            ep = np.asarray(epochs).astype(np.int64).ravel()
            if ep.shape[0] != n:
                raise ValueError(f"{n} documents but {ep.shape[0]} epochs")
        self._check_room(hashes)
        weights = np.zeros(n)
        ranks = np.zeros(n, dtype=np.int64)
        m, M, table = self.max_docs_per_epoch, self.max_docs, self.weights_table
        for i, (h, e) in enumerate(zip(hashes, ep.tolist())):
            st = self._users.get(h)
            if st is None:
                st = self._users[h] = [0, {}]
            if st[0] >= M:
                continue
            in_epoch = st[1].get(e, 0)
            if in_epoch >= m:
                continue
            st[1][e] = in_epoch + 1
            st[0] += 1
            ranks[i] = st[0]
            weights[i] = table[st[0] - 1]
        return weights, ranks

    def _check_room(self, hashes) -> None:
        new = {h for h in hashes if h not in self._users}
        if len(self._users) + len(new) > self.max_users:
            raise UserCapacityExceeded(
                f"{len(self._users) + len(new)} distinct users would exceed max_users="
                f"{self.max_users}: the user-level bounder fails closed (forgetting or merging "
                "users could raise the sensitivity). Raise max_users (memory ≈ 400 bytes per "
                "user) or start a new stream with a new budget")

    def check_capacity(self, users: Iterable) -> None:
        """Raise :class:`UserCapacityExceeded` (or :class:`MissingUser`) if :meth:`assign` of
        ``users`` would; changes nothing. For callers that update several bounders at once."""
        self._check_room([self._hash(_normalise_user(u)) for u in users])

    def close_through(self, epoch: int) -> None:
        """Forget the per-epoch counts of epochs ≤ ``epoch`` (closed: no document of theirs is
        accepted any more). Lifetime counts stay."""
        for st in self._users.values():
            if st[1]:
                for e in [e for e in st[1] if e <= epoch]:
                    del st[1][e]

    # ---------------------------------------------------------------- state
    def to_dict(self) -> dict:
        """The whole state (secret: per-user counts), for checkpoints."""
        return {"kind": "user_bounder", "v": _STATE_VERSION, "key": self.key.hex(),
                "max_docs_per_epoch": self.max_docs_per_epoch, "max_docs": self.max_docs,
                "schedule": self.schedule, "max_users": self.max_users,
                "users": [[h.hex(), st[0], [[e, c] for e, c in sorted(st[1].items())]]
                          for h, st in self._users.items()]}

    @classmethod
    def from_dict(cls, obj: dict) -> "UserBounder":
        if obj.get("kind") != "user_bounder" or obj.get("v") != _STATE_VERSION:
            raise ValueError(f"not a user bounder state (v{_STATE_VERSION}): "
                             f"{obj.get('kind')!r} v{obj.get('v')!r}")
        out = cls(max_docs_per_epoch=obj["max_docs_per_epoch"], max_docs=obj["max_docs"],
                  schedule=obj["schedule"], max_users=obj["max_users"],
                  key=bytes.fromhex(obj["key"]))
        for h, total, per_epoch in obj["users"]:
            total = int(total)
            counts = {int(e): int(c) for e, c in per_epoch}
            if not (0 <= total <= out.max_docs and all(0 < c <= out.max_docs_per_epoch
                                                       for c in counts.values())
                    and sum(counts.values()) <= total):
                raise ValueError(f"user bounder state: inconsistent counts for one user "
                                 f"({total}, {counts})")
            out._users[bytes.fromhex(h)] = [total, counts]
        if len(out._users) > out.max_users:
            raise ValueError("user bounder state holds more users than its max_users")
        return out

    def check_compatible(self, *, max_docs_per_epoch: int, max_docs: int, schedule: str) -> None:
        """A restored state must be used with the configuration it was built under."""
        if (max_docs_per_epoch, max_docs, schedule) != (self.max_docs_per_epoch, self.max_docs,
                                                        self.schedule):
            raise ValueError(
                f"the user bounder state was built with m={self.max_docs_per_epoch}, "
                f"M={self.max_docs}, weights={self.schedule!r}; configured m={max_docs_per_epoch},"
                f" M={max_docs}, weights={schedule!r}: the bounding cannot change mid-stream")
