"""The spend protocol, written once: reserve → draw noise → persist → commit.

Every private release of the release service and of the estimator goes through
a :class:`SpendSession`, a :class:`~streamdp.privacy.events.BudgetSpender`
handed to the code that draws noise (the tree mechanism, the warm-up's clip
histogram and range finder, a one-shot release, a refinement pass), which calls
:func:`spend`:

1. **reserve** — forwarded to :meth:`Accountant.reserve` with an *idempotency
   key* ``f"{scope}:{label}"`` (just the label with no scope) naming exactly
   what is released: the service's ``"tree:epoch=5"`` is the reservation of the
   tree nodes completing at epoch 5, ``"warmup"`` the warm-up range finder; an
   estimator run's ``"<run_id>:release#1"`` its first one-shot release. The
   ledger line is durable (fsync'd) before it returns.
2. **draw** — the caller draws the noise and computes the noised output.
3. **persist** — the caller stores the noised output durably (the release
   service: the release state on Kafka, which holds the noised tree nodes; the
   subspace record for the warm-up). Nothing derived from the noise may leave
   the process before this step. The mechanism's own ``commit(token)`` call is
   deferred: it only marks the reservation as drawn.
4. **commit** — :meth:`SpendSession.persisted` commits every drawn reservation
   on the ledger.

Crash recovery (:meth:`SpendSession.recover`, at start-up): a reservation on the
ledger that is not committed is either

* *persisted* — its output is in the durable state (the caller says so with
  ``is_persisted(key)``): it is committed now; or
* *lost* — the process died between 1 and 3, so no output derived from that draw
  ever left it: the next ``reserve`` of the same key returns the same
  reservation uncharged (``fulfilling``) and a fresh draw *fulfils* it. One
  reservation, one released output: nothing new is spent (argument in
  docs/privacy_accounting.md §Crash-safe spending).

A committed key is never drawn again (:class:`~streamdp.privacy.accountant.AlreadySpent`).

One code path for every draw
----------------------------
Every noise draw of the engine — the warm-up's clip histogram and range
finder, a one-shot release (:func:`streamdp.release.release_topics`), a
refinement pass, a tree node — goes through :func:`spend`, which runs the four
steps above in that order and is the only caller of ``Accountant.reserve`` and
``Accountant.commit`` outside tests (``tests/test_spend_protocol.py`` guards
this). What "persist" is depends on the spender:

* a :class:`SpendSession` *without* an output store (the release service):
  persisting is the caller's job (the release state on Kafka); ``commit`` waits
  for :meth:`SpendSession.persisted`;
* a :class:`SpendSession` *with* an output store (the in-process estimator,
  ``StreamingSpectralLDA(run_id=...)``): the noised output is written to the
  store, then committed at once. With a :class:`FileLedger` the store is the
  directory ``<ledger>.outputs/`` next to it (:class:`FileOutputStore`, one
  fsync'd file per key), so a re-run of the same ``run_id`` after a crash
  returns the persisted output of every committed draw (no new draw, no new
  charge) and fulfils an uncommitted one; with an in-memory ledger persistence
  is the returned value itself (:class:`InMemoryOutputs`: nothing outlives the
  process, and neither does the ledger);
* any other :class:`BudgetSpender` (an ``EventLog``, a bare accountant, a test
  wrapper): unkeyed reserve → draw → commit, the output living in memory.
"""
from __future__ import annotations

import dataclasses

import hashlib
import itertools
import logging
import os
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar

import numpy as np

from streamdp import serialization as ser
from streamdp.privacy.accountant import Accountant, AlreadySpent, Reservation
from streamdp.privacy.events import BudgetSpender, GaussianEvent

log = logging.getLogger(__name__)
T = TypeVar("T")


def spend_key(scope: str, label: str) -> str:
    """The idempotency key of a reservation: ``"<scope>:<label>"`` (label as the mechanism names it)."""
    return f"{scope}:{label}" if scope else label


