"""The spend protocol, written once: reserve → draw noise → persist → commit.

Every private release of the services goes through :class:`SpendSession`, a
:class:`~streamdp.privacy.events.BudgetSpender` handed to the code that draws
noise (the tree mechanism, the warm-up's clip histogram and range finder, a
one-shot release):

1. **reserve** — ``reserve(events, label)`` is forwarded to
   :meth:`Accountant.reserve` with an *idempotency key*
   ``f"{scope}:{label}"`` naming exactly what is released (``"tree:epoch=5"``
   is the reservation of the tree nodes completing at epoch 5;
   ``"warmup:warmup"`` the warm-up range finder). The ledger line is durable
   (fsync'd) before it returns.
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
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

from streamdp.privacy.accountant import Accountant, Reservation
from streamdp.privacy.events import GaussianEvent

log = logging.getLogger(__name__)


def spend_key(scope: str, label: str) -> str:
    """The idempotency key of a reservation: ``"<scope>:<label>"`` (label as the mechanism names it)."""
    return f"{scope}:{label}" if scope else label


class SpendSession:
    """A :class:`BudgetSpender` that keys reservations and commits only after persistence.

    Parameters
    ----------
    accountant : Accountant
    scope : str
        Prefix of the idempotency keys (``"tree"``, ``"warmup"``); the label
        the mechanism passes (``"epoch=5"`` … as given) completes the key.
    """

    def __init__(self, accountant: Accountant, scope: str = "") -> None:
        self.accountant = accountant
        self.scope = scope
        self._drawn: list[Reservation] = []

    # ------------------------------------------------------------ BudgetSpender
    def reserve(self, events: Sequence[GaussianEvent], *, label: str = "") -> Reservation:
        """Step 1: durable, keyed reservation (an uncommitted one of the same key is reused)."""
        key = spend_key(self.scope, label)
        token = self.accountant.reserve(events, label=key, key=key)
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
