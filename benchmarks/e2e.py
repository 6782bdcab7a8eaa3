"""Scale-out: documents per second of 1, 2, 4 sketcher processes in one consumer group (issue 13).

    OMP_NUM_THREADS=1 python benchmarks/e2e.py --processes 1,2,4 --partitions 4 \\
        --json benchmarks/results/e2e_scaleout.json
    python benchmarks/e2e.py --decode --docs 50000      # CPU per document by stage, in process

Setting: the embedded Tansu broker (memory storage, its own process), and for every process
count a fresh documents topic with ``--partitions`` partitions pre-filled with the same N
token-id documents (``benchmarks/pipeline.py``'s synthetic LDA corpus: d = 10,000, k = 20,
lengths Poisson(50)+3, keyed by document id, so spread evenly over the partitions), a
random orthonormal subspace Q (d × 2k) and — with ``--refine 1`` — a released model in the
state store, so every document takes the production path: consume → bulk decode + validate
→ route → whitened sketch update → refinement fold-in → checkpoint.

Each sketcher is a separate OS process (multiprocessing, spawn) running
``streamdp.services.sketcher.Sketcher.step()`` in a loop, all in one consumer group. The
group join is excluded: every process pauses the partitions it is assigned until the
parent has seen a stable assignment covering every partition (each process holding at
least one), then all resume at one moment ("go"). A process is done when every partition
it holds is consumed (its document count) and its final checkpoint is written; it then keeps
polling (so no rebalance disturbs the others) until the parent ends the run. The total
rate is N / (last process done − go); per process, its own documents / its own time.
``cpu_s`` is the process's CPU time over its run (``time.process_time``, all its threads:
librdkafka's too), so ``docs_per_cpu_s`` = documents per second of one busy core, the
figure that does not depend on how many other processes share the cores.
``docs_per_cpu_s_steady`` leaves out the one final checkpoint of every partition (a cost per
run, partitions × state size, ≈ 37 MB per partition at d = 10k, k = 20 with refinement, that
dominates short runs with many partitions); periodic checkpoints stay in. ``longest_loop_s``
is the longest poll loop (``streamdp_poll_loop_longest_seconds``; librdkafka's
``max.poll.interval.ms`` is 20 s).

The machine this ran on has 2 cores, shared: with 4 processes on 2 cores the processes
take turns, so the 4-process total measures scheduling overhead, not scale-out. The 1-min
load average before and after every run is in the JSON (``load_before``/``load_after``).
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import multiprocessing as mp  # noqa: E402
import queue  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_json  # noqa: E402

#: seconds the assignment must stay unchanged before the parent says "go"
STABLE_SECONDS = 3.0
#: the hold that keeps an assigned partition paused until "go": a real pause reason
#: (``ServiceMetrics.set_paused`` exports only :data:`streamdp.observability.PAUSE_REASONS`;
#: an invented one raised ValueError in every loop and the benchmark had rotted, issue 24).
#: No strategy is ever ready for it, so only the worker's own "go" releases it.
START_HOLD = "restoring"


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (the broker), nan if unknown."""
    if pid is None:
        return float("nan")
    import psutil
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _worker(wid: int, cfg_kwargs: dict, expected: dict, go, stop, out) -> None:
    """One sketcher process: join, pause until ``go``, consume its partitions' ``expected``
    documents, report."""
    from confluent_kafka import TopicPartition
    from threadpoolctl import threadpool_limits

    from streamdp.services.config import ServiceConfig
    from streamdp.services.sketcher import Sketcher

    logging.basicConfig(level=logging.WARNING)
    threadpool_limits(1)
    cfg = ServiceConfig(**cfg_kwargs)

    class PausedStart(Sketcher):
        """Pauses whatever it is assigned until ``go`` (the join is not measured)."""

        def _on_assign(self, consumer, partitions):
            super()._on_assign(consumer, partitions)      # assigned paused, restored by step()
            if not go.is_set():     # held: the restore seeks but does not resume them
                for tp in partitions:
                    self.paused[tp.partition] = START_HOLD

    sk = PausedStart(cfg, instance=f"e2e-{wid}")
    topic = sk.topics.documents
    try:
        sk._refresh_subspace()
        if sk.subspace is None:
            raise RuntimeError("no subspace in the state store")
        sk.consumer.subscribe([topic], on_assign=sk._on_assign, on_revoke=sk._on_revoke,
                              on_lost=sk._on_lost)
        last = None
        while not go.is_set():
            sk.step()
            held = tuple(sorted(sk.states))
            if held != last:
                out.put(("assigned", wid, held))
                last = held
        for p in [p for p, need in sk.paused.items() if need == START_HOLD]:
            del sk.paused[p]
        sk.consumer.resume([TopicPartition(topic, p) for p in sk.states])
        t0, cpu0 = time.time(), time.process_time()
        held = sorted(sk.states)

        def done() -> bool:
            return all(st.counters["documents"] + st.counters["late"] + st.counters["dlq"] >= expected[p]
                       for p, st in sk.states.items())

        while not done():
            if stop.is_set():
                raise RuntimeError("stopped before every document was consumed")
            sk.step()
        t_last, cpu_last = time.time(), time.process_time()    # consumed, before the final checkpoint
        sk.checkpoint_all()
        t1, cpu1 = time.time(), time.process_time()
        counters = {c: sum(st.counters[c] for st in sk.states.values()) for c in ("documents", "dlq", "late")}
        out.put(("done", wid, {"partitions": held, "final_partitions": sorted(sk.states),
                               "start": t0, "end": t1, "cpu_s": cpu1 - cpu0,
                               "final_checkpoint_s": t1 - t_last, "final_checkpoint_cpu_s": cpu1 - cpu_last,
                               "longest_loop_s": getattr(sk.processor, "longest_loop", float("nan")), **counters}))
        while not stop.is_set():           # stay in the group: no rebalance under the others
            sk.step()
    except Exception as exc:               # noqa: BLE001 — reported to the parent
        out.put(("error", wid, repr(exc)))
        raise
    finally:
        sk.close()


