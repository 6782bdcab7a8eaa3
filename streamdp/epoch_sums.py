"""What one continual epoch (or tree node) releases: :class:`EpochSums`, the spectral sketch sums
and, with refinement, the refinement sums, with its record (epoch_sums v2, docs/schemas.md) and
the sums of an empty epoch. Raw sums: SECRET until noised."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamdp import serialization as ser
from streamdp.moments.sketch import SketchSums
from streamdp.privacy.rounding import dd_add
from streamdp.whitening.subspace import Subspace


@dataclass(frozen=True, eq=False)
class EpochSums:
    """What one epoch (or tree node) releases: the spectral sketch sums and, with refinement,
    the k × d refinement sums of its documents under the model public when they arrived."""

    sketch: SketchSums
    refine: np.ndarray | None = None
    refine_lo: np.ndarray | None = None     # double-double remainder of ``refine``

    def __add__(self, other: "EpochSums") -> "EpochSums":
        """Compensated: epoch and tree-node sums add only second-order rounding
        (streamdp.privacy.rounding); ``refine`` is the sum rounded once."""
        if not isinstance(other, EpochSums):
            return NotImplemented
        if (self.refine is None) != (other.refine is None):
            raise ValueError("cannot add epoch sums with and without refinement sums")
        if self.refine is None:
            return EpochSums(self.sketch + other.sketch)
        hi, lo = dd_add(self.refine, self.refine_lo, other.refine, other.refine_lo)
        return EpochSums(self.sketch + other.sketch, hi, lo)

    def to_dict(self) -> dict:
        return {"kind": "epoch_sums", "v": EPOCH_SUMS_VERSION, "sketch": self.sketch.to_dict(),
                "refine": None if self.refine is None else ser.pack_array(self.refine),
                "refine_lo": None if self.refine_lo is None else ser.pack_array(self.refine_lo)}

    @classmethod
    def from_dict(cls, obj: dict) -> "EpochSums":
        obj = ser.upgrade(_epoch_sums_header(obj), "epoch_sums", EPOCH_SUMS_VERSION,
                          {0: _epoch_sums_v0_to_v1, 1: _epoch_sums_v1_to_v2})
        ser.require(obj, "epoch_sums", "sketch", "refine", "refine_lo")
        ser.require({"v": obj["v"], **obj["sketch"]}, "epoch_sums", "n_docs")   # the sketch's own
        lo = obj["refine_lo"]
        return cls(SketchSums.from_dict(obj["sketch"]),
                   None if obj["refine"] is None else ser.unpack_array(obj["refine"], name="refine"),
                   None if lo is None else ser.unpack_array(lo, name="refine_lo"))


#: epoch_sums record version (issue 26 item 4). v0: a bare sketch-sums map with no header
#: (before refinement); v1: the header, ``refine`` and, once written, ``n_docs`` and
#: ``refine_lo``; v2: every field always present (:func:`_epoch_sums_v1_to_v2`)
EPOCH_SUMS_VERSION = 2


def _epoch_sums_header(obj):
    """A headerless map (a tree written before refinement, v0) gets its kind and version, so
    the one reader, :func:`streamdp.serialization.upgrade`, migrates it."""
    if isinstance(obj, dict) and "kind" not in obj and "count" in obj:
        return {"kind": "epoch_sums", "v": 0, "sketch": obj}
    return obj


def _epoch_sums_v0_to_v1(obj: dict) -> dict:
    """v0 as v1: the sketch sums alone, no refinement sums."""
    return {"kind": "epoch_sums", "sketch": obj["sketch"], "refine": None}


def _epoch_sums_v1_to_v2(obj: dict) -> dict:
    """v1 as v2: v1 records written before the document count (issue 11) count none, and
    those written before compensated summation have no refinement remainder."""
    return {**obj, "sketch": {"n_docs": 0, **obj["sketch"]}, "refine_lo": obj.get("refine_lo")}


def zero_sums(subspace: Subspace) -> SketchSums:
    """The sums of an empty epoch (still closed and noised like any other)."""
    d, kp = subspace.d, subspace.dim
    return SketchSums(0.0, np.zeros(d), np.zeros((d, kp)), np.zeros(kp), np.zeros((kp, kp)),
                      np.zeros((kp, kp, kp)))
