"""Shared helpers for benchmark scripts: tables, JSON output, environment facts."""
from __future__ import annotations

import json
import os
import platform
import sys
import time


def fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(out)


def environment() -> dict:
    import numpy, scipy
    return {"python": sys.version.split()[0], "numpy": numpy.__version__, "scipy": scipy.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "date": time.strftime("%Y-%m-%d")}


def parse_args(parser, argv=None):
    """``parser.parse_args(argv)`` with ``--no-progress`` added. With a progress bar on a
    terminal, the table lines printed to stdout are written around the bar, not through it
    (stdout's content is unchanged; nothing of the bar ever goes to stdout)."""
    from streamdp import progress as _progress
    _progress.add_flag(parser)
    a = parser.parse_args(argv)
    _progress.apply_flag(a)
    if _progress.enabled() and not getattr(sys.stdout, "_streamdp_around_bars", False):
        from tqdm.contrib import DummyTqdmFile
        sys.stdout = DummyTqdmFile(sys.stdout)
        sys.stdout._streamdp_around_bars = True
    return a


def progress(iterable, desc: str):
    """A progress bar over a benchmark's loop of settings/seeds (stderr, terminal only)."""
    from streamdp import progress as _progress
    items = list(iterable)
    return _progress.bar(items, total=len(items), desc=desc, unit="run")


def write_json(path: str | None, payload: dict) -> None:
    if path:
        payload = {"environment": environment(), "command": " ".join(sys.argv), **payload}
        with open(path, "w") as f:
            json.dump(payload, f, indent=2, default=float)
        print(f"wrote {path}")
