"""Quick look at the refinement starts on Debian (issue 22): distinct topics, NPMI, perplexity.

    nice python benchmarks/start_quick.py EPSILONS [START] [SEED] [N_TRAIN]
    nice python benchmarks/start_quick.py 1,2,4,8,none "" 0      # start="auto" (the default)
    nice python benchmarks/start_quick.py 4,1 cluster 0          # force a start

The issue's protocol in one process per seed (benchmarks/compare.py is the full record):
d = 5000, k = 20, 10% held out, 30% of the rest warm up by timestamp, δ = 1e-6, α0 = 1,
``sampler="fast"`` with ``noise_seed`` (benchmarks only). Prints one JSON line per ε.
"""
import sys, time, warnings, json
import numpy as np
warnings.filterwarnings("ignore")
import streamdp
from streamdp.evaluation.corpora import debian_descriptions_corpus, shuffle_split
from streamdp.evaluation.coherence import npmi_coherence
from streamdp.evaluation.metrics import document_completion_perplexity
from streamdp.evaluation.distinct import reader_metrics
eps_list = [None if e == "none" else float(e) for e in sys.argv[1].split(",")]
start = (sys.argv[2] or None) if len(sys.argv) > 2 else None
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
nsub = int(sys.argv[4]) if len(sys.argv) > 4 else 0
c = debian_descriptions_corpus()
train, test = shuffle_split(c.n_docs, seed=seed, test_fraction=0.1)
if nsub: train = train[:nsub]
X, Xt = c.counts[train], c.counts[test]
ref = [c.tokens[i] for i in test]
wc = np.asarray(X.sum(axis=0)).ravel()
n = X.shape[0]; nw = int(round(0.3 * n)); ts = np.arange(n, dtype=float)
for eps in eps_list:
    kw = dict(alpha0=1.0, epsilon=eps, delta=1e-6, timestamps=ts, stream_start=float(nw), seed=seed)
    if eps is None: kw["non_private"] = True
    else: kw.update(sampler="fast", noise_seed=seed, non_production=True)
    if start: kw["start"] = start
    t0 = time.time(); snap = streamdp.fit(X, 20, **kw); ft = time.time() - t0
    B = snap.topic_word
    coh = npmi_coherence(B, c.vocabulary, ref, topn=10, window_size=10)
    ppl = document_completion_perplexity(B, Xt, seed=seed)
    r = reader_metrics(B, wc, npmi_per_topic=coh["per_topic"])
    print(json.dumps({"eps": eps, "start": start, "n": n, "npmi": round(coh["npmi"], 4), "distinct": r["distinct"],
           "med": round(r["npmi_median"], 3), "bg": round(r["background_share"], 2), "div": round(r["diversity"], 2),
           "ppl": round(ppl["perplexity"], 1), "zero": ppl["zero_probability_tokens"], "fit_s": round(ft, 1)}), flush=True)
