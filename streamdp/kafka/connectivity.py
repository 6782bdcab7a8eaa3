"""Reaching Kafka: a fast bootstrap check, one log line per outage, and riding outages out.

Three pieces (issue 15, "Outages"):

:func:`check_bootstrap`
    Called first by every command that talks to Kafka (sketcher, release,
    produce, control): one metadata request with a short timeout. A wrong or
    unreachable ``bootstrap`` fails within ``timeout`` seconds with a
    :class:`~streamdp.services.config.ConfigError` that names the setting,
    before anything is written (the release service's ledger included).
:func:`client_extras` / :data:`LOG_GATE`
    Every service client gets a Python ``logger`` (librdkafka's log lines go
    through :mod:`logging` instead of stderr) whose :class:`EpisodeLogFilter`
    lets the *first* connection failure of an episode through and suppresses
    the repeats (librdkafka logs one per reconnect attempt per connection:
    thousands during a minute-long outage), and an ``error_cb`` that records
    "all brokers down" in :data:`BROKER_STATUS`.
:class:`OutageGuard`
    Wraps one iteration of a service's poll loop. While Kafka is unreachable
    (a Kafka/state-store error escaping the step — alone or inside an exception
    group —, or librdkafka reporting all brokers down, confirmed by a metadata probe) the service stays *alive*
    (liveness beats during the back-off), is *not ready*, retries with
    exponential back-off, and logs one line when the episode starts and one
    when it ends; after recovery it restores its readiness and runs the
    service's ``resync`` hook (the release service reloads its durable state,
    exactly as after a restart, so an interrupted release is never half-applied).
"""
from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from typing import Any, Callable

from confluent_kafka import KafkaError, KafkaException

from streamdp.backoff import exponential_delays
from streamdp.errors import ConfigError, StateStoreError

log = logging.getLogger("streamdp.kafka")

#: librdkafka's log lines are routed to this logger (with :data:`LOG_GATE` on it).
LIBRDKAFKA_LOGGER = "streamdp.kafka.librdkafka"

_CONNECTION_FAILURE = re.compile(
    r"connection refused|connect to .* failed|all broker connections are down|brokers? down|"
    r"disconnected|transport failure|timed out|failed to resolve|name or service not known|"
    r"connection reset|broken pipe|no route to host|network is unreachable|"
    r"receive failed|send failed|connection setup timed out", re.IGNORECASE)


def _bootstrap_of(client_config: dict) -> str:
    return str(client_config.get("bootstrap.servers", "?"))


def check_bootstrap(client_config: dict, timeout: float = 10.0) -> None:
    """Raise ConfigError unless a broker at ``bootstrap.servers`` answers within ``timeout`` s."""
    from confluent_kafka.admin import AdminClient

    bootstrap = _bootstrap_of(client_config)
    cfg = {k: v for k, v in client_config.items()
           if k not in ("logger", "error_cb", "stats_cb", "fetch.max.bytes", "group.id",
                        "enable.auto.commit", "auto.offset.reset", "enable.idempotence", "acks",
                        "linger.ms", "statistics.interval.ms")}
    cfg["socket.connection.setup.timeout.ms"] = max(1000, int(timeout * 1000))
    cfg["logger"] = _quiet_logger()      # never polled: nothing reaches stderr
    t0 = time.monotonic()
    try:
        admin = AdminClient(cfg)
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        raise ConfigError(
            f"cannot reach Kafka at bootstrap={bootstrap!r} within {timeout:g} s ({err}): check "
            "the 'bootstrap' setting (config file, --bootstrap or STREAMDP_BOOTSTRAP), that the "
            "brokers are running and that this host can reach them (and the 'kafka' security "
            "properties, if the cluster needs TLS/SASL)") from None
    log.debug("bootstrap %s reachable in %.2f s", bootstrap, time.monotonic() - t0)


def _quiet_logger() -> logging.Logger:
    lg = logging.getLogger(LIBRDKAFKA_LOGGER + ".probe")
    lg.propagate = False
    lg.addHandler(logging.NullHandler())
    return lg


