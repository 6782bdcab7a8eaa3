"""A noise worker process: draws chunks of a vector for :mod:`streamdp.privacy.noise`.

Started as ``python -m streamdp.privacy.noise_worker`` (a fresh interpreter: never a fork, so it
shares no random-generator state with its parent, and the parent's ``__main__`` is not
re-imported). It serves requests on stdin/stdout until stdin closes:

request   ``<c d Q i``: kind (``b"g"`` Google, ``b"o"`` OpenDP), σ, n, OpenDP's lattice exponent k
          (−1074: exact); then n float64 values
reply     ``b"+"`` and n float64 (values + noise), or ``b"-"``, a ``<Q`` length and a UTF-8 error
"""
from __future__ import annotations

import struct
import sys

import numpy as np

from streamdp.privacy.noise import WORKER_HEADER as HEADER
from streamdp.privacy.noise import WORKER_KINDS as KINDS
from streamdp.privacy.noise import _draw_chunk


def _read_exact(stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def serve(inp, out) -> None:
    while True:
        try:
            kind, sigma, n, k = HEADER.unpack(_read_exact(inp, HEADER.size))
            values = np.frombuffer(_read_exact(inp, 8 * n), dtype="<f8")
        except EOFError:
            return
        try:
            result = np.ascontiguousarray(_draw_chunk(KINDS[kind], values, sigma, k), dtype="<f8")
        except Exception as exc:                      # reported to the parent, which raises
            msg = f"{type(exc).__name__}: {exc}".encode()
            out.write(b"-" + struct.pack("<Q", len(msg)) + msg)
        else:
            out.write(b"+" + result.tobytes())
        out.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
