"""The one exponential back-off schedule (streamdp/backoff.py) and its users."""
from __future__ import annotations

import itertools
import math

import pytest

from streamdp.backoff import exponential_delays


def test_delays_double_up_to_the_cap_and_stay_there():
    assert list(itertools.islice(exponential_delays(0.5, 15.0), 8)) == \
        [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]


def test_a_bounded_schedule_has_exactly_its_attempts():
    assert tuple(exponential_delays(0.5, attempts=3)) == (0.5, 1.0, 2.0)
    assert tuple(exponential_delays(1.0, factor=3.0, attempts=4)) == (1.0, 3.0, 9.0, 27.0)
    assert tuple(exponential_delays(1.0, attempts=0)) == ()


@pytest.mark.parametrize("kwargs", [dict(initial=0.0), dict(initial=-1.0), dict(initial=math.nan),
                                    dict(initial=2.0, maximum=1.0), dict(initial=1.0, factor=0.5),
                                    dict(initial=1.0, attempts=-1)])
def test_a_schedule_that_would_spin_or_shrink_is_refused(kwargs):
    with pytest.raises(ValueError):
        exponential_delays(**kwargs)


def test_the_retry_schedules_of_dead_letters_and_release_records():
    from streamdp.services.processor import DLQ_RETRY_SECONDS
    from streamdp.services.release_sinks import DELIVERY_RETRY_SECONDS
    assert DLQ_RETRY_SECONDS == DELIVERY_RETRY_SECONDS == (0.5, 1.0, 2.0)


def test_the_outage_guard_waits_by_the_schedule_and_restarts_it_each_episode(monkeypatch):
    """Waits 0.5, 1, 2, … capped at max_backoff within an episode; a new episode starts
    again at initial_backoff. Time and the stop flag are faked: nothing sleeps."""
    import threading

    from streamdp.kafka import connectivity
    from streamdp.observability import HealthState

    now = [0.0]
    monkeypatch.setattr(connectivity.time, "monotonic", lambda: now[0])

    class Stop(threading.Event):
        def wait(self, timeout=None):
            now[0] += timeout
            return False

    guard = connectivity.OutageGuard(HealthState(), {"bootstrap.servers": "127.0.0.1:1"}, Stop(),
                                     initial_backoff=0.5, max_backoff=3.0)

    def waits(n):
        out = []
        for _ in range(n):
            t0 = now[0]
            guard._backoff_wait()
            out.append(now[0] - t0)
        return out

    guard._start("test")
    assert waits(5) == [0.5, 1.0, 2.0, 3.0, 3.0]
    guard.in_outage = False
    guard._start("again")
    assert waits(2) == [0.5, 1.0]
