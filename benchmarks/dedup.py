"""Deduplication by document id (streamdp.services.dedup): what it costs a sketcher.

Per setting, one partition's id set grows from empty to ``--ids`` ids in poll batches of
``--batch`` (the sketcher's path: keyed hashes of the batch's ids, the duplicate check against the
set and the batch, the add), then is serialised into a checkpoint and restored from it. A
``--repeat`` share of each batch repeats earlier ids (the copies a second ``produce`` sends).

    python benchmarks/dedup.py --ids 100000,1000000 --json benchmarks/results/dedup.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, write_json  # noqa: E402

import numpy as np  # noqa: E402

from streamdp.services.dedup import IdHasher, SeenIds  # noqa: E402


def run(n_ids: int, batch: int, repeat: float, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    hasher = IdHasher(b"benchmark control key, 32 bytes.")
    seen = SeenIds()
    t_hash = t_check = 0.0
    n_seen = n_dup = 0
    while n_seen < n_ids:
        k = min(batch, n_ids - n_seen)
        n_rep = int(k * repeat) if n_seen else 0
        ids = [f"ticket-{n_seen + j:010d}" for j in range(k - n_rep)]
        for o in rng.integers(0, n_seen, n_rep):         # copies of earlier ids ...
            ids.insert(int(rng.integers(0, len(ids) + 1)), f"ticket-{o:010d}")   # ... anywhere
        t0 = time.perf_counter()
        h = hasher.hashes(ids)
        t1 = time.perf_counter()
        dup = seen.duplicates(h)
        seen.add(h[~dup])
        t2 = time.perf_counter()
        t_hash += t1 - t0
        t_check += t2 - t1
        n_dup += int(dup.sum())
        n_seen = len(seen)
    n_docs = n_seen + n_dup
    t0 = time.perf_counter()
    raw = seen.to_bytes()
    t1 = time.perf_counter()
    back = SeenIds.from_bytes(raw)
    t2 = time.perf_counter()
    assert len(back) == n_seen
    return {"ids": n_seen, "documents": n_docs, "duplicates": n_dup,
            "hash_us_per_doc": 1e6 * t_hash / n_docs, "check_add_us_per_doc": 1e6 * t_check / n_docs,
            "checkpoint_mb": len(raw) / 1e6, "serialise_ms": 1e3 * (t1 - t0),
            "restore_ms": 1e3 * (t2 - t1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ids", default="100000,1000000", help="distinct ids per partition, comma-separated")
    p.add_argument("--batch", type=int, default=2000, help="documents per poll batch (batch_size)")
    p.add_argument("--repeat", type=float, default=0.05, help="share of each batch that repeats an earlier id")
    p.add_argument("--json", help="write the rows to this JSON file")
    a = parse_args(p, argv)
    rows = [run(int(n), a.batch, a.repeat) for n in a.ids.split(",")]
    cols = ["ids", "documents", "duplicates", "hash_us_per_doc", "check_add_us_per_doc",
            "checkpoint_mb", "serialise_ms", "restore_ms"]
    print(markdown_table(rows, cols))
    write_json(a.json, {"batch": a.batch, "repeat": a.repeat, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
