"""Continual release: the error of *every* release against a one-shot release, per mechanism.

Setting: the synthetic recovery benchmark (d = 1000, k = 10, α0 = 1, topic-word
Dirichlet(0.05), lengths Poisson(50)+3, warm-up 100k, stream 200k), ε = 1, δ = 1e-6 for
the whole stream. The stream is cut into R epochs by document timestamp (uniform over the
stream's time span) and a release follows every epoch. For each release t the matched L2
topic error is compared with a **one-shot release of the same cumulative documents at the
same ε** (the whole ρ on that one release): ratio_t = error_t / one-shot error_t, the price
of releasing continually.

Mechanisms (``--mechanisms``):

  tree   binary tree over epochs, ρ_node = ρ/(⌊log2 R⌋+1), through TreeAggregator + Accountant;
  blt    BLT matrix factorization (streamdp/privacy/blt.py, 4 buffers, parameters for n = R),
         σ from the infinite-horizon ‖c‖², through BLTAggregator + Accountant;
  sqrt   reference: the full-memory square-root Toeplitz factorization (O(t) state, bounded
         horizon R, ‖c‖² over R steps). Simulated from its exact marginal: the release at t is
         the cumulative sums plus N(0, σ²·Σ_{m<t}P_m²) per coordinate (not accounted);
  cumulative, disjoint
         the naive baselines (re-noise at ρ/R; noise every epoch at full ρ), also marginal.

A release's error depends only on the marginal law of its own noise, so the marginal
simulation of ``sqrt``/``cumulative``/``disjoint`` measures exactly what a real run would.
Evaluated releases: every one for R ≤ ``--all-steps`` (default 256); above it a fixed sample:
48 uniform random steps (seed 0, used for the mean) plus the powers of two, 2^k − 1 and the
tree's worst steps (used for the worst case). The exact variance profiles (in units of
Δ²/2ρ, all R steps) are printed too.

    python benchmarks/continual.py                           # R = 16, 256, 1024; 3 seeds
    python benchmarks/continual.py --releases 16 --seeds 1 --json out.json --plot out.png
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

from streamdp import EpochClock, StreamingSpectralLDA  # noqa: E402
from streamdp.continual import EpochSketches, SketchNodeMechanism, zero_sums  # noqa: E402
from streamdp.evaluation import matched_topic_error  # noqa: E402
from streamdp.privacy.accountant import Accountant  # noqa: E402
from streamdp.privacy.blt import (BLTAggregator, calibrate_unit_rho, default_params, sqrt_toeplitz_coefs,  # noqa: E402
                                  sqrt_toeplitz_error_profile, tree_error_profile)
from streamdp.privacy.events import STREAM, EventLog, GaussianEvent  # noqa: E402
from streamdp.privacy.memory_ledger import MemoryLedger  # noqa: E402
from streamdp.privacy.noise import CSPRNGGaussianSampler  # noqa: E402
from streamdp.privacy.tree import TreeAggregator, covering_levels, tree_depth  # noqa: E402
from streamdp.privacy.plan import BudgetSplit, plan_release  # noqa: E402
from streamdp.release import decompose_sums, noise_scales, noise_sums  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402

BATCH = 8192
ALL = ("tree", "blt", "sqrt", "cumulative", "disjoint")


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
    clock = EpochClock(stream_start=0.0, epoch_seconds=1.0)
    ts = (np.arange(n_stream) + 0.5) * (max_epochs / n_stream)
    epochs = EpochSketches(sub, clip, clock)
    for s in range(0, n_stream, BATCH):
        e = min(s + BATCH, n_stream)
        epochs.add(X[n_warm + s:n_warm + e], ts[s:e])
    leaves = [sums.sketch if sums is not None else zero_sums(sub)
              for _, sums in epochs.pop_through(max_epochs)]
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


def steps_to_evaluate(R, all_steps):
    """(evaluated steps, steps entering the mean): all, or a fixed sample (module docstring)."""
    if R <= all_steps:
        every = list(range(1, R + 1))
        return every, every
    uniform = sorted(set(np.random.default_rng(0).choice(np.arange(1, R + 1), min(48, R), replace=False).tolist()))
    special = {1, R}
    p = 1
    while p <= R:
        special.update({p, p - 1} - {0})
        p *= 2
    # the tree's worst steps: most set bits (R−1 and its neighbours of high popcount)
    pops = np.array([bin(t).count("1") for t in range(1, R + 1)])
    special.update((np.flatnonzero(pops >= pops.max() - 1) + 1).tolist())
    return sorted(set(uniform) | special), uniform


def error(model, sums, sub, sd, k):
    tw, _, _ = decompose_sums(sums, sub, n_topics=k, alpha0=1.0, noise_sd=sd)
    return matched_topic_error(model.topics, tw)["l2_mean"]


def scaled_plan(events, multiplier):
    """The plan's blocks with σ multiplied (a marginal draw of correlated noise)."""
    return [GaussianEvent(e.block, e.sensitivity, e.sigma * multiplier, partition=e.partition,
                          mechanism=e.mechanism) for e in events]


