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
as the documents (it holds per-user counts). Per-epoch counts expire when the epoch closes
(:meth:`UserBounder.close_through`); lifetime counts never expire (a saturated user must stay
saturated over the whole horizon).

**Admission** (issue 23 item 2; docs/privacy.md, "Admission: all users or the first K"). By
default (``max_users=None``) every user is admitted and the state grows with the distinct users
(≈ 400 bytes each; operators watch ``streamdp_user_bounder_users``). A finite
``max_users = K`` opts into **first-K admission**: a user's documents count iff the user was
among the first K distinct users this bounder numbered; a later user's documents get weight 0
and the user is not stored (never a halt, never an eviction: evicting would restart a user's
numbering at j = 1). Adding one user then changes the sums by that user *and* at most one
displaced user (the K-th, pushed out), so under first-K every weight — and the clip
histogram's count — is multiplied by :data:`FIRST_K_SHARE` = 1/2: a user's total is ≤ 1/2, the
pair's ≤ 1, and the planned sensitivities Δ_b stay valid unchanged (equivalent, in signal to
noise, to doubling every Δ_b; done here so the rule lives in one place).
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
from typing import Iterable

import numpy as np

SCHEDULES = ("uniform", "decaying")
#: distinct users per bounder by default: None, every user is admitted (memory ≈ 400 bytes per
#: user in CPython, measured with one open epoch); a finite K opts into first-K admission
DEFAULT_MAX_USERS = None
#: the factor on every weight (and clip-histogram count) under first-K admission: a user and the
#: one user it can displace together move a sum by ≤ C_b (module docstring)
FIRST_K_SHARE = 0.5
ADMIT_ALL = "all"
ADMIT_FIRST_K = "first-K"
#: the epoch of every document when there are no epochs (one-shot streams, the warm-up)
NO_EPOCH = 0
#: v2: ``max_users`` may be None and means the admission rule (v1: a fail-closed memory cap,
#: every stored user admitted at full weight: read as admit-all)
_STATE_VERSION = 2


class MissingUser(ValueError):
    """A document without a user id in user mode (it cannot be bounded)."""


