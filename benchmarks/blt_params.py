"""Optimise the BLT parameters shipped with streamdp (streamdp/privacy/blt_params.json).

For each horizon n = 2, 4, …, 65536 (4 buffers, max-error objective) runs
:func:`streamdp.privacy.blt.optimize_blt` and prints, per n, the release variance of the BLT,
the binary tree and the full-memory square-root factorization (units Δ²/2ρ, max and mean over
epochs 1..n) and how the BLT degrades past n (variance at 2n, 4n, 16n over that at n).

    python benchmarks/blt_params.py                 # print the table
    python benchmarks/blt_params.py --write         # also rewrite the shipped JSON
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

from streamdp.privacy.blt import (optimize_blt, sqrt_toeplitz_error_profile,  # noqa: E402
                                  tree_error_profile)
from streamdp.privacy.blt_factorization import _PARAMS_FILE  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-log2", type=int, default=16)
    p.add_argument("--nbuf", type=int, default=4)
    p.add_argument("--objective", default="max")
    p.add_argument("--write", action="store_true")
    p.add_argument("--json", default=None)
    a = parse_args(p, argv)         # + --no-progress
    params, rows = {}, []
    t0 = time.time()
    for k in progress(range(1, a.max_log2 + 1), "horizons 2^k"):
        n = 2 ** k
        blt = optimize_blt(n, a.nbuf, a.objective)
        params[f"n={n},nbuf={a.nbuf},objective={a.objective}"] = blt.to_dict()
        e, tr, sq = blt.error_profile(16 * n), tree_error_profile(n), sqrt_toeplitz_error_profile(n)
        rows.append({"n": n, "blt max": e[n - 1], "blt mean": e[:n].mean(), "tree max": tr.max(),
                     "tree mean": tr.mean(), "sqrt max": sq.max(), "sqrt mean": sq.mean(),
                     "blt/tree worst step": float((e[:n] / tr).max()),
                     "var(2n)/var(n)": e[2 * n - 1] / e[n - 1], "var(4n)/var(n)": e[4 * n - 1] / e[n - 1],
                     "var(16n)/var(n)": e[16 * n - 1] / e[n - 1], "‖c‖²": blt.sensitivity_squared()})
        print(rows[-1], flush=True)
    cols = list(rows[0])
    print(f"\n## BLT ({a.nbuf} buffers, {a.objective} objective) vs tree vs sqrt-Toeplitz: release "
          "variance in units of Δ²/(2ρ)\n")
    print(markdown_table(rows, cols))
    print(f"\ntotal {time.time() - t0:.0f} s")
    if a.write:
        _PARAMS_FILE.write_text(json.dumps({
            "generated_by": "python benchmarks/blt_params.py --write", "params": params},
            indent=1, sort_keys=True) + "\n")
        print(f"wrote {_PARAMS_FILE}")
    write_json(a.json, {"setting": vars(a), "rows": rows})


if __name__ == "__main__":
    main()
