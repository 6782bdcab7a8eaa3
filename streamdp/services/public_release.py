"""The public record sketchers read to refine documents and drop released sketches (issue 23
item 6: sketchers never decode the release service's private state).

Key :data:`KEY` on the state topic (compacted; chunked by the state store like every record),
written by the release service after each release state persist — so it never announces an
epoch whose draw is not durable — and re-written at start-up when it lags the persisted state
(a crash between the two writes). Payload (msgpack)::

    {"kind": "public_release", "v": 1, "epoch": t,
     "models": [refinement model dicts (RefinementModel.to_dict) of the last L snapshots],
     "start": "tensor" | "public"}

``start`` (issue 22) is the deployment's start, chosen at the warm-up close: with "public",
the public start's model is among ``models`` as epoch 0, the model of epochs 1…L
(:func:`streamdp.refinement.model_epoch_for`). Absent in records written before it: tensor.

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
VERSION = 1


def encode(epoch: int, models: list[dict], start: str | None = None) -> bytes:
    obj = {"kind": KIND, "v": VERSION, "epoch": int(epoch), "models": list(models)}
    if start is not None:
        obj["start"] = str(start)
    return ser.dumps(obj)


def decode_start(payload: bytes) -> str:
    """The start a public release record announces ("tensor" when it predates the field)."""
    obj = ser.loads(payload)
    ser.check_header(obj, KIND, VERSION)
    return str(obj.get("start") or "tensor")


def decode(payload: bytes) -> tuple[int, list[dict]]:
    """(epoch, model dicts) of a public release record."""
    obj = ser.loads(payload)
    ser.check_header(obj, KIND, VERSION)
    return int(obj["epoch"]), list(obj.get("models") or [])
