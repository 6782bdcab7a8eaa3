"""When the release service may close an epoch (pure: no Kafka, no clock of its own).

An epoch (or the warm-up, epoch 0, or the vocabulary-selection window, ``SELECTION``) is
*closable* when every documents partition has either

* progressed past the epoch's close time (record time): its newest accepted sketcher state
  says ``progress >= close_time`` (``close_time`` = epoch end + lateness,
  :meth:`EpochRouting.close_time`); or
* is *caught up* — no record at or after the state's ``next_offset`` — while the epoch is
  *forced* (an operator's ``close`` through it, or a ``flush`` of everything seen) or *live
  past* (the wall clock is ``IDLE_GRACE_SECONDS`` past the close time, with lateness > 0).

A partition with no state at all counts as at offset 0 (caught up only if it is empty). A
partition whose sketcher is held, or whose state is from the future, is judged by the same
two rules: only its progress and its caught-up answer count. No partitions: never closable.

Whether a partition is caught up is a question to Kafka: the caller passes it as
``caught_up(partition, next_offset)``, asked only when the answer matters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from streamdp.services.partition_state import SELECTION

#: seconds past an epoch's close time after which a caught-up partition may close it live
IDLE_GRACE_SECONDS = 5.0


def newest_epoch(states: Mapping[int, Any]) -> int:
    """The newest epoch any partition state holds sums of (0 if none)."""
    return max([max(r.meta["epochs"] or [0]) for r in states.values()] or [0])


@dataclass(frozen=True)
class Commands:
    """The operator's standing commands (control messages ``close`` and ``flush``)."""
    forced_through: int = -1        # epochs declared complete (0 = the warm-up; -1: none)
    flush_requested: bool = False   # close everything seen so far


@dataclass(frozen=True)
class ClosingPolicy:
    """``close_time(epoch)`` (record time after which the epoch's documents are late) and the
    deployment's ``lateness``; ``idle_grace`` seconds past the close time a live epoch closes."""
    close_time: Callable[[int], float]
    lateness: float
    idle_grace: float = IDLE_GRACE_SECONDS

    def forced(self, epoch: int, states: Mapping[int, Any], commands: Commands) -> bool:
        """Whether an operator's command closes ``epoch`` without waiting for its close time."""
        if epoch == SELECTION:     # before the warm-up: forced by any flush / close
            forced = commands.flush_requested or commands.forced_through >= 0
        else:
            forced = epoch <= commands.forced_through
        if commands.flush_requested:
            forced = forced or epoch <= newest_epoch(states)
        return forced

    def closable(self, epoch: int, states: Mapping[int, Any], partitions: Sequence[int], *,
                 commands: Commands, now: float,
                 caught_up: Callable[[int, int], bool]) -> bool:
        """Whether ``epoch`` may be closed now (module docstring). ``states``: partition →
        its newest accepted state record (``.meta`` with ``progress`` and ``next_offset``);
        ``partitions``: every documents partition."""
        if not partitions:
            return False
        close_time = self.close_time(epoch)
        forced = self.forced(epoch, states, commands)
        live_past = now >= close_time + self.idle_grace and self.lateness > 0
        for p in partitions:
            rec = states.get(p)
            progress = None if rec is None else rec.meta.get("progress")
            if progress is not None and progress >= close_time:
                continue
            if (forced or live_past) and caught_up(p, 0 if rec is None else rec.meta["next_offset"]):
                continue
            return False
        return True

    @staticmethod
    def flush_complete(released_through: int, states: Mapping[int, Any],
                       partitions: Sequence[int], caught_up: Callable[[int, int], bool]) -> bool:
        """Whether a flush is done: every epoch seen is released and every partition is
        caught up (nothing arrived after the states the release read)."""
        return released_through >= newest_epoch(states) and all(
            caught_up(p, states[p].meta["next_offset"] if p in states else 0) for p in partitions)
