"""Documents needed for distinct topics at ε = 1 (issue 22): Debian subsamples.

The ``debian`` protocol of ``compare.py`` (d = 5000, k = 20, 10% held out, the first 30% of the
rest warm up), with only the first ``fraction`` of the stream rows kept: distinct topics
(``streamdp.evaluation.distinct``), NPMI and median topic NPMI of the refined release at ε per
stream size. Run it once per code version (``PYTHONPATH`` picks the ``streamdp`` it imports) and
print two runs side by side::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/docs_needed.py --label new \\
        --json benchmarks/results/docs_needed_new.json
    OMP_NUM_THREADS=1 PYTHONPATH=/path/to/base python benchmarks/docs_needed.py --label base \\
        --json benchmarks/results/docs_needed_base.json
    python benchmarks/docs_needed.py --side-by-side benchmarks/results/docs_needed_base.json \\
        benchmarks/results/docs_needed_new.json

"Documents needed" is the smallest stream size whose mean over seeds reaches ``--target``
distinct topics; a run where no size reaches it says "> the largest size" (Debian has 38.7k
stream documents: beyond that, the semi-synthetic ``stream_size.py`` table).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, write_json  # noqa: E402


def run(a) -> dict:
    import compare as C
    import streamdp
    from streamdp.evaluation.coherence import npmi_coherence
    from streamdp.evaluation.corpora import shuffle_split
    from streamdp.evaluation.distinct import reader_metrics

    cfg = (C.SMOKE if a.smoke else C.FULL)["debian"]
    corpus = C.debian_descriptions_corpus(path=a.debian_list, limit=cfg["limit"],
                                          max_words=cfg["max_words"])
    rows = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        train, test = shuffle_split(corpus.n_docs, seed=seed, test_fraction=cfg["test_fraction"])
        X = corpus.counts[train].tocsr()
        n_warm = int(round(cfg["warmup_fraction"] * len(train)))
        ref = [corpus.tokens[i] for i in test]
        for frac in [float(f) for f in a.fractions.split(",")]:
            n_stream = int(round(frac * (X.shape[0] - n_warm)))
            Xf = X[:n_warm + n_stream]
            B, info = C.fit_streamdp(Xf, n_warm, cfg["k"], a.epsilon, seed)
            coh = npmi_coherence(B, corpus.vocabulary, ref, topn=10, window_size=10)
            r = reader_metrics(B, np.asarray(Xf.sum(axis=0)).ravel(), npmi_per_topic=coh["per_topic"])
            row = {"seed": seed, "stream_docs": n_stream, "distinct": r["distinct"],
                   "npmi": coh["npmi"], "npmi_median": r["npmi_median"], "start": info.get("start")}
            rows.append(row)
            print(row, flush=True)
    return {"label": a.label, "epsilon": a.epsilon, "target": a.target, "rows": rows,
            "streamdp_path": str(Path(streamdp.__file__).resolve().parent)}


def summary(result: dict) -> list[dict]:
    """Mean, min and max over seeds per stream size."""
    out = []
    for n in sorted({r["stream_docs"] for r in result["rows"]}):
        rs = [r for r in result["rows"] if r["stream_docs"] == n]
        dist = [r["distinct"] for r in rs]
        out.append({"stream_docs": n, "distinct": float(np.mean(dist)), "min": min(dist),
                    "max": max(dist), "npmi": float(np.mean([r["npmi"] for r in rs])),
                    "seeds": len(rs)})
    return out


def needed(summ: list[dict], target: float) -> str:
    hit = [s["stream_docs"] for s in summ if s["distinct"] >= target]
    return f"{min(hit):,}" if hit else f"> {max(s['stream_docs'] for s in summ):,}"


def side_by_side(paths: list[str]) -> None:
    results = [json.loads(Path(p).read_text()) for p in paths]
    sums = [summary(r) for r in results]
    sizes = sorted({s["stream_docs"] for sm in sums for s in sm})
    cols = ["stream_docs"]
    table = []
    for n in sizes:
        row = {"stream_docs": n}
        for r, sm in zip(results, sums):
            s = next((x for x in sm if x["stream_docs"] == n), None)
            if s is not None:
                row[f"{r['label']} distinct"] = f"{s['distinct']:.1f} ({s['min']}–{s['max']})"
                row[f"{r['label']} NPMI"] = round(s["npmi"], 3)
        table.append(row)
    for r in results:
        cols += [f"{r['label']} distinct", f"{r['label']} NPMI"]
    eps = results[0]["epsilon"]
    print(f"\n### Debian subsamples at ε = {eps:g}: distinct topics of 20 (mean, min–max over seeds)\n")
    print(markdown_table(table, cols))
    print()
    for r, sm in zip(results, sums):
        print(f"- {r['label']}: documents needed for ≥ {r['target']:g}/20 distinct: "
              f"{needed(sm, r['target'])}")


def cfg_k(a) -> int:
    import compare as C
    return (C.SMOKE if a.smoke else C.FULL)["debian"]["k"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fractions", default="0.25,0.5,0.75,1.0",
                   help="shares of Debian's stream rows to keep (default %(default)s)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--target", type=float, default=10.0)
    p.add_argument("--label", default="streamdp")
    p.add_argument("--debian-list", default=None, metavar="PATH")
    p.add_argument("--smoke", action="store_true", help="compare.py's tiny debian sizes (CI)")
    p.add_argument("--json", default=None)
    p.add_argument("--side-by-side", nargs="+", metavar="JSON",
                   help="print runs written by --json side by side (no fitting)")
    a = parse_args(p, argv)
    if a.side_by_side:
        side_by_side(a.side_by_side)
        return 0
    result = run(a)
    write_json(a.json, result)
    side_by_side_rows = summary(result)
    print(markdown_table(side_by_side_rows, ["stream_docs", "distinct", "min", "max", "npmi"]))
    print(f"documents needed for ≥ {a.target:g}/{cfg_k(a)} distinct: "
          f"{needed(side_by_side_rows, a.target)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
