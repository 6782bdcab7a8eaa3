"""What a sketcher keeps for one input partition.

One :class:`PartitionState` per documents-topic partition. It is checkpointed as
one self-sufficient record (``streamdp.kafka.state_store``): the sketches *and*
the next input offset they cover, so restoring it and seeking there neither loses
nor double-counts a document.

The rule that routes documents (:class:`Routing`, the route codes, the record-time errors) is
:mod:`streamdp.services.routing`; this module re-exports its names.

Fencing (zombie sketchers): every checkpoint carries the writer's fencing token
(:func:`fencing_token`: the consumer-group generation in which the writer was
assigned the partition) and its ``next_offset``; :func:`select_state` is the one rule
that accepts or rejects a state record against the newest accepted one.
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from streamdp import messages
from streamdp import serialization as ser
from streamdp.documents import MIN_DOC_LENGTH
from streamdp.messages import InvalidMessage
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.epochs import WARMUP_EPOCH
from streamdp.privacy.user_bounding import UserBounder, partition_for_user
from streamdp.refinement import FoldInModels, RefinementSketch
from streamdp.services.dedup import CountedIds, SeenIds
from streamdp.services.vocabulary import SelectionHistogram
from streamdp.services.routing import (  # noqa: F401 (re-exported)
    FUTURE, LATE, SELECTION, Routing, effective_progress)
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["KIND", "VERSION", "PartitionState", "check_user", "fencing_token", "select_state",
           "state_key", "FUTURE", "LATE", "Routing", "SELECTION", "effective_progress"]

KIND = "partition_state"
#: v2: ``refine``, ``fence`` and ``dedup`` present (the ``users_*`` fields only in user
#: mode); v1 records are migrated (:func:`_state_v1_to_v2`)
VERSION = 2


@dataclass
class PartitionState:
    """Sketches and progress of one documents partition.

    Attributes
    ----------
    topic, partition      the input partition
    next_offset : int     first input offset NOT yet in the sketches
    progress : float      largest record timestamp consumed (seconds); -inf before any
    selection : object | None  the vocabulary-selection histogram of this partition's
                          selection-window documents (each one's clipped set of distinct
                          words; :mod:`streamdp.services.vocabulary`); None once the
                          vocabulary is published
    warmup : WarmupSketch | None       warm-up sums (None once the subspace is out)
    epochs : dict[int, WhitenedSketch] open stream epochs not yet released
    refine : dict[int, RefinementSketch] refinement sums (k × d) of the open epochs' documents,
                          each folded into the snapshot of its epoch − L (DESIGN §8,
                          :func:`streamdp.refinement.model_epoch_for`; absent for epochs ≤ L)
    closed_through : int  epochs the release service has closed (their sketches dropped)
    counters : dict       documents, tokens, unknown_tokens, late, empty, dlq (and
                          selection_documents once a selection document was counted)
    fence : int           fencing token of the writer (:func:`fencing_token`)
    users_warmup, users_stream : UserBounder | None
                          user mode (``privacy_unit: user``): the per-user counters of this
                          partition's warm-up and stream weight sequences (docs/privacy.md
                          "The user-level unit in the services"); None in document mode, and
                          the warm-up's once the warm-up is released
    users_expired_through : int  stream epochs whose per-user counts expired (the partition's
                          progress passed their close time: no document on time for them can
                          follow in this partition's log)
    seen_ids : CountedIds keyed hashes of the ids of the documents counted, by epoch within the
                          dedup window (:mod:`streamdp.services.dedup`: a later record with one
                          of them is a duplicate); checkpointed with the sketches, so a re-read
                          after a crash deduplicates exactly as the lost run did
    """

    topic: str
    partition: int
    next_offset: int = 0
    progress: float = -math.inf
    selection: object | None = None
    warmup: WarmupSketch | None = None
    epochs: dict[int, WhitenedSketch] = field(default_factory=dict)
    refine: dict[int, RefinementSketch] = field(default_factory=dict)
    closed_through: int = 0
    counters: dict[str, int] = field(default_factory=lambda: {
        "documents": 0, "warmup_documents": 0, "tokens": 0, "unknown_tokens": 0, "late": 0,
        "empty": 0, "dlq": 0})
    fence: int = 0
    users_warmup: UserBounder | None = None
    users_stream: UserBounder | None = None
    users_expired_through: int = 0
    seen_ids: CountedIds = field(default_factory=CountedIds)

    @property
    def key(self) -> str:
        return state_key(self.topic, self.partition)

    # ------------------------------------------------------------ user mode
    def bind_users(self, new_bounder, *, warmup_open: bool) -> None:
        """User mode: create this partition's bounders (``new_bounder()``: a fresh
        :class:`UserBounder` of the configuration) or check restored ones against the
        configuration (ValueError if m, M, the schedule or ``max_users`` changed).
        ``warmup_open``: False once the warm-up is released (its counters are not needed)."""
        ref = new_bounder()
        for name in ("users_warmup", "users_stream"):
            b = getattr(self, name)
            if b is None:
                if name == "users_stream" or warmup_open:
                    setattr(self, name, ref if name == "users_stream" else new_bounder())
                continue
            b.check_compatible(max_docs_per_epoch=ref.max_docs_per_epoch, max_docs=ref.max_docs,
                               schedule=ref.schedule, max_users=ref.max_users)
        if not warmup_open:
            self.users_warmup = None

    def _user_weights(self, users, user_routes) -> tuple[np.ndarray, np.ndarray]:
        """(weights, in_histogram) of a batch, in log order, updating the counters; raises
        MissingUser before any counter changes. ``in_histogram``: each user's first warm-up
        document's clip-histogram count (the bounder's share: 1, or 1/2 under first-K).

        Numbered: every document that its *own* route (``user_routes``: :meth:`Routing.route`
        of its ts and record time, before anything decided by timing — a closed epoch, a
        released warm-up, a held model) sends to the warm-up (warm-up sequence) or to stream
        epoch e (stream sequence, epoch e) — whether or not it is later dropped as late.
        A user's numbering is then a function of that user's own documents in this
        partition's log, never of batch boundaries, poll timing or other users."""
        users = list(users)
        own = np.asarray(user_routes)
        n = own.shape[0]
        if len(users) != n:
            raise ValueError(f"{n} documents but {len(users)} user ids")
        w = np.zeros(n)
        first = np.zeros(n)
        self.last_not_admitted = np.zeros(n, dtype=bool)
        warm = np.flatnonzero(own == WARMUP_EPOCH) if self.users_warmup is not None else np.zeros(0, int)
        stream = np.flatnonzero(own > self.users_expired_through)
        if self.users_stream is None:
            raise RuntimeError("user mode: bind_users() before adding documents")
        # both checks before either bounder changes (nothing changed on a missing id)
        if warm.size:
            self.users_warmup.check_users([users[i] for i in warm])
        self.users_stream.check_users([users[i] for i in stream])
        if warm.size:
            ww, ranks = self.users_warmup.assign([users[i] for i in warm])
            w[warm], first[warm] = ww, (ranks == 1) * self.users_warmup.share
            self.last_not_admitted[warm] = ~self.users_warmup.last_admitted
        if stream.size:
            w[stream], _ = self.users_stream.assign([users[i] for i in stream], own[stream])
            self.last_not_admitted[stream] = ~self.users_stream.last_admitted
        return w, first

    def users_tracked(self) -> int:
        """Distinct users held by this partition's bounders (memory: ≈ 400 bytes each)."""
        return sum(b.n_users for b in (self.users_warmup, self.users_stream) if b is not None)

    def expire_user_epochs(self, routing: "Routing") -> None:
        """Forget the per-user counts of the stream epochs whose close time this partition's
        progress has passed (a document on time for them can no longer follow in its log:
        record times are non-decreasing per partition). Lifetime counts stay."""
        if self.users_stream is None or self.progress == -math.inf:
            return
        e = self.users_expired_through
        while routing.close_time(e + 1) <= self.progress:
            e += 1
        if e > self.users_expired_through:
            self.users_stream.close_through(e)
            self.users_expired_through = e

    # ------------------------------------------------------------ updating
    def final_routes(self, routes: np.ndarray, subspace_known: bool) -> np.ndarray:
        """The routes :meth:`add` acts on: a document of an epoch this partition closed, of the
        selection window (a vocabulary exists to count over) or of a closed warm-up (the
        subspace is known and the warm-up sketch dropped) is LATE. A row with a final route
        ≥ 0 is *counted* (streamdp.services.dedup remembers its id)."""
        routes = np.where((routes > 0) & (routes <= self.closed_through), LATE, routes)
        routes = np.where(routes == SELECTION, LATE, routes)
        if self.warmup is None and subspace_known:
            routes = np.where(routes == WARMUP_EPOCH, LATE, routes)
        return routes

    def add(self, X: sp.csr_matrix, routes: np.ndarray, subspace: Subspace | None,
            clip: ClipBounds | None, warmup_factory,
            models: FoldInModels | None = None, *, users=None,
            user_routes: np.ndarray | None = None,
            refine_in_background: bool = False) -> dict[str, int]:
        """Add a validated batch routed by :meth:`Routing.route`; returns per-role counts.

        User mode (``users``: one id per row, ``user_routes``: each row's own route, see
        :meth:`_user_weights`): the rows are weighted by this partition's bounders before
        anything is routed, and each weight multiplies the document's clipped contribution to
        every sum (the sketches' ``weights=``, as ``StreamingSpectralLDA``); the clip histogram
        counts each user's first warm-up document only. ``out["not_admitted"]``: rows of users
        past the first ``max_users`` (first-K admission, weight 0; operator metrics only).

        ``refine_in_background``: fold each epoch's rows into its refinement sketch on a worker
        thread while this thread updates the epoch's whitened sketch (the fold-in kernel, the
        sparse products and the compensated sums release the GIL), so one sketcher can use a
        second core. Each sketch still gets the same updates in the same order, from one
        thread at a time: the states are bit-identical to the sequential path
        (tests/test_partition_concurrency.py); the job has ended before the next epoch's rows.

        ``models``: with refinement, the public models by snapshot epoch; a stream document of
        epoch e is also folded into ``models.model_for(e)`` (the rule
        :func:`streamdp.refinement.model_epoch_for`: the snapshot of e − L, or none) and its
        contribution added to the epoch's RefinementSketch. The caller holds the partition
        before any document whose model is not decided (:class:`ModelNotDecided` otherwise,
        raised before anything changes).

        Stream documents need the subspace; the caller must not pass any before it
        exists (it pauses the partition instead). Documents routed to an epoch
        the release service already closed are late.
        """
        routes = self.final_routes(routes, subspace is not None)
        if np.any(routes == FUTURE):
            raise ValueError("FUTURE-routed documents must be dead-lettered, not added")
        if models is not None:       # every model decided, before any sketch changes
            for r in np.unique(routes[routes > 0]):
                models.model_for(int(r))
        w = first = None
        excluded = np.zeros(routes.shape[0], dtype=bool)
        if users is not None:
            w, first = self._user_weights(users, routes if user_routes is None else user_routes)
            excluded = self.last_not_admitted
        out = {"warmup": 0, "stream": 0, "late": int(np.sum(routes == LATE)), "short": 0,
               "not_admitted": 0}
        short = (np.asarray(X.sum(axis=1)).ravel() < MIN_DOC_LENGTH) if X.shape[0] else np.zeros(0, bool)
        short &= ~excluded       # each document counted under one reason
        for r in np.unique(routes):
            rows = np.flatnonzero(routes == r)
            if r == LATE:
                continue
            if r == WARMUP_EPOCH:
                if self.warmup is None:           # (closed: final_routes made them late)
                    self.warmup = warmup_factory()
                if w is None:
                    self.warmup.update(X[rows])
                else:
                    self.warmup.update(X[rows], weights=w[rows], in_histogram=first[rows])
                out["warmup"] += rows.size
                out["short"] += int(short[rows].sum())
                out["not_admitted"] += int(excluded[rows].sum())
                continue
            if subspace is None:
                raise RuntimeError("stream documents before the subspace exists (pause instead)")
            sk = self.epochs.get(int(r))
            if sk is None:
                sk = self.epochs[int(r)] = WhitenedSketch(subspace, clip)
            # user mode: the rows' weights (document mode: the unweighted calls, unchanged)
            wkw = {} if w is None else {"weights": w[rows]}
            model = None if models is None else models.model_for(int(r))
            if model is not None and refine_in_background:
                rs = self.refine.get(int(r))
                if rs is None:
                    rs = self.refine[int(r)] = RefinementSketch(*model.shape)
                Xr = X[rows]
                job = _refine_worker().submit(rs.update, Xr, model, **wkw)
                try:
                    sk.update(Xr, **wkw)
                finally:
                    job.exception()         # wait for it, also when sk.update raised
                job.result()                # its error, if any
                model = None
            else:
                sk.update(X[rows], **wkw)
            if model is not None:
                rs = self.refine.get(int(r))
                if rs is None:
                    rs = self.refine[int(r)] = RefinementSketch(*model.shape)
                rs.update(X[rows], model, **wkw)
            out["stream"] += rows.size
            out["short"] += int(short[rows].sum())
            out["not_admitted"] += int(excluded[rows].sum())
        self.counters["late"] += out["late"]
        self.counters["warmup_documents"] += out["warmup"]
        self.counters["documents"] += out["stream"]
        return out

    def add_selection(self, token_lists, factory, candidates) -> int:
        """Add selection-window documents (token lists, already validated) to the partition's
        vocabulary-selection histogram; returns how many were added."""
        if not token_lists:
            return 0
        if self.selection is None:
            self.selection = factory()
        self.selection.add(token_lists, candidates)
        self.counters["selection_documents"] = self.counters.get("selection_documents", 0) + len(token_lists)
        return len(token_lists)

    def forget_selection(self) -> None:
        """The vocabulary is published: the selection histogram is consumed."""
        self.selection = None

    def forget_closed(self, closed_through: int, warmup_closed: bool) -> None:
        """Drop sketches the release service has consumed (raw state lives no longer)."""
        self.closed_through = max(self.closed_through, int(closed_through))
        for e in [e for e in self.epochs if e <= self.closed_through]:
            del self.epochs[e]
        for e in [e for e in self.refine if e <= self.closed_through]:
            del self.refine[e]
        if warmup_closed:
            self.warmup = None
            self.users_warmup = None        # its weights can no longer reach a released sum
            # ids no later counted document can be within the dedup window of (epoch 0, the
            # warm-up, counts as closed from here on)
            self.seen_ids.expire(self.closed_through)

    # ------------------------------------------------------------ checkpoint
    def to_bytes(self) -> bytes:
        return ser.dumps({
            "kind": KIND, "v": VERSION, "topic": self.topic, "partition": self.partition,
            "next_offset": self.next_offset,
            "progress": None if self.progress == -math.inf else self.progress,
            "selection": None if self.selection is None else self.selection.to_bytes(),
            "warmup": None if self.warmup is None else self.warmup.to_bytes(),
            "epochs": [[e, sk.to_bytes()] for e, sk in sorted(self.epochs.items())],
            # k × d float64 per open epoch (chunked by the state store like the sketches)
            "refine": [[e, rs.to_dict()] for e, rs in sorted(self.refine.items())],
            "closed_through": self.closed_through, "counters": self.counters,
            "fence": self.fence,
            # 8 bytes per counted document id, by epoch (streamdp.services.dedup, format v2;
            # v1 was the bytes of one set under "seen_ids")
            "dedup": self.seen_ids.to_obj(),
            # user mode: the bounders (secret: per-user counts), so a re-read after a crash or
            # a rebalance numbers every user's documents exactly as the lost run did
            **({} if self.users_stream is None and self.users_warmup is None else {
                "users_warmup": None if self.users_warmup is None else self.users_warmup.to_dict(),
                "users_stream": None if self.users_stream is None else self.users_stream.to_dict(),
                "users_expired_through": self.users_expired_through}),
        })

    @classmethod
    def from_bytes(cls, data: bytes, subspace: Subspace | None) -> "PartitionState":
        obj = ser.loads(data)
        obj = ser.upgrade(obj, KIND, VERSION, {1: _state_v1_to_v2})
        ser.require(obj, KIND, "topic", "partition", "next_offset", "progress", "selection",
                    "warmup", "epochs", "refine", "closed_through", "counters", "fence", "dedup")
        if obj["epochs"] and subspace is None:
            raise ser.SchemaError("partition state holds stream sketches but no subspace is known")
        selection = None
        if obj["selection"] is not None:
            selection = SelectionHistogram.from_bytes(obj["selection"])
        return cls(topic=obj["topic"], partition=int(obj["partition"]),
                   next_offset=int(obj["next_offset"]),
                   progress=-math.inf if obj["progress"] is None else float(obj["progress"]),
                   selection=selection,
                   warmup=None if obj["warmup"] is None else WarmupSketch.from_bytes(obj["warmup"]),
                   epochs={int(e): WhitenedSketch.from_bytes(b, subspace) for e, b in obj["epochs"]},
                   refine={int(e): RefinementSketch.from_dict(r) for e, r in obj["refine"]},
                   closed_through=int(obj["closed_through"]), counters=dict(obj["counters"]),
                   fence=int(obj["fence"]),
                   users_warmup=_bounder(obj.get("users_warmup")),
                   users_stream=_bounder(obj.get("users_stream")),
                   users_expired_through=int(obj.get("users_expired_through", 0)),
                   # v1 (one flat set) or none (before deduplication): lifetime ids
                   seen_ids=_counted_ids(obj))

    def meta(self) -> dict:
        """Small manifest metadata: lets the release service check progress cheaply."""
        return {"topic": self.topic, "partition": self.partition, "next_offset": self.next_offset,
                "progress": None if self.progress == -math.inf else self.progress,
                "epochs": sorted(self.epochs), "warmup": self.warmup is not None,
                "selection": self.selection is not None,
                "refine_epochs": sorted(self.refine),
                "closed_through": self.closed_through, "fence": self.fence}


