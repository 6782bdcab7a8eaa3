"""Deduplication by document id (streamdp.services.dedup): what it costs a sketcher, with and
without a window (``dedup_window_epochs``).

Per setting, one partition receives ``--ids`` distinct ids spread evenly over ``--epochs`` epochs,
in poll batches of ``--batch`` (the sketcher's path: keyed hashes of the batch's ids, the
duplicate check against the held ids and the batch, the add of the counted ones); a
``--repeat`` share of each batch re-sends an earlier id (the copies a second ``produce`` or a
retrying producer sends). Epoch e − 1 closes when epoch e's documents start (one open epoch);
with a window N the ids of epoch e′ are dropped at the close of e′ + N − 1. At the end the held
set is serialised into a checkpoint and restored from it. ``held_ids`` is the memory that
matters: 8 bytes each, in the sketcher and in every checkpoint of the partition.

    python benchmarks/dedup.py --ids 100000,1000000 --windows none,1,4 --epochs 24 \
        --json benchmarks/results/dedup.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, write_json  # noqa: E402

import numpy as np  # noqa: E402

from streamdp import serialization as ser  # noqa: E402
from streamdp.services.dedup import CountedIds, IdHasher  # noqa: E402


def run(n_ids: int, batch: int, repeat: float, window: int | None, epochs: int,
        seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    hasher = IdHasher(b"benchmark control key, 32 bytes.")
    held = CountedIds(window)
    t_hash = t_check = 0.0
    n_sent = n_dup = n_docs = peak = 0
    per_epoch = -(-n_ids // epochs)
    for e in range(1, epochs + 1):
        held.expire(e - 2)                       # epoch e − 1 is open, e − 2 closed (c ≥ 0: warm-up closed)
        end = min(n_ids, e * per_epoch)
        while n_sent < end:
            k = min(batch, end - n_sent)
            n_rep = int(k * repeat) if n_sent else 0
            ids = [f"ticket-{n_sent + j:010d}" for j in range(k - n_rep)]
            for o in rng.integers(0, n_sent, n_rep):     # copies of earlier ids ...
                ids.insert(int(rng.integers(0, len(ids) + 1)), f"ticket-{o:010d}")   # ... anywhere
            t0 = time.perf_counter()
            h = hasher.hashes(ids)
            t1 = time.perf_counter()
            ep = np.full(h.size, e, np.int64)
            dup = held.duplicates(h, ep)
            held.add(h[~dup], ep[~dup])
            t2 = time.perf_counter()
            t_hash += t1 - t0
            t_check += t2 - t1
            n_dup += int(dup.sum())
            n_docs += h.size
            n_sent += k - n_rep
            peak = max(peak, len(held))
    t0 = time.perf_counter()
    raw = ser.dumps(held.to_obj())
    t1 = time.perf_counter()
    back = CountedIds.from_obj(ser.loads(raw))
    t2 = time.perf_counter()
    assert len(back) == len(held)
    return {"window": "none" if window is None else window, "epochs": epochs, "ids": n_sent,
            "documents": n_docs, "duplicates": n_dup, "held_ids": len(held), "peak_held_ids": peak,
            "hash_us_per_doc": 1e6 * t_hash / n_docs, "check_add_us_per_doc": 1e6 * t_check / n_docs,
            "checkpoint_mb": len(raw) / 1e6, "serialise_ms": 1e3 * (t1 - t0),
            "restore_ms": 1e3 * (t2 - t1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ids", default="100000,1000000", help="distinct ids per partition, comma-separated")
    p.add_argument("--batch", type=int, default=2000, help="documents per poll batch (batch_size)")
    p.add_argument("--repeat", type=float, default=0.05, help="share of each batch that repeats an earlier id")
    p.add_argument("--windows", default="none,1,4",
                   help="dedup_window_epochs values, comma-separated (none = the deployment's life)")
    p.add_argument("--epochs", type=int, default=24, help="epochs the ids are spread over")
    p.add_argument("--json", help="write the rows to this JSON file")
    a = parse_args(p, argv)
    windows = [None if w.strip().lower() in ("none", "null") else int(w) for w in a.windows.split(",")]
    rows = [run(int(n), a.batch, a.repeat, w, a.epochs) for n in a.ids.split(",") for w in windows]
    cols = ["window", "ids", "documents", "duplicates", "held_ids", "peak_held_ids",
            "hash_us_per_doc", "check_add_us_per_doc", "checkpoint_mb", "serialise_ms", "restore_ms"]
    print(markdown_table(rows, cols))
    write_json(a.json, {"batch": a.batch, "repeat": a.repeat, "epochs": a.epochs, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
