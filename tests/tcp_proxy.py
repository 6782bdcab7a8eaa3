"""A TCP forwarder that can simulate a network outage between a client and a broker.

``TcpProxy(listen_port, target_port)`` accepts on 127.0.0.1:listen_port and pipes
each connection to 127.0.0.1:target_port (one thread per direction). ``cut()``
closes the listening socket and every open connection (clients see resets, then
"connection refused"); ``restore()`` listens again on the same port. The broker
behind it keeps running, with its transactional state, throughout.
"""
from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, listen_port: int, target_port: int, host: str = "127.0.0.1") -> None:
        self.host, self.listen_port, self.target_port = host, int(listen_port), int(target_port)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._server: socket.socket | None = None
        self.accepted = 0

    # ------------------------------------------------------------ control
    def start(self) -> "TcpProxy":
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((self.host, self.listen_port))
        srv.listen(64)
        self._server = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()
        return self

    def cut(self) -> None:
        """Outage: refuse new connections and reset every open one."""
        with self._lock:
            srv, self._server = self._server, None
            conns, self._conns = self._conns, set()
        if srv is not None:
            srv.close()
        for c in conns:
            try:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def restore(self) -> None:
        self.start()

    def close(self) -> None:
        self.cut()

    # ------------------------------------------------------------ plumbing
    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return                              # cut(): the listener was closed
            try:
                upstream = socket.create_connection((self.host, self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._server is not srv:         # cut while connecting
                    client.close()
                    upstream.close()
                    return
                self._conns |= {client, upstream}
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
