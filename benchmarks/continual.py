"""Continual release: error of the last release for R releases under one (ε, δ) budget.

Setting: the synthetic recovery benchmark (d = 1000, k = 10, α0 = 1, topic-word
Dirichlet(0.05), lengths Poisson(50)+3, warm-up 100k, stream 200k), ε = 1,
δ = 1e-6 for the whole stream. The stream is cut into R epochs by document
timestamp (uniform over the stream's time span) and a release follows every
epoch. Three ways to spend one ρ over R releases:

  (a) cumulative  — re-noise the cumulative sums at every release: ρ/R each
                    (a document of epoch 1 is in all R releases);
  (b) disjoint    — noise each epoch's sums once at full ρ (parallel composition)
                    and release the sum of the R noised epochs: R noise draws;
  (c) tree        — binary tree over epochs, ρ_node = ρ / (⌊log2 R⌋ + 1);
                    the release at t sums popcount(t) nodes.

For R a power of two the tree's last release is one node (the root), its best
case; the column ``tree t=R-1`` shows its worst case (depth − 1 nodes).
Every method spends through its own real Accountant (ε, δ) on the stream
atoms — the warm-up is a disjoint atom (parallel composition) — and the table
shows the worst-case ε each accountant reports after all R releases.

    python benchmarks/continual.py                       # R = 1, 16, 256, 1024; 3 seeds
    python benchmarks/continual.py --releases 1,16 --seeds 1 --json out.json
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_json  # noqa: E402

from streamdp import EpochClock, StreamingSpectralLDA  # noqa: E402
from streamdp.continual import EpochSketches, SketchNodeMechanism, zero_sums  # noqa: E402
from streamdp.evaluation import matched_topic_error  # noqa: E402
from streamdp.privacy.accountant import Accountant  # noqa: E402
from streamdp.privacy.events import EventLog, epoch_partition  # noqa: E402
from streamdp.privacy.memory_ledger import MemoryLedger  # noqa: E402
from streamdp.privacy.noise import CSPRNGGaussianSampler  # noqa: E402
from streamdp.privacy.tree import TreeAggregator, covering_levels, tree_depth  # noqa: E402
from streamdp.release import BudgetSplit, decompose_sums, noise_scales, noise_sums, plan_release  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402

BATCH = 8192


def prepare(seed, d, k, n_warm, n_stream, max_epochs, eps, delta):
    """Warm up privately, then sketch the stream into max_epochs timestamp epochs."""
    model = make_lda_model(d, k, alpha0=1.0, beta=0.05, seed=1000 + seed)
    X = sample_documents(model, n_warm + n_stream, mean_length=50, length_offset=3,
                         seed=2000 + seed)
    est = StreamingSpectralLDA(k, 1.0, epsilon=eps, delta=delta, seed=seed,
                               noise_seed=10_000 + seed, accountant=EventLog())
    for s in range(0, n_warm, BATCH):
        est.warmup(X[s:min(s + BATCH, n_warm)])
    est._fix_subspace()          # warm-up spends its own atom's budget here
    sub, clip = est.subspace_, est.clip
    # timestamps spread evenly over [0, max_epochs): epoch t holds n_stream/max_epochs docs
    clock = EpochClock(stream_start=0.0, epoch_seconds=1.0)
    ts = (np.arange(n_stream) + 0.5) * (max_epochs / n_stream)
    epochs = EpochSketches(sub, clip, clock)
    for s in range(0, n_stream, BATCH):
        e = min(s + BATCH, n_stream)
        epochs.add(X[n_warm + s:n_warm + e], ts[s:e])
    leaves = [sums if sums is not None else zero_sums(sub) for _, sums in epochs.pop_through(max_epochs)]
    return model, sub, clip, leaves


def coarsen(leaves, R):
    """Epoch sums for R epochs from the finest ones (R divides len(leaves))."""
    g = len(leaves) // R
    out = []
    for i in range(R):
        total = leaves[i * g]
        for x in leaves[i * g + 1:(i + 1) * g]:
            total = total + x
        out.append(total)
    return out


def error(model, sums, sub, sd, k):
    tw, _, _ = decompose_sums(sums, sub, n_topics=k, alpha0=1.0, noise_sd=sd)
    return matched_topic_error(model.topics, tw)["l2_mean"]


def run(model, sub, clip, epoch_sums, k, eps, delta, seed):
    R = len(epoch_sums)
    row = {"releases": R}
    # (a) re-noise cumulative sums at every release, ρ/R each
    acct = Accountant(eps, delta, MemoryLedger())
    rho, sampler = acct.rho_budget, CSPRNGGaussianSampler(50_000 + seed)
    total = None
    for t, s in enumerate(epoch_sums, start=1):
        total = s if total is None else total + s
        events = plan_release(rho / R, clip, BudgetSplit(), "tensor")
        tok = acct.reserve(events, label=f"cumulative:{t}")
        noisy = noise_sums(total, events, sampler, sub.Q)
        acct.commit(tok)
    row["cumulative"] = error(model, noisy, sub, noise_scales(events), k)
    row["eps_a"] = acct.report()["epsilon_worst_case"]
    # (b) each epoch noised once at full ρ; the release sums all noised epochs
    acct = Accountant(eps, delta, MemoryLedger())
    released = None
    for t, s in enumerate(epoch_sums, start=1):
        events = plan_release(rho, clip, BudgetSplit(), "tensor", partition=epoch_partition(t, t))
        tok = acct.reserve(events, label=f"disjoint:{t}")
        noisy = noise_sums(s, events, sampler, sub.Q)
        acct.commit(tok)
        released = noisy if released is None else released + noisy
    row["disjoint"] = error(model, released, sub, noise_scales(events, math.sqrt(R)), k)
    row["eps_b"] = acct.report()["epsilon_worst_case"]
    # (c) binary tree over the R epochs
    acct = Accountant(eps, delta, MemoryLedger())
    mech = SketchNodeMechanism(sub, clip, BudgetSplit(), rho / tree_depth(R), sampler)
    tree = TreeAggregator(R, mech, acct, label="tree")
    before_last = None
    for t, s in enumerate(epoch_sums, start=1):
        out = tree.add_epoch(s)
        if t == R - 1:
            before_last = error(model, out, sub,
                                noise_scales(mech.plan("stream"), math.sqrt(len(covering_levels(t)))), k)
    row["tree"] = error(model, out, sub,
                        noise_scales(mech.plan("stream"), math.sqrt(len(covering_levels(R)))), k)
    row["tree_t=R-1"] = before_last
    row["eps_c"] = acct.report()["epsilon_worst_case"]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--releases", default="1,16,256,1024")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--d", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--warmup", type=int, default=100_000)
    p.add_argument("--stream", type=int, default=200_000)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    Rs = [int(r) for r in a.releases.split(",")]
    finest = max(Rs)
    if any(finest % R for R in Rs):
        p.error("every release count must divide the largest one")
    t0 = time.time()
    per_seed = []
    for seed in range(a.seeds):
        model, sub, clip, leaves = prepare(seed, a.d, a.k, a.warmup, a.stream, finest,
                                           a.epsilon, a.delta)
        for R in Rs:
            row = run(model, sub, clip, coarsen(leaves, R), a.k, a.epsilon, a.delta, seed)
            row["seed"] = seed
            per_seed.append(row)
            print(row, flush=True)
    cols = ["cumulative", "disjoint", "tree", "tree_t=R-1"]
    rows = []
    for R in Rs:
        rs = [r for r in per_seed if r["releases"] == R]
        row = {"releases": R}
        for c in cols:
            vals = [r[c] for r in rs if r[c] is not None]
            row[c] = float(np.mean(vals)) if vals else None
        row["max accounted ε"] = max(max(r["eps_a"], r["eps_b"], r["eps_c"]) for r in rs)
        rows.append(row)
    print(f"\n## Error of the last release, ε = {a.epsilon:g}, δ = {a.delta:g} for all releases "
          f"(mean matched L2 over {a.seeds} seed(s))\n")
    print(markdown_table(rows, ["releases"] + cols + ["max accounted ε"]))
    print(f"\ntotal {time.time() - t0:.0f} s")
    write_json(a.json, {"setting": vars(a), "rows": rows, "per_seed": per_seed})


if __name__ == "__main__":
    main()
