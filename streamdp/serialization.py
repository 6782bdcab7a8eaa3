"""msgpack codec shared by every persisted or transmitted object.

Conventions (DESIGN §6): ``use_bin_type=True``, ``raw=False``,
``strict_map_key=True``, bounded sizes, a schema version on every record, and
numpy arrays as ``{"dtype", "shape", "data"}`` with little-endian dtype strings,
so a round trip is bit-exact across machines.
"""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

# Upper bound for one decoded record; sketches larger than this must be chunked
# by the transport layer anyway.
MAX_RECORD_BYTES = 1 << 31


class SchemaError(ValueError):
    """A record does not match the expected schema or version."""


def pack_array(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    a = a.astype(dt, copy=False)
    return {"dtype": dt.str, "shape": list(a.shape), "data": a.tobytes()}


def unpack_array(obj: Any, *, name: str = "array") -> np.ndarray:
    try:
        dtype = np.dtype(obj["dtype"])
        shape = tuple(int(s) for s in obj["shape"])
        data = obj["data"]
    except (KeyError, TypeError) as exc:
        raise SchemaError(f"{name}: expected {{dtype, shape, data}}, got {type(obj).__name__}") from exc
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise SchemaError(f"{name}: unsupported dtype {dtype}")
    if any(s < 0 for s in shape):
        raise SchemaError(f"{name}: negative shape {shape}")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if not isinstance(data, (bytes, bytearray)) or len(data) != expected:
        raise SchemaError(f"{name}: {len(data) if isinstance(data, (bytes, bytearray)) else 'no'} "
                          f"bytes for shape {shape} and dtype {dtype} (expected {expected})")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def dumps(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def loads(data: bytes, *, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    if len(data) > max_bytes:
        raise SchemaError(f"record of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True,
                               max_bin_len=max_bytes, max_str_len=max_bytes)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        raise SchemaError(f"not a valid msgpack record: {exc}") from exc


def check_header(obj: Any, kind: str, version: int) -> None:
    if not isinstance(obj, dict):
        raise SchemaError(f"{kind}: expected a map, got {type(obj).__name__}")
    if obj.get("kind") != kind:
        raise SchemaError(f"expected a {kind!r} record, got {obj.get('kind')!r}")
    if obj.get("v") != version:
        raise SchemaError(f"{kind}: unsupported schema version {obj.get('v')!r} (this build reads v{version})")


def upgrade(obj: Any, kind: str, version: int, steps: dict | None = None) -> dict:
    """Check a persisted record's header and bring an older layout to ``version``: the one
    place a record kind's schema history is read (issue 26), so its reader reads the current
    layout only. ``steps[v]`` turns a version-v record (a copy) into a version-v+1 one, filling
    what v lacked. A version above ``version`` (written by a newer streamdp) or below the oldest
    step (too old) is refused, saying what to do."""
    if not isinstance(obj, dict):
        raise SchemaError(f"{kind}: expected a map, got {type(obj).__name__}")
    if obj.get("kind") != kind:
        raise SchemaError(f"expected a {kind!r} record, got {obj.get('kind')!r}")
    steps = steps or {}
    v, oldest = obj.get("v"), min(steps, default=version)
    if type(v) is not int or not oldest <= v <= version:
        newer = type(v) is int and v > version
        raise SchemaError(
            f"{kind}: unsupported schema version {v!r} (this build reads v{oldest}"
            + (f"..v{version}" if oldest < version else "") + "): "
            + ("it was written by a newer streamdp; run that version (or newer) on this state"
               if newer else "it was written by a streamdp too old for this build to migrate; "
               "restore the state with the version that wrote it, or start a new deployment "
               "(docs/operations.md)"))
    out = dict(obj)
    while v < version:
        out = steps[v](out)
        v += 1
        out["v"] = v
    return out


def require(obj: dict, kind: str, *names: str) -> None:
    """Refuse a record of the current layout that lacks a field (a damaged or foreign record:
    older layouts are migrated by :func:`upgrade` before this check)."""
    missing = [n for n in names if n not in obj]
    if missing:
        raise SchemaError(f"{kind} v{obj.get('v')}: missing field(s) {', '.join(missing)}")
