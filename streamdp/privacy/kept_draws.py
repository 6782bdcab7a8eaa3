"""Keep a draw until its post-processing has succeeded (issue 23 item 4, in-process paths).

A release draws noise, then post-processes the noised values (orthonormalisation, eigh, the
power method, projections, denoising). If the post-processing raises and the caller retries,
a *fresh* draw would be rejection sampling on the noise: the output would be conditioned on
the noise that made post-processing succeed. :class:`KeptDraws` holds the noised outputs of
one public operation (a tuple such as ``("refine", 0.25, "<model id>")``) from their draw
until the operation returns; a retry of the same operation gets the same noised values back
in the same order (no reservation, no draw), and any other operation is refused with
:class:`PendingDraw` until it is finished.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterator


class PendingDraw(RuntimeError):
    """Another operation's noised values are waiting for their post-processing."""


class KeptDraws:
    def __init__(self) -> None:
        self.operation: Hashable | None = None
        self.values: list[Any] = []
        self._next = 0

    @contextmanager
    def operation_of(self, operation: Hashable) -> Iterator["KeptDraws"]:
        """Run ``operation``; its draws are kept if it raises, forgotten once it returns."""
        if self.operation is not None and self.operation != operation:
            raise PendingDraw(
                f"the post-processing of {self.operation!r} failed after its noise was drawn; "
                f"call it again with the same arguments to finish it from the same noised values "
                f"before {operation!r} (a new draw would be rejection sampling on the noise)")
        self.operation, self._next = operation, 0
        try:
            yield self
        except BaseException:
            if not self.values:          # nothing drawn (a refusal before the draw): no debt
                self.operation = None
            raise
        self.operation, self.values, self._next = None, [], 0

    def draw(self, make: Callable[[], Any]) -> Any:
        """The operation's next noised value: the kept one on a retry, else ``make()`` (which
        spends and draws) and kept."""
        if self.operation is None:
            raise RuntimeError("KeptDraws.draw outside operation_of()")
        if self._next < len(self.values):
            value = self.values[self._next]
        else:
            value = make()
            self.values.append(value)
        self._next += 1
        return value

    def forget(self) -> None:
        """Drop the kept values. Only for a failure that does not depend on them (a budget
        refusal, decided from ρ's alone, of the draw after a premise check): then no output
        was derived from them, and a fresh draw later is not conditioned on them."""
        self.values, self._next = [], 0

    @property
    def pending(self) -> bool:
        return bool(self.values)


def kept_or_fresh(kept: KeptDraws | None, make: Callable[[], Any]) -> Any:
    """``kept.draw(make)``, or just ``make()`` without a keeper."""
    return make() if kept is None else kept.draw(make)