# ------------------------------------------------------------------ log gate
class EpisodeLogFilter(logging.Filter):
    """One log line per connection-failure episode.

    The first connection-failure record of an episode passes (with a note that
    repeats are suppressed); later ones are counted and dropped until the
    episode ends — :meth:`end_episode` (called by :class:`OutageGuard` on
    recovery, which logs the summary) or ``quiet_seconds`` without a failure.
    Other records pass unchanged.
    """

    def __init__(self, quiet_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.quiet_seconds = float(quiet_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self.in_episode = False
        self.suppressed = 0
        self._last_failure = 0.0
        self.episodes = 0

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:                # noqa: BLE001 — a log filter must never raise
            return True
        if not _CONNECTION_FAILURE.search(msg):
            return True
        now = self._clock()
        with self._lock:
            if self.in_episode and now - self._last_failure > self.quiet_seconds:
                self.in_episode = False
            self._last_failure = now
            if self.in_episode:
                self.suppressed += 1
                return False
            self.in_episode, self.suppressed = True, 0
            self.episodes += 1
        record.msg = f"{msg} (Kafka connection failure; repeats suppressed until it recovers)"
        record.args = ()
        return True

    def end_episode(self) -> int:
        """Close the episode; the number of records suppressed in it."""
        with self._lock:
            n, self.in_episode, self.suppressed = self.suppressed, False, 0
            return n


#: The process-wide gate on librdkafka's log lines.
LOG_GATE = EpisodeLogFilter()


class LibrdkafkaLevels(logging.Filter):
    """The level a librdkafka log line is logged at.

    confluent-kafka already maps librdkafka's syslog levels to :mod:`logging`'s (0–2 emerg,
    alert, crit → CRITICAL; 3 err → ERROR; 4 warning → WARNING; 5 notice, 6 info → INFO;
    7 debug → DEBUG). On top of that:

    * a connection failure is WARNING, not ERROR: the client reconnects by itself, a command
      that needs the broker fails with its own message (:func:`check_bootstrap`) and a
      service logs the outage once (:class:`OutageGuard`), so librdkafka's line is detail;
    * while a broker is stopped on purpose (:func:`quiet_librdkafka`, e.g. at the end of the
      demo), every line is DEBUG.

    A record demoted below its logger's effective level is dropped, as if it had been logged
    at the lower level in the first place.
    """

    def __init__(self) -> None:
        super().__init__()
        self._quiet = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if self._quiet:
            level = logging.DEBUG
        elif level >= logging.ERROR and level < logging.CRITICAL:
            try:
                if _CONNECTION_FAILURE.search(record.getMessage()):
                    level = logging.WARNING
            except Exception:            # noqa: BLE001 — a log filter must never raise
                pass
        if level != record.levelno:
            record.levelno, record.levelname = level, logging.getLevelName(level)
            return logging.getLogger(record.name).isEnabledFor(level)
        return True

    @contextlib.contextmanager
    def quiet(self):
        with self._lock:
            self._quiet += 1
        try:
            yield
        finally:
            with self._lock:
                self._quiet -= 1


#: The process-wide level rules of librdkafka's log lines.
LOG_LEVELS = LibrdkafkaLevels()


def quiet_librdkafka():
    """Context manager: librdkafka's lines are DEBUG inside it (a broker stopped on purpose)."""
    return LOG_LEVELS.quiet()


def librdkafka_logger() -> logging.Logger:
    """The logger every Kafka client of streamdp gets as its ``logger`` config entry
    (:func:`streamdp.kafka.topics.client_config`): one line per connection-failure episode
    (:data:`LOG_GATE`), at the levels of :class:`LibrdkafkaLevels`."""
    lg = logging.getLogger(LIBRDKAFKA_LOGGER)
    for f in (LOG_LEVELS, LOG_GATE):        # levels first: a line dropped as DEBUG starts no episode
        if f not in lg.filters:
            lg.addFilter(f)
    return lg


class BrokerStatus:
    """Broker-down reports (all brokers down, transport failures) from librdkafka's ``error_cb``;
    the guard confirms each with a metadata probe before calling it an outage."""

    DOWN_CODES = (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down: dict[str, float] = {}

    def error_cb_for(self, bootstrap: str) -> Callable[[KafkaError], None]:
        def error_cb(err: KafkaError) -> None:
            try:
                if err.code() in self.DOWN_CODES:
                    with self._lock:
                        self._down.setdefault(bootstrap, time.monotonic())
                else:
                    log.debug("kafka client error: %s", err)
            except Exception:            # noqa: BLE001 — never raise inside librdkafka callbacks
                pass
        return error_cb

    def down_since(self, bootstrap: str) -> float | None:
        with self._lock:
            return self._down.get(bootstrap)

    def clear(self, bootstrap: str) -> None:
        with self._lock:
            self._down.pop(bootstrap, None)


BROKER_STATUS = BrokerStatus()


def client_extras(bootstrap: str) -> dict[str, Any]:
    """``logger`` and ``error_cb`` for a service client (see the module docstring)."""
    return {"logger": librdkafka_logger(), "error_cb": BROKER_STATUS.error_cb_for(bootstrap)}


# ------------------------------------------------------------------ the guard
def _outage_errors() -> tuple[type[BaseException], ...]:
    return (KafkaException, StateStoreError, TimeoutError, BufferError, RuntimeError)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``: itself, or every leaf of an exception group, however
    nested (a stream processor's ``except*`` handlers that fail together raise one group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


class OutageGuard:
    """Run a service's ``step`` so that a Kafka outage neither kills nor floods it.

    Parameters
    ----------
    health : HealthState
        Beaten during back-off (liveness), set not ready during an episode.
    client_config : dict
        Client configuration for the recovery probe (``bootstrap.servers`` + security).
    stop : threading.Event
        The service's stop flag: back-off ends early on SIGTERM.
    resync : callable, optional
        Run once after recovery, before the next step (e.g. reload durable state).
    """

    def __init__(self, health, client_config: dict, stop: threading.Event, *,
                 name: str = "service", resync: Callable[[], None] | None = None,
                 initial_backoff: float = 0.5, max_backoff: float = 15.0,
                 probe_timeout: float = 3.0, logger: logging.Logger | None = None) -> None:
        self.health = health
        self.client_config = {k: v for k, v in client_config.items()}
        self.bootstrap = _bootstrap_of(client_config)
        self.stop = stop
        self.name = name
        self.resync = resync
        self.initial_backoff = float(initial_backoff)
        self.max_backoff = float(max_backoff)
        self.probe_timeout = float(probe_timeout)
        self.log = logger or log
        self.in_outage = False
        self.episodes = 0
        self.failures = 0
        self._since = 0.0
        self._delays = exponential_delays(self.initial_backoff, self.max_backoff)
        self._saved_ready: tuple[bool, str] = (True, "serving")
        self._admin = None

    # ---------------------------------------------------------------- probe
    def probe(self) -> bool:
        """Whether a broker answers a metadata request within ``probe_timeout``."""
        from confluent_kafka.admin import AdminClient
        try:
            if self._admin is None:
                cfg = {k: v for k, v in self.client_config.items()
                       if k not in ("logger", "error_cb", "stats_cb")}
                cfg["logger"] = _quiet_logger()
                self._admin = AdminClient(cfg)
            self._admin.list_topics(timeout=self.probe_timeout)
            return True
        except KafkaException:
            return False

    # ----------------------------------------------------------------- step
    def run(self, step: Callable[[], Any]) -> bool:
        """One guarded iteration: True if ``step`` ran to completion."""
        if not self.in_outage and BROKER_STATUS.down_since(self.bootstrap) is not None:
            BROKER_STATUS.clear(self.bootstrap)
            if not self.probe():
                self._start("librdkafka reports all brokers down")
        if self.in_outage:
            self.health.beat()
            if not self.probe():
                self._backoff_wait()
                return False
        try:
            if self.in_outage:
                self._end()
            step()
        except Exception as exc:
            if not self.is_outage(exc):
                raise                   # not an outage: a genuine failure keeps failing loudly
            self._start(f"{type(exc).__name__}: {exc}")
            self._backoff_wait()
            return False
        return True

    def is_outage(self, exc: BaseException) -> bool:
        """Whether ``exc`` is Kafka being unreachable: every exception in it (one, or each leaf
        of an exception group) is a Kafka, state-store, timeout or buffer error, or a
        RuntimeError while the broker does not answer a probe. Anything else in it (a bug, bad
        data) is not: the step keeps failing loudly."""
        leaves = _leaves(exc)
        if not all(isinstance(e, _outage_errors()) for e in leaves):
            return False
        plain_runtime = any(isinstance(e, RuntimeError) and not isinstance(e, KafkaException)
                            for e in leaves)
        return not (plain_runtime and self.probe())

    def _start(self, why: str) -> None:
        self.failures += 1
        if self.in_outage:
            return
        self.in_outage = True
        self.episodes += 1
        self._since = time.monotonic()
        self._delays = exponential_delays(self.initial_backoff, self.max_backoff)
        self._saved_ready = self.health.ready_flag()      # the flag, not the gates of the moment
        self.health.set_ready(False, f"Kafka unreachable at {self.bootstrap}; retrying")
        self.log.warning("%s: Kafka unreachable at bootstrap=%s (%s); not ready, retrying with "
                         "back-off up to %.0f s (one line when it recovers)", self.name,
                         self.bootstrap, why[:300], self.max_backoff)

    def _end(self) -> None:
        suppressed = LOG_GATE.end_episode()
        BROKER_STATUS.clear(self.bootstrap)
        self.in_outage = False
        self.log.warning("%s: Kafka reachable again at bootstrap=%s after %.1f s (%d failed "
                         "attempts, %d librdkafka connection errors suppressed)", self.name,
                         self.bootstrap, time.monotonic() - self._since, self.failures, suppressed)
        self.failures = 0
        if self.resync is not None:
            self.in_outage = True            # until the resync itself got through
            self.resync()
            self.in_outage = False
        self.health.set_ready(*self._saved_ready)

    def _backoff_wait(self) -> None:
        deadline = time.monotonic() + next(self._delays)
        while not self.stop.is_set():
            self.health.beat()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.stop.wait(min(0.5, left))
        self.health.beat()

    def close(self) -> None:
        self._admin = None


class BrokerProbe:
    """Readiness that reflects the broker (issue 25): a daemon thread completes a metadata
    round trip every ``interval`` seconds; one that fails or takes longer than ``bound``
    seconds marks the service not ready (a ``HealthState`` ready gate), the next one that
    succeeds ready again. A frozen broker (SIGSTOP, a hung disk) raises no client error:
    consumers just see no records, so only a round trip shows it."""

    def __init__(self, health, client_config: dict, *, bound: float = 10.0,
                 interval: float = 5.0, name: str = "service") -> None:
        self.health, self.bound, self.interval, self.name = health, float(bound), float(interval), name
        self.bootstrap = _bootstrap_of(client_config)
        self._cfg = {k: v for k, v in client_config.items()
                     if k not in ("logger", "error_cb", "stats_cb")}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.down: str | None = None        # why the last round trip failed (None: it worked)
        # a gate of its own (HealthState.add_ready_gate): a recovered broker never overrides
        # a service's own not-ready reason (fenced, outage)
        health.add_ready_gate(lambda: (self.down is None, self.down or ""))

    def start(self) -> "BrokerProbe":
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-broker-probe",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.bound + 2)

    def round_trip(self, admin) -> str | None:
        """None if a metadata round trip completed within ``bound``, else why not."""
        t0 = time.monotonic()
        try:
            admin.list_topics(timeout=self.bound)
        except KafkaException as exc:
            return f"no broker round trip to {self.bootstrap} within {self.bound:.0f} s ({exc})"
        took = time.monotonic() - t0
        if took > self.bound:
            return f"broker round trip to {self.bootstrap} took {took:.1f} s (> {self.bound:.0f} s)"
        return None

    def _run(self) -> None:
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({**self._cfg, "logger": _quiet_logger()})
        down = None
        while not self._stop.is_set():
            why = self.round_trip(admin)
            if why is not None:
                self.failures += 1
                if down is None:
                    log.warning("%s: not ready: %s", self.name, why)
            elif down is not None:
                log.warning("%s: broker round trip works again: ready", self.name)
            down = self.down = why
            self._stop.wait(self.interval)