def run(model, sub, clip, epoch_sums, k, eps, delta, seed, mechanisms, all_steps):
    R = len(epoch_sums)
    steps, mean_steps = steps_to_evaluate(R, all_steps)
    want = set(steps)
    rho = Accountant(eps, delta, MemoryLedger()).rho_budget
    sampler = CSPRNGGaussianSampler(50_000 + seed)
    one = plan_release(rho, clip, BudgetSplit(), "tensor")
    rows = {t: {"R": R, "seed": seed, "t": t} for t in steps}
    prefix = {}
    total = None
    for t, s in enumerate(epoch_sums, start=1):
        total = s if total is None else total + s
        if t in want:
            prefix[t] = total
            rows[t]["one_shot"] = error(model, noise_sums(total, one, sampler, sub.Q), sub,
                                        noise_scales(one), k)
    accounted = {}
    if "tree" in mechanisms:
        acct = Accountant(eps, delta, MemoryLedger())
        mech = SketchNodeMechanism(sub, clip, BudgetSplit(), rho / tree_depth(R), sampler)
        tree = TreeAggregator(R, mech, acct, label="tree")
        for t, s in enumerate(epoch_sums, start=1):
            out = tree.add_epoch(s)
            if t in want:
                sd = noise_scales(mech.plan(STREAM), math.sqrt(len(covering_levels(t))))
                rows[t]["tree"] = error(model, out.sketch, sub, sd, k)
        accounted["tree"] = acct.report()["epsilon_worst_case"]
    if "blt" in mechanisms:
        acct = Accountant(eps, delta, MemoryLedger())
        params = default_params(R)
        # ρ_unit ≈ ρ/(‖c‖² + rounding over T_max), charged ≤ ρ (calibrate_unit_rho)
        unit_rho = calibrate_unit_rho(rho, lambda r: BLTAggregator(
            params, SketchNodeMechanism(sub, clip, BudgetSplit(), r, sampler)))
        mech = SketchNodeMechanism(sub, clip, BudgetSplit(), unit_rho, sampler)
        blt = BLTAggregator(params, mech, acct, label="blt")
        for t, s in enumerate(epoch_sums, start=1):
            out = blt.add_epoch(s)
            if t in want:
                rows[t]["blt"] = error(model, out.sketch, sub,
                                       noise_scales(mech.plan(STREAM), blt.noise_multiplier()), k)
        accounted["blt"] = acct.report()["epsilon_worst_case"]
    marginal = {}
    if "sqrt" in mechanisms:
        c = sqrt_toeplitz_coefs(R)
        unit = plan_release(rho / float(np.sum(c * c)), clip, BudgetSplit(), "tensor")
        prof = np.cumsum(c * c)        # Σ_{m<t} P_m², P = partial sums of (1−x)^{1/2} = c
        marginal["sqrt"] = (unit, lambda t: math.sqrt(prof[t - 1]))
    if "cumulative" in mechanisms:
        marginal["cumulative"] = (plan_release(rho / R, clip, BudgetSplit(), "tensor"), lambda t: 1.0)
    if "disjoint" in mechanisms:
        marginal["disjoint"] = (one, lambda t: math.sqrt(t))
    for name, (unit, mult) in marginal.items():
        for t in steps:
            ev = scaled_plan(unit, mult(t))
            rows[t][name] = error(model, noise_sums(prefix[t], ev, sampler, sub.Q), sub,
                                  noise_scales(ev), k)
    return [rows[t] for t in steps], mean_steps, accounted


def profiles(R):
    """Exact noise sd relative to the one-shot release, every step (√ of variance ratio)."""
    blt = default_params(R).error_profile(R)
    return {"tree": np.sqrt(tree_error_profile(R)), "blt": np.sqrt(blt),
            "sqrt": np.sqrt(sqrt_toeplitz_error_profile(R)),
            "cumulative": np.full(R, math.sqrt(R)), "disjoint": np.sqrt(np.arange(1, R + 1))}


