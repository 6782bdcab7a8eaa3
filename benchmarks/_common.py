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


def write_json(path: str | None, payload: dict) -> None:
    if path:
        payload = {"environment": environment(), "command": " ".join(sys.argv), **payload}
        with open(path, "w") as f:
            json.dump(payload, f, indent=2, default=float)
        print(f"wrote {path}")