class SpendSession:
    """A :class:`BudgetSpender` that keys reservations and commits only after persistence.

    Parameters
    ----------
    accountant : Accountant
    scope : str
        Prefix of the idempotency keys (``"tree"``, ``"warmup"``, a run id); the
        label the mechanism passes (``"epoch=5"`` … as given) completes the key.
    store : OutputStore, optional
        Where :meth:`spend` persists each noised output before committing it
        (module docstring). ``None``: the caller persists and calls
        :meth:`persisted`.
    """

    def __init__(self, accountant: Accountant, scope: str = "",
                 store: "OutputStore | None" = None, *, unit: str = "document") -> None:
        if not isinstance(accountant, Accountant):
            raise TypeError(f"SpendSession needs an Accountant, got {type(accountant).__name__}")
        self.accountant = accountant
        self.scope = scope
        self.store = store
        self.unit = unit        # the privacy unit every reserved event is recorded under
        self._drawn: list[Reservation] = []

    # ------------------------------------------------------------ the protocol
    def spend(self, events: Sequence[GaussianEvent], *, label: str, draw: Callable[[], T],
              codec: "Codec | None" = None, fulfil: bool = True) -> T:
        """reserve (keyed) → draw → persist → commit; see :func:`spend`."""
        events = tag_unit(events, self.unit)
        codec = codec or ARRAY_CODEC
        for attempt in itertools.count():
            # attempt 0 is the label itself; later ones exist only with fulfil=False
            lab = label if attempt == 0 else f"{label}~retry{attempt}"
            key = spend_key(self.scope, lab)
            if self.store is not None:
                found = self.store.get(key)
                if found is not None:
                    return self._persisted_output(key, lab, events, found, codec)
            if fulfil:
                token = self.reserve(events, label=lab)     # 1. durable, keyed
                break
            token = self._reserve_unfulfilled(events, key)
            if token is not None:
                break
        out = draw()                                        # 2.
        if self.store is None:                              # 3-4 by the caller
            self.commit(token)
            return out
        self.store.put(key, {"events": [e.to_dict() for e in events],
                             "value": codec.encode(out)})   # 3. durable
        self.accountant.commit(token)                       # 4.
        return out

    def _persisted_output(self, key: str, label: str, events: tuple[GaussianEvent, ...],
                          found: dict, codec: "Codec") -> Any:
        """A re-run: the output of ``key`` was persisted (and maybe committed) before."""
        if found.get("events") != [e.to_dict() for e in events]:
            raise ValueError(f"the persisted output of {key!r} in {self.store!r} was drawn for "
                             "other events: the run's configuration changed; use a new run_id")
        token = Reservation(key, label, events)
        try:
            self.accountant.commit(token)       # idempotent; needed if the crash was before 4
        except KeyError as exc:
            raise RuntimeError(
                f"{self.store!r} holds the noised output of {key!r} but the ledger "
                f"{self.accountant.ledger!r} has no reservation for it: the ledger is not the one "
                "this output was paid from (lost or replaced). Restore the ledger; do not "
                "delete the outputs to spend again") from exc
        log.info("reusing the persisted output of %r (no new draw, no new charge)", key)
        return codec.decode(found["value"])

    def _reserve_unfulfilled(self, events: tuple[GaussianEvent, ...], key: str
                             ) -> Reservation | None:
        """Step 1 for a draw whose post-processing runs inside it (``fulfil=False``): a
        fresh reservation of ``key``, or None when ``key`` is used up. An uncommitted
        reservation of ``key`` was left by a crash *inside* such a draw, where the crash may
        have depended on the noise: fulfilling it with a fresh draw would be rejection
        sampling, so it is committed as spent and the caller tries the next key."""
        try:
            token = self.accountant.reserve(events, label=key, key=key)
        except AlreadySpent:
            return None
        if token.fulfilling:
            log.warning("reservation %r was left uncommitted by a crash inside a draw that "
                        "post-processes its own noise: it stays charged (committed unused) and "
                        "a new reservation pays for the retry", key)
            self.accountant.commit(token)
            return None
        return token

    # ------------------------------------------------------------ BudgetSpender
    def reserve(self, events: Sequence[GaussianEvent], *, label: str = "") -> Reservation:
        """Step 1: durable, keyed reservation (an uncommitted one of the same key is reused)."""
        key = spend_key(self.scope, label)
        token = self.accountant.reserve(tag_unit(events, self.unit), label=key, key=key)
        if token.fulfilling:
            log.warning("fulfilling reservation %r left uncommitted by a crash: its noised output "
                        "was never persisted, a fresh draw replaces it (no new charge)", key)
        return token

    def commit(self, token: Reservation) -> None:
        """Called by the mechanism after step 2: deferred until :meth:`persisted`."""
        if not isinstance(token, Reservation):
            raise TypeError(f"commit() takes a Reservation, got {token!r}")
        if all(t.id != token.id for t in self._drawn):
            self._drawn.append(token)

    # ------------------------------------------------------------ steps 3-4
    @property
    def pending(self) -> list[Reservation]:
        """Reservations drawn but not yet persisted/committed."""
        return list(self._drawn)

    def discard(self) -> None:
        """Forget drawn reservations whose output will not be persisted (they stay
        uncommitted on the ledger and are fulfilled by the next reserve of their key)."""
        self._drawn.clear()

    def persisted(self) -> None:
        """Step 4: the noised outputs are durable; commit their reservations."""
        drawn, self._drawn = self._drawn, []
        for token in drawn:
            self.accountant.commit(token)

    # ------------------------------------------------------------ restart
    def recover(self, is_persisted: Callable[[str], bool]) -> list[str]:
        """Commit uncommitted reservations of this scope whose output is persisted.

        Returns the keys left to fulfil (reserved, output lost): the next
        ``reserve`` of each returns it uncharged.
        """
        left = []
        prefix = spend_key(self.scope, "")
        for token in self.accountant.uncommitted():
            if self.scope and not token.id.startswith(prefix):
                continue
            if is_persisted(token.id):
                log.info("committing reservation %r: its output was persisted before a crash",
                         token.id)
                self.accountant.commit(token)
            else:
                left.append(token.id)
        return left