def summarise(per_step, mean_steps, mechanisms):
    """Mean over seeds per step, then worst / mean ratio to one-shot and the worst step vs tree."""
    R = per_step[0]["R"]
    steps = sorted({r["t"] for r in per_step})
    avg = {t: {m: float(np.mean([r[m] for r in per_step if r["t"] == t]))
               for m in ("one_shot",) + tuple(mechanisms)} for t in steps}
    prof = profiles(R)
    out = []
    for m in mechanisms:
        ratio = {t: avg[t][m] / avg[t]["one_shot"] for t in steps}
        row = {"R": R, "mechanism": m, "worst ratio": max(ratio.values()),
               "worst at t": max(ratio, key=ratio.get),
               "mean ratio": float(np.mean([ratio[t] for t in mean_steps])),
               "last ratio": ratio[R], "noise sd max (exact)": float(prof[m].max()),
               "noise sd mean (exact)": float(prof[m].mean())}
        if "tree" in mechanisms and m != "tree":
            vs = {t: avg[t][m] / avg[t]["tree"] for t in steps}
            row["max error / tree's at same t"] = max(vs.values())
            row["at t"] = max(vs, key=vs.get)
            row["max sd / tree's (exact, all t)"] = float(np.max(prof[m] / prof["tree"]))
        out.append(row)
    return out, avg


def plot(path, avgs, mechanisms):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    Rs = sorted(avgs)
    fig, axes = plt.subplots(1, len(Rs), figsize=(5.5 * len(Rs), 4.2), squeeze=False)
    colors = {"tree": "tab:red", "blt": "tab:blue", "sqrt": "tab:green", "cumulative": "tab:gray",
              "disjoint": "tab:olive"}
    for ax, R in zip(axes[0], Rs):
        avg = avgs[R]
        steps = sorted(avg)
        prof = profiles(R)
        for m in mechanisms:
            ax.plot(steps, [avg[t][m] / avg[t]["one_shot"] for t in steps], ".-" if len(steps) < 200
                    else "-", color=colors[m], label=f"{m} (measured)", lw=1, ms=4)
            ax.plot(np.arange(1, R + 1), prof[m], ":", color=colors[m], lw=0.8,
                    label=f"{m} noise sd (exact)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("release index t")
        ax.set_ylabel("error / one-shot error at t")
        ax.set_title(f"R = {R} releases, ε = 1 (mean of seeds)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--releases", default="16,256,1024")
    p.add_argument("--mechanisms", default="tree,blt,sqrt")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds (0, 1, ..., N-1); at least 1")
    p.add_argument("--all-steps", type=int, default=256)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--d", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--warmup", type=int, default=100_000)
    p.add_argument("--stream", type=int, default=200_000)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    a = parse_args(p, argv)         # + --no-progress
    if a.seeds < 1:
        p.error(f"--seeds is a count of seeds (seeds 0..N-1) and must be at least 1, got {a.seeds}")
    Rs = [int(r) for r in a.releases.split(",")]
    mechanisms = tuple(m.strip() for m in a.mechanisms.split(",") if m.strip())
    if bad := [m for m in mechanisms if m not in ALL]:
        p.error(f"unknown mechanism(s) {bad}; choose from {ALL}")
    finest = max(Rs)
    if any(finest % R for R in Rs):
        p.error("every release count must divide the largest one")
    t0 = time.time()
    per_step, accounted = {R: [] for R in Rs}, []
    mean_steps = {}
    for seed in progress(range(a.seeds), "seeds"):
        model, sub, clip, leaves = prepare(seed, a.d, a.k, a.warmup, a.stream, finest,
                                           a.epsilon, a.delta)
        for R in progress(Rs, f"seed {seed}: release counts"):
            rows, mean_steps[R], acc = run(model, sub, clip, coarsen(leaves, R), a.k, a.epsilon,
                                           a.delta, seed, mechanisms, a.all_steps)
            per_step[R].extend(rows)
            accounted.append({"R": R, "seed": seed, **acc})
            print({"R": R, "seed": seed, "accounted ε": acc,
                   "last": {m: round(rows[-1][m], 5) for m in ("one_shot",) + mechanisms},
                   "elapsed s": round(time.time() - t0)}, flush=True)
    table, avgs = [], {}
    for R in Rs:
        rows, avgs[R] = summarise(per_step[R], mean_steps[R], mechanisms)
        for r in rows:
            r["max accounted ε"] = max((x.get(r["mechanism"]) or 0.0) for x in accounted
                                       if x["R"] == R) or None
        table.extend(rows)
    cols = list(dict.fromkeys(c for r in table for c in r))
    print(f"\n## Error of every release / one-shot error on the same documents, ε = {a.epsilon:g}, "
          f"δ = {a.delta:g} for all releases ({a.seeds} seed(s))\n")
    print(md := markdown_table(table, cols))
    print(f"\ntotal {time.time() - t0:.0f} s")
    if a.plot:
        plot(a.plot, avgs, mechanisms)
    write_json(a.json, {"setting": vars(a), "table": table, "markdown": md,
                        "per_step": {str(R): v for R, v in per_step.items()},
                        "mean_steps": {str(R): v for R, v in mean_steps.items()},
                        "accounted": accounted})


if __name__ == "__main__":
    main()