def check_positive_int(name: str, v, minimum: int = 1) -> int:
    """``v`` as an int ≥ ``minimum`` (bools refused), else ValueError naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def check_max_users(v) -> int | None:
    """``max_users``: None (admit every user) or an integer K >= 1 (first-K admission)."""
    return None if v is None else check_positive_int("max_users", v)


def admission(max_users: int | None) -> str:
    """The admission rule of a ``max_users`` setting: :data:`ADMIT_ALL` or :data:`ADMIT_FIRST_K`."""
    return ADMIT_ALL if check_max_users(max_users) is None else ADMIT_FIRST_K


def admission_share(max_users: int | None) -> float:
    """THE factor on every user weight: 1 when every user is admitted, :data:`FIRST_K_SHARE`
    under first-K admission (a user plus one displaced user, docs/privacy.md)."""
    return 1.0 if admission(max_users) == ADMIT_ALL else FIRST_K_SHARE


def weight_schedule(schedule: str, max_docs: int) -> np.ndarray:
    """The public weights w_1 … w_M (float64) with math.fsum(w) ≤ 1 exactly.

    ``uniform``: w_j = 1/M. ``decaying``: w_j ∝ 1/j², normalised over j ≤ M — a user with
    one document keeps weight 1/H₂(M) ≥ 0.6 instead of 1/M (under a Zipf law most users have
    few documents).
    """
    M = check_positive_int("max_docs", max_docs)
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
    n = check_positive_int("n_partitions", n_partitions)
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
    max_users : int or None    None: admit every user; K: first-K admission (weights × 1/2)
    key : bytes, optional      key of the user-id hash (random by default; kept in the state)
    """

    def __init__(self, *, max_docs_per_epoch: int, max_docs: int, schedule: str = "uniform",
                 max_users: int | None = DEFAULT_MAX_USERS, key: bytes | None = None) -> None:
        self.max_docs_per_epoch = check_positive_int("max_docs_per_epoch", max_docs_per_epoch)
        self.max_docs = check_positive_int("max_docs", max_docs)
        self.schedule = schedule
        self.weights_table = weight_schedule(schedule, self.max_docs)
        self.max_users = check_max_users(max_users)
        self.key = os.urandom(16) if key is None else bytes(key)
        if not 1 <= len(self.key) <= 64:
            raise ValueError("the user-hash key must be 1 to 64 bytes")
        # hash → [kept so far, {epoch: kept in that epoch}]
        self._users: dict[bytes, list] = {}
        #: documents of users not admitted (first-K), since this object was made: operator
        #: metrics only (not state, never in a snapshot)
        self.not_admitted = 0
        #: per document of the last :meth:`assign`: False where its user was not admitted
        self.last_admitted = np.ones(0, dtype=bool)

    @property
    def admission(self) -> str:
        return admission(self.max_users)

    @property
    def share(self) -> float:
        """The factor on every weight (:func:`admission_share`)."""
        return admission_share(self.max_users)

    @property
    def n_users(self) -> int:
        return len(self._users)

    def config(self) -> dict:
        """The public part (what a privacy report states)."""
        return {"max_docs_per_user_epoch": self.max_docs_per_epoch,
                "max_docs_per_user": self.max_docs, "weights": self.schedule,
                "weight_sum": math.fsum(self.weights_table) * self.share,
                "max_users": self.max_users, "user_admission": self.admission_text()}

    def admission_text(self) -> str:
        if self.admission == ADMIT_ALL:
            return "all users"
        return (f"first-K: the first {self.max_users} distinct users of each partition's "
                f"sequence; weights x{FIRST_K_SHARE} (a user plus one displaced user move a sum "
                "by <= C_b; equivalent to sensitivity x2)")

    def _hash(self, user: bytes) -> bytes:
        return hashlib.blake2b(user, digest_size=16, key=self.key).digest()

    def assign(self, users: Iterable, epochs=None) -> tuple[np.ndarray, np.ndarray]:
        """Weights and ranks of a batch of documents, in order, updating the counters.

        ``users``: one id per document; ``epochs``: one epoch per document (None: all
        :data:`NO_EPOCH`). Returns ``(weights, ranks)``: rank j ≥ 1 is the document's number
        among its user's kept documents, 0 for a document that gets weight 0 (over m or M, or
        its user not admitted: first-K, :attr:`not_admitted` counts those). Weights include
        :attr:`share`. Raises :class:`MissingUser` before changing anything.
        """
        hashes = [self._hash(_normalise_user(u)) for u in users]
        n = len(hashes)
        if epochs is None:
            ep = np.full(n, NO_EPOCH, dtype=np.int64)
        else:
            ep = np.asarray(epochs).astype(np.int64).ravel()
            if ep.shape[0] != n:
                raise ValueError(f"{n} documents but {ep.shape[0]} epochs")
        weights = np.zeros(n)
        ranks = np.zeros(n, dtype=np.int64)
        m, M, table = self.max_docs_per_epoch, self.max_docs, self.weights_table * self.share
        cap = math.inf if self.max_users is None else self.max_users
        admitted = np.ones(n, dtype=bool)
        for i, (h, e) in enumerate(zip(hashes, ep.tolist())):
            st = self._users.get(h)
            if st is None:
                if len(self._users) >= cap:
                    # first-K: admitted users are never forgotten, so the admitted set is the
                    # first K distinct users of this sequence; nothing of this user is stored
                    self.not_admitted += 1
                    admitted[i] = False
                    continue
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
        self.last_admitted = admitted
        return weights, ranks

    def check_users(self, users: Iterable) -> None:
        """Raise :class:`MissingUser` if :meth:`assign` of ``users`` would; changes nothing.
        For callers that update several bounders at once."""
        for u in users:
            _normalise_user(u)

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
        if obj.get("kind") != "user_bounder" or obj.get("v") not in (1, _STATE_VERSION):
            raise ValueError(f"not a user bounder state (v1 or v{_STATE_VERSION}): "
                             f"{obj.get('kind')!r} v{obj.get('v')!r}")
        # v1's max_users was a fail-closed cap: every user it stored was admitted at full weight
        out = cls(max_docs_per_epoch=obj["max_docs_per_epoch"], max_docs=obj["max_docs"],
                  schedule=obj["schedule"],
                  max_users=obj["max_users"] if obj["v"] == _STATE_VERSION else None,
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
        if out.max_users is not None and len(out._users) > out.max_users:
            raise ValueError("user bounder state holds more users than its max_users")
        return out

    def check_compatible(self, *, max_docs_per_epoch: int, max_docs: int, schedule: str,
                         max_users: int | None = None) -> None:
        """A restored state must be used with the configuration it was built under (m, M, the
        schedule and the admission rule with its K: changing K or switching between all and
        first-K mid-stream would move users in or out of sums already partly released)."""
        if (max_docs_per_epoch, max_docs, schedule, max_users) != (
                self.max_docs_per_epoch, self.max_docs, self.schedule, self.max_users):
            raise ValueError(
                f"the user bounder state was built with m={self.max_docs_per_epoch}, "
                f"M={self.max_docs}, weights={self.schedule!r}, max_users={self.max_users!r}; "
                f"configured m={max_docs_per_epoch}, M={max_docs}, weights={schedule!r}, "
                f"max_users={max_users!r}: the bounding cannot change mid-stream")