def tag_unit(events: Sequence[GaussianEvent], unit: str) -> tuple[GaussianEvent, ...]:
    """The events recorded under privacy ``unit`` (their sensitivities are for that unit)."""
    return tuple(e if e.unit == unit else dataclasses.replace(e, unit=unit) for e in events)


class UnitSpender:
    """A plain :class:`BudgetSpender` (an EventLog, …) whose events are recorded under
    ``unit``; a :class:`SpendSession` takes ``unit=`` itself."""

    def __init__(self, inner: BudgetSpender, unit: str) -> None:
        self.inner, self.unit = inner, unit

    def reserve(self, events: Sequence[GaussianEvent], *, label: str = "") -> object:
        return self.inner.reserve(tag_unit(events, self.unit), label=label)

    def commit(self, token: object) -> None:
        self.inner.commit(token)


def spend(spender: BudgetSpender | None, events: Sequence[GaussianEvent], *, label: str,
          draw: Callable[[], T], codec: "Codec | None" = None, fulfil: bool = True) -> T:
    """The spend protocol, the one code path of every noise draw.

    ``events`` are the Gaussian events ``draw`` will realise (all of its noise);
    ``label`` names the draw (the idempotency key with a :class:`SpendSession`'s
    scope). Runs reserve → ``draw()`` → persist → commit (module docstring); an
    exception from ``draw`` leaves the reservation uncommitted (spent, and
    fulfilled by the next draw of the same key). No events (non-private): just
    ``draw()``. ``codec`` encodes the output for an output store (default:
    arrays, numbers and tuples of them). ``fulfil=False``: ``draw`` post-processes its
    own noise (the iterative mechanism's power-method queries), so a reservation a crash
    left uncommitted is never fulfilled by a fresh draw: it stays charged and the retry is
    reserved and charged anew under ``label~retry<i>`` (docs/privacy.md, "The iterative
    mechanism").
    """
    events = tuple(events)
    if not events:
        return draw()
    if isinstance(spender, SpendSession):
        return spender.spend(events, label=label, draw=draw, codec=codec, fulfil=fulfil)
    if spender is None:
        raise ValueError(f"{label!r}: a private draw needs a budget spender (an accountant)")
    # A spender that keys nothing (EventLog, a bare accountant, a wrapper): the
    # output is persisted in memory only, so it is committed as soon as it exists.
    token = spender.reserve(events, label=label)
    out = draw()
    spender.commit(token)
    return out


def admit(spender: BudgetSpender | None,
          planned: Sequence[tuple[str, Sequence[GaussianEvent]]], *, label: str) -> None:
    """Refuse (BudgetExhausted) unless the spender's accountant admits the ``planned`` draws
    (each draw's label, as it will be passed to :func:`spend`, and its events) together now
    (:meth:`Accountant.admit`; nothing reserved): the first step of an operation that draws
    them one after another, so that its refusal comes before its first draw. With a
    :class:`SpendSession` a draw whose key is already on the ledger (a re-run's) is not
    counted again. A spender without an accountant (an EventLog) enforces nothing."""
    if not any(evs for _, evs in planned):
        return
    if isinstance(spender, SpendSession):
        spender.accountant.admit(
            [(spend_key(spender.scope, lab), tag_unit(evs, spender.unit)) for lab, evs in planned],
            label=spend_key(spender.scope, label))
        return
    unit = None
    if isinstance(spender, UnitSpender):
        spender, unit = spender.inner, spender.unit
    if isinstance(spender, Accountant):         # unkeyed: every draw is charged when drawn
        spender.admit([(None, evs if unit is None else tag_unit(evs, unit))
                       for _, evs in planned], label=label)


