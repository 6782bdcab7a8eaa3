"""The HTTP endpoint of one service: ``/metrics``, ``/healthz``, ``/readyz`` and JSON routes.

prometheus_client's WSGI app and thread-per-request WSGI server in a daemon thread:
``/metrics`` (Prometheus text format, or OpenMetrics if the scraper asks for it), the probes
of a :class:`~streamdp.observability.health.HealthState`, and routes the service registers
(e.g. the release service's ``/snapshot/latest``).
"""
from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
from http import HTTPStatus
from typing import Any, Callable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from streamdp.observability.health import HealthState
from streamdp.observability.service_metrics import ServiceMetrics

log = logging.getLogger(__name__)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, without importing numpy
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _encode_json(obj: Any) -> bytes:
    return json.dumps(obj, default=_json_default, allow_nan=False,
                      separators=(",", ":")).encode()


class _Handler(WSGIRequestHandler):
    timeout = 10  # a stuck client cannot hold a handler thread forever
    server_version = "streamdp-observability"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s - %s", self.address_string(), format % args)


class _Server(ThreadingWSGIServer):
    """prometheus_client's thread-per-request WSGI server (daemon threads: a slow client never
    delays shutdown), quiet about clients that time out or hang up."""

    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a burst of connections (many scrapers, slow
    # clients) then waits for SYN retransmits (1 s each) before its thread is even started
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("observability request from %s failed", client_address, exc_info=True)


def _routed_path(environ: Mapping[str, Any]) -> str:
    path = environ.get("PATH_INFO") or "/"
    return path.rstrip("/") if len(path) > 1 else path


class ObservabilityServer:
    """HTTP endpoint for one service, started on construction.

    ``/metrics`` (Prometheus text format 0.0.4 via ``generate_latest``;
    OpenMetrics when the Accept header asks for it), ``/healthz`` and
    ``/readyz`` (200 / 503 with a JSON body), plus JSON routes added with
    :meth:`add_json_route`. ``port=0`` binds an ephemeral port, see
    :attr:`port`. The metrics' ``streamdp_last_progress_timestamp_seconds`` is
    bound to ``health`` unless the metrics already have a health source.
    """

    def __init__(self, metrics: ServiceMetrics, health: HealthState, host: str = "127.0.0.1",
                 port: int = 0, *, poll_interval: float = 0.1) -> None:
        self.metrics = metrics
        self.health = health
        if metrics._health is None:
            metrics.bind_health(health)
        self._routes: dict[str, Callable[[], Any]] = {}
        self._raw_routes: dict[str, tuple[Callable[[], bytes | None], str]] = {}
        self._metrics_app = make_wsgi_app(metrics.registry)
        server_cls = _Server
        if ":" in host:
            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        self._httpd = make_server(host, port, self._app, server_class=server_cls,
                                  handler_class=_Handler)
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._closed = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": poll_interval},
            name=f"streamdp-observability-{self.port}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- WSGI
    def _app(self, environ: dict, start_response: Callable) -> list[bytes]:
        """/metrics through prometheus_client's WSGI app, /healthz, /readyz and the routes the
        service added; HEAD answers as GET without a body; a failing route gives a 500."""
        path = _routed_path(environ)
        method = environ.get("REQUEST_METHOD", "GET")
        head = method == "HEAD"

        def send(status: int, body: bytes, headers: list[tuple[str, str]]) -> list[bytes]:
            gzip_ok = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
            if gzip_ok and len(body) > 1024 and not any(k == "Content-Encoding" for k, _ in headers):
                body = gzip.compress(body)
                headers = [*headers, ("Content-Encoding", "gzip")]
            start_response(f"{status} {HTTPStatus(status).phrase}",
                           [*headers, ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store")])
            return [] if head else [body]

        def send_json(status: int, obj: Any) -> list[bytes]:
            return send(status, _encode_json(obj), [("Content-Type", "application/json")])

        if method not in ("GET", "HEAD"):
            return send(405, b"", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
        try:
            if path == "/metrics":
                reply: dict[str, Any] = {}
                body = b"".join(self._metrics_app(
                    {**environ, "REQUEST_METHOD": "GET"},
                    lambda status, headers: reply.update(status=status, headers=headers)))
                return send(int(reply["status"].split()[0]), body, list(reply["headers"]))
            if path in ("/healthz", "/readyz"):
                ok, info = (self.health.liveness() if path == "/healthz"
                            else self.health.readiness())
                return send_json(200 if ok else 503, info)
            if path in self._raw_routes:
                fn, ctype = self._raw_routes[path]
                raw = fn()
                if raw is None:
                    return send_json(404, {"error": "not found", "path": path})
                return send(200, raw, [("Content-Type", ctype)])
            if path in self._routes:
                obj = self._routes[path]()
                if obj is None:
                    return send_json(404, {"error": "not found", "path": path})
                return send_json(200, obj)
            return send_json(404, {"error": "not found", "path": path, "routes": self.routes()})
        except Exception as exc:  # a failing route must not kill the server
            log.exception("error serving %s", path)
            return send_json(500, {"error": type(exc).__name__, "detail": str(exc)})

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def add_json_route(self, path: str, fn: Callable[[], Any]) -> None:
        """Serve ``fn()`` as JSON at ``path`` (GET); 404 when it returns ``None``.

        ``fn`` runs in a server thread: it must be thread-safe and quick (return
        a prepared object, e.g. the latest snapshot's dict). numpy values are
        converted with ``tolist()``; non-finite floats give a 500.
        """
        if not path.startswith("/") or path in ("/metrics", "/healthz", "/readyz"):
            raise ValueError(f"invalid or reserved route {path!r}")
        self._routes[path.rstrip("/") or "/"] = fn

    def add_bytes_route(self, path: str, fn: Callable[[], bytes | None], content_type: str) -> None:
        """Serve the bytes ``fn()`` returns at ``path`` (GET), as ``content_type``; 404 when it
        returns ``None``. Same rules for ``fn`` as :meth:`add_json_route`."""
        if not path.startswith("/") or path in ("/metrics", "/healthz", "/readyz"):
            raise ValueError(f"invalid or reserved route {path!r}")
        self._raw_routes[path.rstrip("/") or "/"] = (fn, content_type)

    def routes(self) -> list[str]:
        return ["/metrics", "/healthz", "/readyz", *sorted({*self._routes, *self._raw_routes})]

    def close(self) -> None:
        """Stop serving and release the port (idempotent; ~poll_interval)."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "ObservabilityServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