def run_scale(bootstrap: str, n_proc: int, msgs: list, a, stream_start: float, vocab, vocab_path: str,
              broker_pid: int | None = None) -> dict:
    from streamdp.kafka.state_store import StateStore
    from streamdp.kafka.topics import TopicNames, ensure_topics
    from streamdp.moments.clipping import ClipBounds
    from streamdp.whitening.subspace import Subspace
    from pipeline import public_subspace, write_release_models

    prefix = f"e2e-{n_proc}p-{uuid.uuid4().hex[:8]}"
    names = TopicNames.from_prefix(prefix)
    ensure_topics(bootstrap, names, partitions=a.partitions)
    # round-robin over the partitions (exactly N/P documents each, ts non-decreasing per partition)
    from confluent_kafka import Producer
    from streamdp.kafka.topics import client_config
    prod = Producer({**client_config(bootstrap, "producer"), "linger.ms": 20, "acks": "all",
                     "queue.buffering.max.messages": 500_000})
    expected = {p: 0 for p in range(a.partitions)}
    for i, (doc_id, t, raw) in enumerate(msgs):
        part = i % a.partitions
        while True:
            try:
                prod.produce(names.documents, key=doc_id.encode(), value=raw, partition=part,
                             timestamp=int(t * 1000))
                break
            except BufferError:
                prod.poll(0.1)
        expected[part] += 1
    if prod.flush(60) != 0:
        raise RuntimeError("documents not acknowledged")

    k_prime = 2 * a.k
    Q, _ = np.linalg.qr(np.random.default_rng(a.seed + 4).standard_normal((a.d, k_prime)))
    sub = Subspace(Q)
    with StateStore(None, bootstrap, names.state) as store:
        public_subspace(store, prefix, sub, ClipBounds.for_length(a.clip_length), vocab.id)
        if a.refine:
            write_release_models(store, a, prefix)

    cfg_kwargs = dict(bootstrap=bootstrap, topic_prefix=prefix, group_id=f"{prefix}-sketchers",
                      vocabulary=vocab_path, vocabulary_public_by_assumption=True, n_topics=a.k,
                      stream_start=stream_start, refinement=bool(a.refine), epoch_seconds=3600.0,
                      batch_size=a.batch, checkpoint_seconds=a.checkpoint_seconds, poll_seconds=0.2,
                      seed=a.seed, non_production=True, confirm_backfill=True)
    ctx = mp.get_context("spawn")
    go, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(w, cfg_kwargs, expected, go, stop, out), daemon=True)
             for w in range(n_proc)]
    for pr in procs:
        pr.start()
    held: dict[int, tuple] = {}
    results: dict[int, dict] = {}
    t_start, changed = time.monotonic(), time.monotonic()
    try:
        while not go.is_set():          # wait for a stable assignment covering every partition
            try:
                kind, wid, val = out.get(timeout=0.2)
                if kind == "error":
                    raise RuntimeError(f"worker {wid}: {val}")
                held[wid] = val
                changed = time.monotonic()
            except queue.Empty:
                pass
            covered = sorted(p for v in held.values() for p in v) == list(range(a.partitions))
            everyone = len(held) == n_proc and all(held.values())
            if covered and everyone and time.monotonic() - changed >= STABLE_SECONDS:
                load_before = os.getloadavg()[0]
                broker_cpu0 = _cpu_seconds(broker_pid)
                t_go = time.time()
                go.set()
            elif time.monotonic() - t_start > 180:
                raise RuntimeError(f"no stable assignment in 180 s: {held}")
        deadline = time.monotonic() + a.timeout
        while len(results) < n_proc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(results)} of {n_proc} processes finished in {a.timeout} s")
            try:
                kind, wid, val = out.get(timeout=1.0)
            except queue.Empty:
                continue
            if kind == "error":
                raise RuntimeError(f"worker {wid}: {val}")
            if kind == "done":
                results[wid] = val
        load_after = os.getloadavg()[0]
        broker_cpu = _cpu_seconds(broker_pid) - broker_cpu0
    finally:
        stop.set()
        for pr in procs:
            pr.join(30)
            if pr.is_alive():
                pr.terminate()
    per = [results[w] for w in sorted(results)]
    if any(r["partitions"] != r["final_partitions"] for r in per):
        raise RuntimeError(f"a rebalance during the run: {per}")
    n_docs = sum(r["documents"] for r in per)
    if n_docs != len(msgs) or any(r["dlq"] or r["late"] for r in per):
        raise RuntimeError(f"unexpected counters: {per}")
    seconds = max(r["end"] for r in per) - t_go
    cpu = sum(r["cpu_s"] for r in per)
    cores = os.cpu_count() or 1
    row = {
        "processes": n_proc, "partitions": a.partitions, "documents": n_docs, "seconds": seconds,
        "docs_per_s": n_docs / seconds,
        "docs_per_s_per_process": n_docs / seconds / n_proc,
        "docs_per_s_per_core": n_docs / seconds / min(n_proc, cores),
        "docs_per_cpu_s": n_docs / cpu, "cpu_s": cpu, "cores": cores,
        # steady state: periodic checkpoints counted, the one final checkpoint of every
        # partition (a per-run cost, P × state size, that dominates short runs) not
        "docs_per_cpu_s_steady": n_docs / (cpu - sum(r["final_checkpoint_cpu_s"] for r in per)),
        "final_checkpoint_cpu_s": sum(r["final_checkpoint_cpu_s"] for r in per),
        "longest_loop_s": max(r["longest_loop_s"] for r in per),
        "process_docs_per_s": [r["documents"] / (r["end"] - r["start"]) for r in per],
        "process_docs": [r["documents"] for r in per],
        "process_partitions": [r["partitions"] for r in per],
        "process_cpu_s": [r["cpu_s"] for r in per],
        "load_before": load_before, "load_after": load_after,
        "broker_cpu_s": broker_cpu, "broker_cores_busy": broker_cpu / seconds,
        "d": a.d, "k": a.k, "refine": bool(a.refine), "batch": a.batch,
    }
    return row