def _bounder(obj) -> UserBounder | None:
    return None if obj is None else UserBounder.from_dict(obj)


def check_user(user: str | None, partition: int, n_partitions: int) -> InvalidMessage | None:
    """User mode: why a decoded document cannot be counted on ``partition``, or None.

    ``missing_user``: it has no user id. ``user_partition_mismatch``: it is not on
    ``partition_for_user(user, n_partitions)`` — keying by user is not trusted (a producer
    with another partitioner, a manual partition, a changed partition count): a user on two
    partitions would get two weight sequences (docs/privacy.md)."""
    if user is None:
        return messages.InvalidMessage.user(
            messages.MISSING_USER, "the document has no 'user' field, and this deployment's "
                                   "unit of privacy is the user (privacy_unit: user): the "
                                   "producer must set it")
    want = partition_for_user(user, n_partitions)
    if want != partition:
        return messages.InvalidMessage.user(
            messages.USER_PARTITION_MISMATCH,
            f"the document's user belongs on partition {want} of {n_partitions} "
            f"(partition_for_user), it was read from partition {partition}: produce with "
            "`streamdp produce` or set the partition with streamdp.privacy.user_bounding."
            "partition_for_user")
    return None


_worker: ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()


def _refine_worker() -> ThreadPoolExecutor:
    """The one worker thread of ``PartitionState.add(..., refine_in_background=True)``."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(1, thread_name_prefix="streamdp-refine")
        return _worker


def fencing_token(group_generation: int | None, restored_fence: int = 0) -> int:
    """The fencing token of a writer assigned a partition in consumer-group generation
    ``group_generation``, having restored a record with token ``restored_fence``.

    Within one consumer group the generation grows at every rebalance, so a member
    that lost the partition (a zombie) holds a smaller token than the new owner. The
    max with the restored token keeps tokens monotonic if the group is ever re-created
    (generations restart at 0); a zombie from *before* such a re-creation may then tie
    with the new owner (documented limit, docs/operations.md §Time and fencing).
    """
    return max(int(group_generation or 0), int(restored_fence or 0))


def select_state(accepted, candidate):
    """THE fencing rule for sketch-state records of one partition (DESIGN §5, issue 15).

    ``accepted`` is the newest record accepted so far (None if none) and ``candidate``
    a newer one read from the state topic; both have ``.meta`` with ``fence`` and
    ``next_offset``. The candidate is rejected when its fencing token *or* its
    ``next_offset`` goes backwards: it was written by a zombie (a sketcher that lost
    the partition and still checkpointed) or is older than what was already used.
    Returns ``(chosen, rejected)``. Used by the sketcher's restore and by the release
    service's partition view.
    """
    if candidate is None:
        return accepted, False
    if accepted is None or accepted is candidate:
        return candidate, False
    a, c = accepted.meta, candidate.meta
    if int(c.get("fence", 0)) < int(a.get("fence", 0)) or int(c["next_offset"]) < int(a["next_offset"]):
        return accepted, True
    return candidate, False


def state_key(topic: str, partition: int) -> str:
    return f"sketch/{topic}/{int(partition)}"


def _counted_ids(obj: dict) -> CountedIds:
    """The partition's counted ids from its checkpoint's "dedup" record."""
    try:
        return CountedIds.from_obj(obj["dedup"])
    except ValueError as exc:
        raise ser.SchemaError(f"partition state: {exc}") from None


def _state_v1_to_v2(obj: dict) -> dict:
    """A v1 partition state as v2 (the one migration of this kind): v1 records written before
    refinement hold no refinement sums, before fencing the token 0; their counted ids are the
    "dedup" record, or the one flat set under "seen_ids" (before the dedup window: lifetime
    ids), or none (before deduplication; docs/privacy.md)."""
    out = dict(obj)
    out["refine"] = obj.get("refine") or []
    out.setdefault("fence", 0)
    if "dedup" not in obj:
        flat = out.pop("seen_ids", None) or b""     # dedup format 1: one flat set of ids
        out["dedup"] = CountedIds(None, lifetime=SeenIds.from_bytes(bytes(flat))).to_obj()
    return out
