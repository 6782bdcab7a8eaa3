"""Vocabulary table (issue 11): corpus-top-5000 vs public vs privately selected vocabularies.

    nice python benchmarks/vocabulary.py --seeds 0,1,2,3,4 --json benchmarks/results/vocabulary.json
    python benchmarks/vocabulary.py --smoke                       # CI-sized, < 1 minute

Same corpora, split and estimator path as ``benchmarks/compare.py`` (its ``text_section``:
seeded shuffle, 10% held out, the first 30% of the rest warm up, k = 20 Debian / 5 BBC,
streamdp refined release via ``compare.fit_streamdp``). Vocabularies, at ε ∈ {1, 4}:

* ``corpus-top-5000`` — the 5,000 most frequent words of the protected corpus itself ("public by
  assumption", every other table of docs/benchmarks.md);
* ``wordfreq-5000`` — the 5,000 most frequent public words (``streamdp vocab public``), zero cost;
* ``dp-selected`` — noisy document-frequency top 5,000 over wordfreq's top 100,000 plus new words
  by OpenDP partition selection (``SelectionConfig()`` defaults);
* ``wordfreq ∪ dp-new`` — wordfreq's top 5,000 plus the new words (``candidates="public"``).

The private selections use a *selection slice*: the warm-up documents whose content hash falls
in the first ``--slice-share`` of the hash range (a rule of each document alone). Those documents
are removed from the warm-up (they are their own accounting atom, parallel composition), so every
document's ε is the stated ε: the selection's cost is paid in documents, not in ε. The other
vocabularies keep the whole warm-up.

Metrics: NPMI (gensim c_npmi, top 10, window 10, reference: held-out documents' tokens — the same
for every vocabulary), document-completion perplexity over the vocabulary's own columns
(comparable only between equal d), held-out token coverage (share of held-out tokens, after stop
words, that the vocabulary contains), d, and the selection's noisy counts.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))   # this checkout's streamdp, not an installed one
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402
from compare import DELTA, fit_streamdp  # noqa: E402

from streamdp.evaluation import document_completion_perplexity  # noqa: E402
from streamdp.evaluation.corpora import (bbc_news_corpus, debian_descriptions_corpus,  # noqa: E402
                                         shuffle_split)
from streamdp.privacy.noise import make_sampler  # noqa: E402
from streamdp.text.public_vocab import public_vocabulary  # noqa: E402
from streamdp.text.vocab_selection import (InsufficientSelection, SelectionConfig,  # noqa: E402
                                           document_key, in_selection_slice,
                                           select_from_documents)
from streamdp.text.vocabulary import Vocabulary  # noqa: E402

FULL = {"debian": dict(k=20, limit=None), "bbc": dict(k=5, limit=None)}
SMOKE = {"debian": dict(k=5, limit=3000), "bbc": dict(k=5, limit=600)}
SIZE = 5000
N_CANDIDATES = 100_000


def coverage(vocab: Vocabulary, docs) -> float:
    total = sum(len(d) for d in docs)
    hit = sum(1 for d in docs for t in d if t in vocab)
    return hit / max(total, 1)


def corpus_section(name: str, corpus, cfg: dict, seed: int, epsilons, slice_share: float,
                   candidates: Vocabulary, public5k: Vocabulary) -> list[dict]:
    from streamdp.evaluation.coherence import npmi_coherence
    k = cfg["k"]
    train, test = shuffle_split(corpus.n_docs, seed=seed, test_fraction=0.1)
    toks = corpus.tokens
    n_warm = int(round(0.3 * len(train)))
    warm, stream = train[:n_warm], train[n_warm:]
    in_slice = np.array([in_selection_slice(document_key(toks[i]), slice_share) for i in warm])
    warm_rest, slice_docs = warm[~in_slice], warm[in_slice]
    ref_texts = [toks[i] for i in test]
    print(f"\n[{name} seed {seed}] train {len(train)} (warm-up {n_warm}: selection slice "
          f"{len(slice_docs)} + whitening {len(warm_rest)}; stream {len(stream)}), held out "
          f"{len(test)}", flush=True)
    rows = []

    def run(label, vocab, eps, warm_rows, extra):
        order = np.concatenate([warm_rows, stream])
        X, _ = vocab.vectorize([toks[i] for i in order])
        X_test, _ = vocab.vectorize([toks[i] for i in test])
        t0 = time.perf_counter()
        B, info = fit_streamdp(X, len(warm_rows), k, eps, seed, refine=True)
        coh = npmi_coherence(B, vocab, ref_texts, topn=10, window_size=10)
        ppl = document_completion_perplexity(B, X_test, seed=seed)
        row = {"corpus": name, "seed": seed, "vocabulary": label, "epsilon": eps, "d": len(vocab),
               "npmi": coh["npmi"], "perplexity": ppl["perplexity"],
               "coverage": coverage(vocab, ref_texts), "n_warmup": len(warm_rows),
               "fit_seconds": time.perf_counter() - t0,
               "top_words": [[vocab[j] for j in np.argsort(-b, kind="stable")[:8]]
                             for b in B[:5]], **extra}
        rows.append(row)
        print({c: (round(v, 4) if isinstance(v, float) else v) for c, v in row.items()
               if c != "top_words"}, flush=True)

    corpus_vocab = Vocabulary.build([toks[i] for i in train], max_words=SIZE)
    for eps in epsilons:
        run("corpus-top-5000 (public by assumption)", corpus_vocab, eps, warm, {"selection_eps": None})
        run("wordfreq-5000", public5k, eps, warm, {"selection_eps": 0.0})
        for label, sel_cfg in (("dp-selected", SelectionConfig(size=SIZE, slice_share=slice_share)),
                               ("wordfreq-5000 + dp-new", SelectionConfig(
                                   size=SIZE, candidates="public", slice_share=slice_share))):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sampler = make_sampler("fast", seed=20_000 + seed)
            try:
                sel = select_from_documents([toks[i] for i in slice_docs], epsilon=eps,
                                            delta=DELTA, config=sel_cfg, candidates=candidates,
                                            sampler=sampler)
            except InsufficientSelection as exc:
                print(f"NOTE: {label} at eps={eps}: {exc}", flush=True)
                rows.append({"corpus": name, "seed": seed, "vocabulary": label, "epsilon": eps,
                             "d": 0, "failed": str(exc)})
                continue
            r = sel.report
            run(label, sel.vocabulary, eps, warm_rest,
                {"selection_eps": r["epsilon_of_selection_documents"],
                 "n_from_candidates": r["n_from_candidates"], "n_new_words": r["n_new_words"],
                 "n_above_cut": r["n_candidates_above_cut"],
                 "new_words_sample": sel.vocabulary.words[r["n_from_candidates"]:][:15]})
    return rows


def mean_table(rows: list[dict]) -> list[dict]:
    out = []
    keys = []
    for r in rows:
        key = (r["corpus"], r["vocabulary"], r["epsilon"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        rs = [r for r in rows if (r["corpus"], r["vocabulary"], r["epsilon"]) == key and "npmi" in r]
        if not rs:
            out.append({"corpus": key[0], "vocabulary": key[1], "epsilon": key[2], "npmi": None})
            continue
        m = {"corpus": key[0], "vocabulary": key[1], "epsilon": key[2], "seeds": len(rs)}
        for c in ("d", "npmi", "perplexity", "coverage", "n_warmup", "n_new_words", "n_above_cut"):
            vals = [r[c] for r in rs if r.get(c) is not None]
            m[c] = float(np.mean(vals)) if vals else None
        m["npmi_sd"] = float(np.std([r["npmi"] for r in rs])) if len(rs) > 1 else None
        m["selection_eps"] = rs[0].get("selection_eps")
        out.append(m)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--sections", default="debian,bbc")
    p.add_argument("--seeds", default="0")
    p.add_argument("--epsilons", default="1,4")
    p.add_argument("--slice-share", type=float, default=0.25,
                   help="share of the warm-up documents in the selection slice")
    p.add_argument("--debian-list", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--combine", nargs="+", metavar="JSON",
                   help="only print the tables of the rows of earlier --json files together "
                        "(e.g. runs over different seeds of the same setting)")
    a = parse_args(p, argv)         # + --no-progress
    if a.combine:
        import json
        rows, seeds = [], []
        for path in a.combine:
            with open(path) as fh:
                r = json.load(fh)
            rows += r["rows"]
            seeds += r["seeds"]
        return report(rows, seeds, a.json, r.get("slice_share"))
    sizes = SMOKE if a.smoke else FULL
    seeds = [int(s) for s in a.seeds.split(",")]
    epsilons = [float(e) for e in a.epsilons.split(",")]
    candidates = public_vocabulary("en", size=N_CANDIDATES)[0]
    public5k = Vocabulary(candidates.words[:SIZE])
    rows: list[dict] = []
    for sec in a.sections.split(","):
        cfg = sizes[sec]
        try:
            corpus = (debian_descriptions_corpus(path=a.debian_list, limit=cfg["limit"])
                      if sec == "debian" else bbc_news_corpus(limit=cfg["limit"]))
        except FileNotFoundError as exc:
            print(f"NOTE: {sec} skipped: {exc}")
            continue
        for seed in progress(seeds, f"{sec}: seeds"):
            rows += corpus_section(sec, corpus, cfg, seed, epsilons, a.slice_share, candidates,
                                   public5k)
    return report(rows, seeds, a.json, a.slice_share)


def report(rows: list[dict], seeds: list[int], json_path, slice_share) -> int:
    table = mean_table(rows)
    cols = ["corpus", "vocabulary", "epsilon", "seeds", "d", "n_above_cut", "n_new_words", "npmi",
            "npmi_sd",
            "perplexity", "coverage", "n_warmup", "selection_eps"]
    print(f"\n### Vocabularies (mean over seeds {seeds}; δ = {DELTA})\n")
    print(md := markdown_table(table, cols))
    targets = []
    for corpus in {r["corpus"] for r in table}:
        ref = next((r for r in table if r["corpus"] == corpus and r["epsilon"] == 4.0
                    and r["vocabulary"].startswith("corpus-top")), None)
        priv = [r for r in table if r["corpus"] == corpus and r["epsilon"] == 4.0
                and r["vocabulary"] in ("dp-selected", "wordfreq-5000 + dp-new", "wordfreq-5000")
                and r.get("npmi") is not None]
        if ref and priv:
            best = max(priv, key=lambda r: r["npmi"])
            gap = ref["npmi"] - best["npmi"]
            targets.append({"corpus": corpus, "best_private": best["vocabulary"],
                            "npmi_best_private": best["npmi"], "npmi_corpus_top": ref["npmi"],
                            "gap": gap, "met (gap <= 0.02)": bool(gap <= 0.02)})
    if targets:
        print("\n### Target: best private vocabulary within 0.02 NPMI of corpus-top-5000 at ε = 4\n")
        print(markdown_table(targets, list(targets[0])))
    write_json(json_path, {"rows": rows, "table": table, "targets": targets, "markdown": md,
                           "seeds": seeds, "slice_share": slice_share})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