def decode_ab(msgs: list, vocab, batch: int, repeats: int) -> list[dict]:
    """CPU µs per document of decoding + validating + vectorising token-id messages: the
    per-message path (decode_document, then documents_to_counts) against the bulk one
    (DocumentBatch), interleaved, in this process, one thread (``time.thread_time``)."""
    from streamdp import messages
    from streamdp.text.tokenizer import Tokenizer
    raws = [m[2] for m in msgs]
    tok = Tokenizer()

    def per_message(b):
        return messages.documents_to_counts([messages.decode_document(r) for r in b], tok, vocab)

    def bulk(b):
        return messages.DocumentBatch(b, vocab).to_counts(tok)

    times: dict[str, list[float]] = {"per message": [], "bulk": []}
    for _ in range(repeats):
        for name, f in (("per message", per_message), ("bulk", bulk)):
            t0 = time.thread_time()
            for a in range(0, len(raws), batch):
                f(raws[a:a + batch])
            times[name].append((time.thread_time() - t0) / len(raws) * 1e6)
    a, b = per_message(raws[:batch]), bulk(raws[:batch])
    if (a.counts != b.counts).nnz or a.doc_ids != b.doc_ids:
        raise RuntimeError("the bulk path disagrees with the per-message path")
    return [{"path": name, "us_per_doc_best": min(v), "us_per_doc_median": float(np.median(v)),
             "docs_per_cpu_s_best": 1e6 / min(v), "repeats": repeats} for name, v in times.items()]


