"""Quick look at the refinement starts on Debian (issue 22): distinct topics, NPMI, perplexity.

    nice python benchmarks/start_quick.py --epsilons 1,2,4,8,none --seeds 0,1,2   # start="auto"
    nice python benchmarks/start_quick.py --epsilons 4,1 --start cluster           # force a start

The issue's protocol in one process (benchmarks/compare.py is the full record): d = 5000,
k = 20, 10% held out, 30% of the rest warm up by timestamp, δ = 1e-6, α0 = 1,
``sampler="fast"`` with ``noise_seed`` (benchmarks only). Prints one JSON line per (seed, ε).
"""
from __future__ import annotations

import argparse
import json
import time
import warnings

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_json  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", default="4,1", help="comma-separated; 'none' = non-private")
    p.add_argument("--start", default="auto", help="auto, tensor or cluster")
    p.add_argument("--seeds", default="0")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--n-train", type=int, default=0, help="use only this many training rows")
    p.add_argument("--debian-list", default=None, help="a Translation-en list (default: apt's)")
    p.add_argument("--json", default=None, help="write the rows here")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    import streamdp
    from streamdp.evaluation.coherence import npmi_coherence
    from streamdp.evaluation.corpora import debian_descriptions_corpus, shuffle_split
    from streamdp.evaluation.distinct import reader_metrics
    from streamdp.evaluation.metrics import document_completion_perplexity
    rows = []
    c = debian_descriptions_corpus(**({"path": a.debian_list} if a.debian_list else {}))
    for seed in [int(s) for s in a.seeds.split(",")]:
        train, test = shuffle_split(c.n_docs, seed=seed, test_fraction=0.1)
        if a.n_train:
            train = train[:a.n_train]
        X, Xt = c.counts[train], c.counts[test]
        ref = [c.tokens[i] for i in test]
        wc = np.asarray(X.sum(axis=0)).ravel()
        n = X.shape[0]
        nw = int(round(0.3 * n))
        ts = np.arange(n, dtype=float)
        for e in a.epsilons.split(","):
            eps = None if e == "none" else float(e)
            kw = dict(alpha0=1.0, epsilon=eps, delta=1e-6, timestamps=ts, stream_start=float(nw),
                      seed=seed, start=a.start)
            if eps is None:
                kw["non_private"] = True
            else:
                kw.update(sampler="fast", noise_seed=seed, non_production=True)
            t0 = time.time()
            snap = streamdp.fit(X, a.k, **kw)
            ft = time.time() - t0
            B = snap.topic_word
            coh = npmi_coherence(B, c.vocabulary, ref, topn=10, window_size=10)
            ppl = document_completion_perplexity(B, Xt, seed=seed)
            r = reader_metrics(B, wc, npmi_per_topic=coh["per_topic"])
            rows.append({
                "seed": seed, "eps": eps, "start": (snap.privacy.get("start") or {}).get("kind"),
                "n_train": n, "npmi": round(coh["npmi"], 4), "distinct": r["distinct"],
                "npmi_median": round(r["npmi_median"], 3), "background_share": round(r["background_share"], 2),
                "diversity": round(r["diversity"], 2), "perplexity": round(ppl["perplexity"], 1),
                "zero_prob_tokens": ppl["zero_probability_tokens"], "fit_s": round(ft, 1)})
            print(json.dumps(rows[-1]), flush=True)
    print(markdown_table(rows, list(rows[0])))
    write_json(a.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
