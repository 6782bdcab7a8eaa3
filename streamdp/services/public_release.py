"""The public record sketchers read to refine documents and drop released sketches (issue 23
item 6: sketchers never decode the release service's private state).

Key :data:`KEY` on the state topic (compacted; chunked by the state store like every record),
written by the release service after each release state persist — so it never announces an
epoch whose draw is not durable — and re-written at start-up when it lags the persisted state
(a crash between the two writes). Payload (msgpack)::

    {"kind": "public_release", "v": 2, "epoch": t,
     "models": [refinement model dicts (RefinementModel.to_dict) of the last L snapshots],
     "start": "tensor" | "public"}

``start`` (issue 22) is the deployment's start, chosen at the warm-up close: with "public",
the public start's model is among ``models`` as epoch 0, the model of epochs 1…L
(:func:`streamdp.refinement.model_epoch_for`); "tensor" until a choice is made. v1 records
lacked it when written before issue 22 or before the choice; :func:`_v1_to_v2` reads them as
"tensor", as the v1 reader did.

Everything in it is released: ``epoch`` is the last published epoch (public: a snapshot
exists), each model is the topic-word matrix and α its snapshot published. What it does not
hold, unlike the release state: the BLT/tree buffers of raw sums, the ledger head, the
control offset. Its metadata (``{"epoch": t}``) carries the deployment's MAC
(:mod:`streamdp.services.state_auth`); a sketcher ignores a record without a valid one.
"""
from __future__ import annotations

from streamdp import serialization as ser

KEY = "public/release"
KIND = "public_release"
VERSION = 2


def encode(epoch: int, models: list[dict], start: str | None = None) -> bytes:
    """``start`` None: no choice made yet, recorded as "tensor" (the start a sketcher assumes)."""
    return ser.dumps({"kind": KIND, "v": VERSION, "epoch": int(epoch), "models": list(models),
                      "start": "tensor" if start is None else str(start)})


def _v1_to_v2(obj: dict) -> dict:
    """v1 as v2: a v1 record without ``start`` (before issue 22, or before the choice) meant
    the tensor start."""
    return {**obj, "start": obj.get("start") or "tensor"}


def _read(payload: bytes) -> dict:
    obj = ser.upgrade(ser.loads(payload), KIND, VERSION, {1: _v1_to_v2})
    ser.require(obj, KIND, "epoch", "models", "start")
    return obj


def decode_start(payload: bytes) -> str:
    """The start a public release record announces ("tensor" or "public")."""
    return str(_read(payload)["start"])


def decode(payload: bytes) -> tuple[int, list[dict]]:
    """(epoch, model dicts) of a public release record."""
    obj = _read(payload)
    return int(obj["epoch"]), list(obj["models"])