def sketch_costs(X, a, batch: int, repeats: int) -> list[dict]:
    """CPU µs per document of the two state updates after decoding (same corpus, same
    batches): the whitened sketch (WhitenedSketch.update) and the refinement fold-in
    (RefinementSketch.update, the sketcher's default 5 fold-in iterations)."""
    from streamdp.moments.clipping import ClipBounds
    from streamdp.moments.sketch import WhitenedSketch
    from streamdp.refinement import RefinementConfig, RefinementModel, RefinementSketch
    from streamdp.whitening.subspace import Subspace
    from pipeline import make_lda_model
    import scipy.sparse as sp
    X = sp.csr_matrix(X, dtype=np.float64)
    Q, _ = np.linalg.qr(np.random.default_rng(a.seed + 4).standard_normal((a.d, 2 * a.k)))
    tw = np.asarray(make_lda_model(a.d, a.k, alpha0=1.0, beta=0.05, seed=a.seed).topics)
    model = RefinementModel(tw, np.full(a.k, 1.0 / a.k), "bench", RefinementConfig().fold_in_iter)
    sub, clip = Subspace(Q), ClipBounds.for_length(a.clip_length)
    out = []
    for name, make, upd in (
            ("whitened sketch update", lambda: WhitenedSketch(sub, clip), lambda s, b: s.update(b)),
            ("refinement fold-in + sums", lambda: RefinementSketch(a.k, a.d), lambda s, b: s.update(b, model))):
        v = []
        for _ in range(repeats):
            state = make()
            t0 = time.thread_time()
            for s0 in range(0, X.shape[0], batch):
                upd(state, X[s0:s0 + batch])
            v.append((time.thread_time() - t0) / X.shape[0] * 1e6)
        out.append({"path": name, "us_per_doc_best": min(v), "us_per_doc_median": float(np.median(v)),
                    "docs_per_cpu_s_best": 1e6 / min(v), "repeats": repeats})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", default="1,2,4", help="comma list of sketcher process counts")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--d", type=int, default=10_000)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--batch", type=int, default=5000, help="sketcher batch_size (max messages per consume)")
    p.add_argument("--checkpoint-seconds", type=float, default=5.0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--clip-length", type=float, default=20.0)
    p.add_argument("--refine", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1, help="runs per process count (the table shows the median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--decode", action="store_true", help="in process only (no broker), CPU µs/doc: "
                   "per-message decode_document + documents_to_counts vs bulk DocumentBatch, then the "
                   "whitened sketch update and the refinement fold-in")
    p.add_argument("--decode-input", default="counts", choices=["counts", "text"],
                   help="with --decode: token-id (counts) or raw-text messages")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    counts = [int(x) for x in a.processes.split(",") if x.strip()]

    from streamdp.kafka.broker import EmbeddedBroker
    from streamdp.text.vocabulary import Vocabulary
    from pipeline import CLOSED_EPOCHS, EPOCH_SECONDS, encode_messages, make_corpus, pseudo_words

    X = make_corpus(a.d, a.k, a.docs, a.seed)
    vocab = Vocabulary(pseudo_words(a.d))
    work = Path(tempfile.mkdtemp(prefix="streamdp-e2e-"))
    vocab_path = str(work / "vocabulary.txt")
    vocab.save(vocab_path)
    stream_start = float(int(time.time()) - 7 * 86400)
    ts = stream_start + (CLOSED_EPOCHS + np.sort(np.random.default_rng(a.seed + 2).random(a.docs)) * a.epochs) \
        * EPOCH_SECONDS
    msgs = encode_messages(X, a.decode_input if a.decode else "counts", list(vocab.words), ts, a.seed + 3)
    if a.decode:
        rows = decode_ab(msgs, vocab, a.batch, max(a.repeats, 5))
        rows += sketch_costs(X, a, a.batch, max(a.repeats, 3))
        print(f"\n## CPU per {a.decode_input} document, in process (d = {a.d:,}, k = {a.k}, {a.docs:,} documents, "
              f"batches of {a.batch}, one thread)\n")
        print(markdown_table(rows, ["path", "us_per_doc_best", "us_per_doc_median", "docs_per_cpu_s_best"]))
        write_json(a.json, {"rows": rows, "load_avg_1min": os.getloadavg()[0]})
        return
    runs, rows = [], []
    with EmbeddedBroker() as broker:
        for n in counts:
            mine = []
            for rep in range(a.repeats):
                r = run_scale(broker.bootstrap, n, msgs, a, stream_start, vocab, vocab_path, broker.pid)
                r["repeat"] = rep
                mine.append(r)
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
            runs.extend(mine)
            by = sorted(mine, key=lambda r: r["docs_per_s"])
            row = dict(by[len(by) // 2])
            row["docs_per_s_min"], row["docs_per_s_max"] = by[0]["docs_per_s"], by[-1]["docs_per_s"]
            row["runs"] = len(mine)
            rows.append(row)
    cols = ["processes", "partitions", "documents", "seconds", "docs_per_s", "docs_per_s_min",
            "docs_per_s_max", "docs_per_s_per_process", "docs_per_s_per_core", "docs_per_cpu_s",
            "docs_per_cpu_s_steady", "final_checkpoint_cpu_s", "longest_loop_s",
            "broker_cores_busy", "load_before", "load_after"]
    print(f"\n## Sketcher scale-out (d = {a.d:,}, k = {a.k}, refinement {'on' if a.refine else 'off'}, "
          f"{a.partitions} partitions, batch {a.batch}, {os.cpu_count()} cores; median of {a.repeats})\n")
    print(markdown_table(rows, cols))
    write_json(a.json, {"rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