def recommit_kept(spender: BudgetSpender | None, events: Sequence[GaussianEvent], *,
                  label: str) -> None:
    """A draw kept in memory (no redraw: :mod:`streamdp.privacy.kept_draws`) whose session
    discarded its reservation (its release was refused or raised before being persisted) is
    committed with the release that finally uses it: the same key reserved again — uncharged,
    ``fulfilling`` — and committed at the session's next :meth:`SpendSession.persisted`. Other
    spenders committed it when it was drawn."""
    if not isinstance(spender, SpendSession):
        return
    try:
        spender.commit(spender.reserve(events, label=label))
    except AlreadySpent:
        pass


def run_spend(session: SpendSession, draw: Callable[[], object],
              persist: Callable[[object], None]) -> object:
    """reserve (inside ``draw``, by the mechanism) → draw → persist → commit, in that order.

    ``draw`` runs the mechanism with ``session`` as its spender; if ``draw`` or
    ``persist`` raises, nothing is committed (the reservation is fulfilled by
    the next attempt of the same key).
    """
    try:
        out = draw()
        persist(out)
    except BaseException:
        session.discard()
        raise
    session.persisted()
    return out


# ------------------------------------------------------------------ output stores
class Codec:
    """How an output store encodes a draw's output (msgpack-able values)."""

    def __init__(self, encode: Callable[[Any], Any], decode: Callable[[Any], Any]) -> None:
        self.encode, self.decode = encode, decode


def _encode(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return {"nd": ser.pack_array(x)}
    if isinstance(x, (tuple, list)):
        return {"seq": [_encode(v) for v in x]}
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"the default spend codec stores arrays, numbers and tuples, not "
                    f"{type(x).__name__}: pass codec=")


def _decode(x: Any) -> Any:
    if isinstance(x, dict) and "nd" in x:
        return ser.unpack_array(x["nd"], name="persisted output")
    if isinstance(x, dict) and "seq" in x:
        return tuple(_decode(v) for v in x["seq"])
    return x


ARRAY_CODEC = Codec(_encode, _decode)


class OutputStore(Protocol):
    """Durable map key → persisted noised output (``get`` returns None when absent)."""

    def get(self, key: str) -> dict | None: ...

    def put(self, key: str, record: dict) -> None: ...


class InMemoryOutputs:
    """Persistence "in memory": the output returned to the caller is all there is.

    For an estimator on an in-memory ledger (which dies with the process too):
    ``put`` keeps nothing, so holding every noised output costs no memory."""

    def __repr__(self) -> str:
        return "InMemoryOutputs()"

    def get(self, key: str) -> dict | None:
        return None

    def put(self, key: str, record: dict) -> None:
        return None


class FileOutputStore:
    """One msgpack file per key in a directory next to a file ledger.

    Each file is written to a temporary name, fsync'd, renamed into place and
    the directory fsync'd, so after a crash a key's file is either absent or
    complete. The files hold noised outputs (DP releases; for the BLT aggregator
    each epoch's y_t = (Cx)_t + z_t, also public). It is created mode 0700, its
    files 0600.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, exist_ok=True)

    @classmethod
    def next_to(cls, ledger_path: str | os.PathLike) -> "FileOutputStore":
        p = Path(ledger_path)
        return cls(p.parent / (p.name + ".outputs"))

    def __repr__(self) -> str:
        return f"FileOutputStore({str(self.dir)!r})"

    def _path(self, key: str) -> Path:
        return self.dir / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".msgpack")

    def get(self, key: str) -> dict | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        rec = ser.loads(data)
        ser.check_header(rec, "spend_output", 1)
        if rec.get("key") != key:
            raise ValueError(f"{self!r}: file {self._path(key).name} holds {rec.get('key')!r}, "
                             f"not {key!r}")
        return rec

    def put(self, key: str, record: dict) -> None:
        path = self._path(key)
        tmp = path.with_suffix(".tmp")
        data = ser.dumps({"kind": "spend_output", "v": 1, "key": key, **record})
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def output_store_for(accountant: Accountant) -> OutputStore:
    """A file store next to a file ledger, else persistence in memory."""
    path = getattr(accountant.ledger, "path", None)
    return FileOutputStore.next_to(path) if path is not None else InMemoryOutputs()
