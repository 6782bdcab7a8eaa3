"""The public subspace Q that every stream sketch is expressed in."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from streamdp import serialization as ser

SCHEMA_VERSION = 1


@dataclass(frozen=True, eq=False)
class Subspace:
    """Orthonormal basis Q (d × k') plus an identifier and its provenance.

    Q is a differentially private output of the warm-up (or, for the
    non-private estimator, of the warm-up data directly); from then on it is
    public and may be shipped to every sketcher.
    """

    Q: np.ndarray
    provenance: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        Q = np.ascontiguousarray(self.Q, dtype=np.float64)
        if Q.ndim != 2 or Q.shape[1] > Q.shape[0] or Q.shape[1] < 1:
            raise ValueError(f"subspace basis must be d × k' with 1 <= k' <= d, got shape {Q.shape}")
        Q.setflags(write=False)
        object.__setattr__(self, "Q", Q)

    @property
    def d(self) -> int:
        return self.Q.shape[0]

    @property
    def dim(self) -> int:
        return self.Q.shape[1]

    @property
    def id(self) -> str:
        """Content hash: sketches built on different bases must never merge."""
        h = getattr(self, "_id", None)
        if h is None:
            h = hashlib.sha256(self.Q.tobytes() + str(self.Q.shape).encode()).hexdigest()[:32]
            object.__setattr__(self, "_id", h)
        return h

    @property
    def row_norm2(self) -> np.ndarray:
        """‖q_i‖² for every word i, shape (d,)."""
        r = getattr(self, "_row_norm2", None)
        if r is None:
            r = np.einsum("ij,ij->i", self.Q, self.Q)
            object.__setattr__(self, "_row_norm2", r)
        return r

    def to_bytes(self) -> bytes:
        return ser.dumps({"kind": "subspace", "v": SCHEMA_VERSION, "id": self.id,
                          "Q": ser.pack_array(self.Q), "provenance": self.provenance})

    @classmethod
    def from_bytes(cls, data: bytes) -> "Subspace":
        obj = ser.loads(data)
        ser.check_header(obj, "subspace", SCHEMA_VERSION)
        s = cls(ser.unpack_array(obj["Q"], name="Q"), provenance=obj.get("provenance") or {})
        if s.id != obj.get("id"):
            raise ser.SchemaError("subspace: content hash mismatch (corrupted record)")
        return s
