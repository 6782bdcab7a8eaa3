"""Documents per second consumed, sketched and checkpointed by ONE sketcher (issue 4).

    OMP_NUM_THREADS=1 python benchmarks/pipeline.py --json benchmarks/results/pipeline.json
    python benchmarks/pipeline.py --docs 50000 --inputs counts --profile     # cProfile summary

Setting: the embedded Tansu broker (memory storage, a separate process), fresh
topics per input kind (documents topic with ``--partitions`` partitions), a public
vocabulary of d letter-only pseudo-words, and N documents from a synthetic LDA
model (d = 10,000, k = 20, topic-word Dirichlet(0.05), lengths Poisson(50)+3)
pre-filled into the documents topic before the sketcher starts, either as token
ids (``{"id","ts","counts": {"ids","counts"}}``) or as raw text (the same
documents written out as words in random order, ``{"id","ts","text"}``).

Every document is a *stream* document (ts spread over ``--epochs`` epochs after
``stream_start``) and a random orthonormal subspace Q (d × 2k) with clip bounds
``ClipBounds.for_length(--clip-length)`` is in the state store before the sketcher
starts, so the measured path is the production one: consume → decode + validate →
vectorise → route → whitened sketch update (clip, accumulate) → checkpoint to the
state topic.

One ``streamdp.services.sketcher.Sketcher`` is driven in this process by calling
its ``step()`` (exactly what ``Sketcher.run`` loops over). The clock starts when
the first non-empty batch reaches ``Sketcher.process`` (the consumer-group join is
excluded) and stops when all N documents are in the partition states AND the final
``checkpoint_all()`` has been acknowledged; periodic checkpoints in between (every
``--checkpoint-seconds``) are part of the measured time. The time split
(fetch / decode+validate / vectorise / sketch / checkpoint) comes from cheap
per-batch timers around ``consumer.consume``, ``messages.documents_to_counts``,
``PartitionState.add`` and ``StateStore.write``; "decode+validate" is the rest of
``Sketcher.process`` (msgpack unpack, schema checks, routing, counters, metrics). Since the
bulk decoder (``messages.DocumentBatch``, issue 13) token-id documents no longer go through
``documents_to_counts``: their CSR rows are built inside "decode+validate" and "vectorise"
is 0 (text and tokens documents still take ``documents_to_counts``).

Peak RSS is sampled (psutil, every 50 ms) in this process during the measured
window only (it includes the pre-encoded messages and the corpus this script
holds); the broker's RSS is reported separately. ``docs_per_main_thread_cpu_s``
divides by the CPU time of the thread running the sketcher: on a loaded machine
it is the steadier number (wall time also counts waiting for a core).
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import logging  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

from streamdp import messages  # noqa: E402
from streamdp.kafka.broker import EmbeddedBroker  # noqa: E402
from streamdp.kafka.state_store import StateStore  # noqa: E402
from streamdp.kafka.topics import TopicNames, ensure_topics  # noqa: E402
from streamdp.moments.clipping import ClipBounds  # noqa: E402
from streamdp.services import control  # noqa: E402
from streamdp.services import partition_state as ps_mod  # noqa: E402
from streamdp.services.config import ServiceConfig  # noqa: E402
from streamdp.services.produce import produce  # noqa: E402
from streamdp.services.sketcher import Sketcher  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402
from streamdp.text.vocabulary import Vocabulary  # noqa: E402
from streamdp.whitening.subspace import Subspace  # noqa: E402

_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]          # 85 two-letter syllables


def pseudo_words(d: int) -> list[str]:
    """d distinct letter-only words of 3 syllables (6 letters): kept whole by the default tokenizer."""
    n = len(_SYLLABLES)
    if d > n ** 3:
        raise ValueError(f"at most {n ** 3} pseudo-words")
    # a fixed permutation so neighbouring ids do not share prefixes
    order = np.random.default_rng(12345).permutation(n ** 3)[:d]
    return [_SYLLABLES[i // (n * n)] + _SYLLABLES[(i // n) % n] + _SYLLABLES[i % n] for i in order]


def rss_mb(pid: int | None = None) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


class RssSampler(threading.Thread):
    def __init__(self, interval: float = 0.05):
        super().__init__(daemon=True)
        self.interval, self.peak, self._stop_evt = interval, rss_mb(), threading.Event()

    def run(self):
        proc = psutil.Process()
        while not self._stop_evt.wait(self.interval):
            self.peak = max(self.peak, proc.memory_info().rss / 2**20)

    def stop(self) -> float:
        self._stop_evt.set()
        self.join()
        self.peak = max(self.peak, rss_mb())
        return self.peak


class Timers:
    def __init__(self):
        self.t: dict[str, float] = {}
        self.n: dict[str, int] = {}

    def add(self, name: str, dt: float) -> None:
        self.t[name] = self.t.get(name, 0.0) + dt
        self.n[name] = self.n.get(name, 0) + 1


class _TimedConsumer:
    """Proxy for the sketcher's Consumer that times ``consume`` (C object: no monkeypatching)."""

    def __init__(self, inner, timers: Timers):
        self._inner, self._timers = inner, timers

    def consume(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return self._inner.consume(*a, **kw)
        finally:
            self._timers.add("fetch", time.perf_counter() - t0)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class BenchSketcher(Sketcher):
    """A Sketcher whose process/checkpoint calls are timed; behaviour unchanged."""

    def __init__(self, cfg, timers: Timers, **kw):
        super().__init__(cfg, **kw)
        self.timers = timers
        self.first_doc_at: float | None = None
        self.checkpoint_sizes: list[int] = []
        self.consumer = _TimedConsumer(self.consumer, timers)
        store_write = self.store.write

        def timed_write(key, payload, meta=None):
            t0 = time.perf_counter()
            try:
                return store_write(key, payload, meta=meta)
            finally:
                timers.add("state_write", time.perf_counter() - t0)
                if key.startswith("sketch/"):
                    self.checkpoint_sizes.append(len(payload))
        self.store.write = timed_write
        # the processor calls the strategy's process/checkpoint: time them through these methods
        self._strategy_process, self.strategy.process = self.strategy.process, self.process
        self._strategy_checkpoint, self.strategy.checkpoint = self.strategy.checkpoint, self.checkpoint

    def process(self, p, batch):
        if self.first_doc_at is None and batch:
            self.first_cpu = (time.process_time(), time.thread_time())
            self.first_doc_at = time.perf_counter()
        t0 = time.perf_counter()
        try:
            return self._strategy_process(p, batch)
        finally:
            self.timers.add("process", time.perf_counter() - t0)

    def checkpoint(self, p):
        t0 = time.perf_counter()
        try:
            return self._strategy_checkpoint(p)
        finally:
            self.timers.add("checkpoint", time.perf_counter() - t0)

    def consumed(self) -> int:
        return sum(st.counters["documents"] + st.counters["warmup_documents"] + st.counters["late"]
                   + st.counters["dlq"] for st in self.states.values())


def install_phase_timers(timers: Timers):
    """Wrap documents_to_counts and PartitionState.add with per-batch timers; returns an undo."""
    orig_counts, orig_add = messages.documents_to_counts, ps_mod.PartitionState.add

    def timed_counts(*a, **kw):
        t0 = time.perf_counter()
        try:
            return orig_counts(*a, **kw)
        finally:
            timers.add("vectorise", time.perf_counter() - t0)

    def timed_add(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return orig_add(self, *a, **kw)
        finally:
            timers.add("sketch", time.perf_counter() - t0)

    messages.documents_to_counts = timed_counts
    ps_mod.PartitionState.add = timed_add

    def undo():
        messages.documents_to_counts = orig_counts
        ps_mod.PartitionState.add = orig_add
    return undo


#: the documents' epochs start after this many closed epochs (the refinement model rule:
#: documents of epoch e are folded into the snapshot of epoch e − L, L = 2 by default)
CLOSED_EPOCHS = 2


def public_subspace(store, prefix: str, sub, clip, vocabulary_id: str) -> None:
    """The public subspace record sketchers read (streamdp.services.public_records), as the
    release service writes it, signed with the non-production key of ``prefix``."""
    from types import SimpleNamespace
    from streamdp.services import public_records
    from streamdp.services.state_auth import for_config
    auth = for_config(SimpleNamespace(control_key_file="", non_production=True, topic_prefix=prefix))
    public_records.write(store, auth, public_records.SUBSPACE_KEY, sub.to_bytes(),
                         {"clip": clip.to_dict(), "subspace_id": sub.id, "vocabulary_id": vocabulary_id})


def write_release_models(store, a, prefix: str) -> None:
    """A release state closed through epoch CLOSED_EPOCHS holding the models of epochs
    1 … CLOSED_EPOCHS, as the release service writes it, so that every stream document (epochs
    CLOSED_EPOCHS + 1 … CLOSED_EPOCHS + L) is folded into a decided model (refinement, issues
    10 and 15). The true topics stand in for a release: the fold-in cost does not depend on
    the values."""
    from streamdp import serialization as ser
    from streamdp.refinement import RefinementModel
    tw = np.asarray(make_lda_model(a.d, a.k, alpha0=1.0, beta=0.05, seed=a.seed).topics)
    models = [RefinementModel(tw, np.full(a.k, 1.0 / a.k), f"bench-{e}", epoch=e).to_dict()
              for e in range(1, CLOSED_EPOCHS + 1)]
    store.write(control.RELEASE_STATE_KEY, ser.dumps({"refinement_models": models}),
                meta={"epoch": CLOSED_EPOCHS, "release_id": f"bench-{CLOSED_EPOCHS}"})
    # what sketchers read (issue 23 item 6): the public release record, signed with the
    # non-production key of this prefix (streamdp.services.control.load_key)
    from types import SimpleNamespace
    from streamdp.services import public_release
    from streamdp.services.state_auth import for_config
    payload = public_release.encode(CLOSED_EPOCHS, models)
    auth = for_config(SimpleNamespace(control_key_file="", non_production=True, topic_prefix=prefix))
    store.write(public_release.KEY, payload,
                meta=auth.sign(public_release.KEY, payload, {"epoch": CLOSED_EPOCHS}))


def make_corpus(d: int, k: int, n_docs: int, seed: int):
    model = make_lda_model(d, k, alpha0=1.0, beta=0.05, seed=seed)
    return sample_documents(model, n_docs, mean_length=50, length_offset=3, seed=seed + 1)


def encode_messages(X, kind: str, words: list[str], ts: np.ndarray, seed: int) -> list[tuple[str, float, bytes]]:
    rng = np.random.default_rng(seed)
    out = []
    indptr, indices, data = X.indptr, X.indices, X.data.astype(np.int64)
    for i in range(X.shape[0]):
        ids, cnt = indices[indptr[i]:indptr[i + 1]], data[indptr[i]:indptr[i + 1]]
        doc_id = f"doc-{i}"
        if kind == "counts":
            raw = messages.encode_document(doc_id, float(ts[i]), counts=(ids.tolist(), cnt.tolist()))
        else:
            toks = np.repeat(ids, cnt)
            rng.shuffle(toks)
            raw = messages.encode_document(doc_id, float(ts[i]), text=" ".join([words[j] for j in toks]))
        out.append((doc_id, float(ts[i]), raw))
    return out


EPOCH_SECONDS = 3600.0


def run_one(bootstrap: str, kind: str, msgs: list, stream_start: float, vocab: Vocabulary,
            vocab_path: str, a, broker_pid: int) -> dict:
    n_docs = len(msgs)
    epoch_seconds = EPOCH_SECONDS
    prefix = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    names = TopicNames.from_prefix(prefix)
    ensure_topics(bootstrap, names, partitions=a.partitions)
    msg_bytes = sum(len(m[2]) for m in msgs)
    t0 = time.perf_counter()
    produce(bootstrap, names.documents, msgs)
    produce_s = time.perf_counter() - t0
    gc.collect()
    print(f"[{kind}] produced {n_docs:,} messages ({msg_bytes / n_docs:.0f} B avg) in {produce_s:.1f} s",
          flush=True)

    # The public subspace and clip bounds, as the release service would publish them.
    k_prime = 2 * a.k
    Q, _ = np.linalg.qr(np.random.default_rng(a.seed + 4).standard_normal((a.d, k_prime)))
    sub = Subspace(Q)
    with StateStore(None, bootstrap, names.state) as store:
        public_subspace(store, prefix, sub, ClipBounds.for_length(a.clip_length), vocab.id)

        if a.refine:
            write_release_models(store, a, prefix)

    cfg = ServiceConfig(bootstrap=bootstrap, topic_prefix=prefix, group_id=f"{prefix}-sketchers",
                        vocabulary=vocab_path, vocabulary_public_by_assumption=True,
                        n_topics=a.k, stream_start=stream_start,
                        refinement=bool(a.refine),
                        **({"refinement_thread": True} if a.background_refine else {}),
                        epoch_seconds=epoch_seconds, batch_size=a.batch,
                        checkpoint_seconds=a.checkpoint_seconds, poll_seconds=0.5, seed=a.seed,
                        non_production=True,       # embedded broker
                        confirm_backfill=True)     # a replayed feed
    timers = Timers()
    undo = install_phase_timers(timers)
    if hasattr(messages, "warm_bulk_decoder"):    # compiled kernels: loaded at start-up
        messages.warm_bulk_decoder()
        from streamdp.privacy import rounding
        rounding.warm_compiled()
    sk = BenchSketcher(cfg, timers, instance=f"bench-{kind}")
    prof = cProfile.Profile() if a.profile else None
    try:
        sk._refresh_subspace()
        assert sk.subspace is not None and sk.subspace.id == sub.id
        assert (sk.models is not None and bool(sk.models.models)) == bool(a.refine)
        sk.consumer.subscribe([names.documents], on_assign=sk._on_assign,
                              on_revoke=sk._on_revoke, on_lost=sk._on_lost)
        t_join = time.perf_counter()
        while sk.first_doc_at is None:              # group join + first fetch: not measured
            if time.perf_counter() - t_join > 120:
                raise RuntimeError("no document consumed within 120 s")
            sk.step()
        join_s = sk.first_doc_at - t_join
        # Time before the first batch reached process() is excluded: reset the timers but keep
        # the first batch's own processing (it ran inside the measured window by definition).
        first = {n: v for n, v in timers.t.items() if n in ("process", "vectorise", "sketch")}
        timers.t, timers.n = dict(first), {n: 1 for n in first}
        sampler = RssSampler()
        rss_start = sampler.peak
        sampler.start()
        sk._last_checkpoint = time.monotonic()      # periodic checkpoints counted from the first batch
        cpu0, thread0 = sk.first_cpu                # CPU clocks also start at the first batch
        with (prof if prof is not None else nullcontext()):
            deadline = time.perf_counter() + a.timeout
            marks, rss_at = [n_docs // 4, n_docs // 2, 3 * n_docs // 4], {}
            while (done := sk.consumed()) < n_docs:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"only {done} of {n_docs} documents within {a.timeout} s")
                while marks and done >= marks[0]:
                    rss_at[marks.pop(0)] = rss_mb()
                sk.step()
            n_ckpt_periodic = len(sk.checkpoint_sizes)
            sk.checkpoint_all()
        t_end = time.perf_counter()
        cpu_s, thread_s = time.process_time() - cpu0, time.thread_time() - thread0
        peak, rss_end = sampler.stop(), rss_mb()
        st = list(sk.states.values())     # before close(): on_revoke drops the states
    finally:
        undo()
        sk.close()
    seconds = t_end - sk.first_doc_at
    counters = {c: sum(s.counters[c] for s in st) for c in st[0].counters} if st else {}
    tm = timers.t
    decode = tm.get("process", 0) - tm.get("vectorise", 0) - tm.get("sketch", 0)
    row = {
        "input": "token ids" if kind == "counts" else "raw text",
        "documents": n_docs, "partitions": a.partitions, "batch": a.batch,
        "seconds": seconds, "docs_per_s": n_docs / seconds,
        "tokens_per_s": counters.get("tokens", 0) / seconds,
        "checkpoints": len(sk.checkpoint_sizes), "checkpoints_periodic": n_ckpt_periodic,
        "checkpoint_MB": (max(sk.checkpoint_sizes) / 2**20) if sk.checkpoint_sizes else None,
        "rss_MB": peak, "rss_start_MB": rss_start,
        **{f"rss_{100 * m // n_docs}pct_MB": v for m, v in rss_at.items()}, "rss_end_MB": rss_end,
        "broker_rss_MB": rss_mb(broker_pid),
        "main_thread_cpu_s": thread_s, "process_cpu_s": cpu_s,
        "docs_per_main_thread_cpu_s": n_docs / thread_s,
        "join_seconds": join_s, "message_bytes_avg": msg_bytes / n_docs, "produce_seconds": produce_s,
        "load_avg_1min": os.getloadavg()[0],
        "t_fetch": tm.get("fetch", 0), "t_decode_validate": decode, "t_vectorise": tm.get("vectorise", 0),
        "t_sketch": tm.get("sketch", 0), "t_checkpoint": tm.get("checkpoint", 0),
        "t_state_write": tm.get("state_write", 0),
        "t_other": seconds - sum(tm.get(n, 0) for n in ("fetch", "process", "checkpoint")),
        "counters": counters, "epochs": sorted({e for s in st for e in s.epochs}),
        "k_prime": k_prime, "d": a.d, "k": a.k, "refine": bool(a.refine),
        "background_refine": bool(a.background_refine),
    }
    if counters.get("documents") != n_docs or counters.get("dlq") or counters.get("late"):
        raise RuntimeError(f"unexpected routing: {counters}")
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.profile_lines)
        s.write("\n")
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(a.profile_lines)
        row["profile"] = s.getvalue()
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--d", type=int, default=10_000)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--inputs", default="counts,text", help="comma list of counts (token ids), text")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--batch", type=int, default=5000, help="sketcher batch_size (max messages per consume)")
    p.add_argument("--checkpoint-seconds", type=float, default=5.0)
    p.add_argument("--epochs", type=int, default=2, help="stream epochs the documents' ts span (at most "
                   "the refinement model lag, 2, with --refine 1: later epochs would wait for a model)")
    p.add_argument("--clip-length", type=float, default=20.0)
    p.add_argument("--blas-threads", type=int, default=1, help="threadpoolctl limit (0 = no limit)")
    p.add_argument("--repeats", type=int, default=1, help="runs per input (fresh topics each); "
                   "the table shows the median run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--refine", type=int, default=1, help="1: a released model exists, every document "
                   "is also folded into it (refinement sums, issue 10); 0: sketches only")
    p.add_argument("--background-refine", action="store_true", help="fold documents into the "
                   "refinement sketch on a second thread (configuration refinement_thread: true)")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--profile", action="store_true", help="cProfile the measured window (slows it)")
    p.add_argument("--profile-lines", type=int, default=30)
    p.add_argument("--json", default=None)
    a = parse_args(p, argv)         # + --no-progress
    logging.basicConfig(level=logging.WARNING)
    kinds = [x.strip() for x in a.inputs.split(",") if x.strip()]
    if set(kinds) - {"counts", "text"}:
        p.error("--inputs: use counts and/or text")

    X = make_corpus(a.d, a.k, a.docs, a.seed)
    vocab = Vocabulary(pseudo_words(a.d))
    work = Path(tempfile.mkdtemp(prefix="streamdp-bench-"))
    vocab_path = str(work / "vocabulary.txt")
    vocab.save(vocab_path)
    stream_start = float(int(time.time()) - 7 * 86400)       # a replayed feed from a week ago
    ts = stream_start + (CLOSED_EPOCHS + np.sort(np.random.default_rng(a.seed + 2).random(a.docs)) * a.epochs) \
        * EPOCH_SECONDS
    runs, rows = [], []
    limits = threadpool_limits(a.blas_threads) if a.blas_threads > 0 else nullcontext()
    with limits, EmbeddedBroker() as broker:
        for kind in kinds:
            t0 = time.perf_counter()
            msgs = encode_messages(X, kind, list(vocab.words), ts, a.seed + 3)
            print(f"[{kind}] encoded {a.docs:,} messages in {time.perf_counter() - t0:.1f} s", flush=True)
            mine = []
            for rep in progress(range(a.repeats), f"{kind}: repeats"):
                r = run_one(broker.bootstrap, kind, msgs, stream_start, vocab, vocab_path, a, broker.pid)
                r["repeat"] = rep
                mine.append(r)
                print({kk: (round(v, 3) if isinstance(v, float) else v) for kk, v in r.items()
                       if kk != "profile"}, flush=True)
                if "profile" in r:
                    print(r["profile"], flush=True)
            del msgs
            runs.extend(mine)
            by_speed = sorted(mine, key=lambda r: r["docs_per_s"])
            row = dict(by_speed[len(by_speed) // 2])               # the median run
            row["docs_per_s_min"], row["docs_per_s_max"] = by_speed[0]["docs_per_s"], by_speed[-1]["docs_per_s"]
            row["runs"] = len(mine)
            rows.append(row)
    cols = ["input", "documents", "seconds", "docs_per_s", "tokens_per_s", "checkpoints",
            "checkpoint_MB", "rss_MB", "docs_per_main_thread_cpu_s"]
    if a.repeats > 1:
        cols[4:4] = ["docs_per_s_min", "docs_per_s_max"]
    print(f"\n## Sketcher pipeline throughput (d = {a.d:,}, k = {a.k}, k' = {2 * a.k}, "
          f"{a.partitions} partition(s), batch {a.batch}; median of {a.repeats} run(s))\n")
    print(markdown_table(rows, cols))
    tcols = ["input", "seconds", "t_fetch", "t_decode_validate", "t_vectorise", "t_sketch",
             "t_checkpoint", "t_other"]
    print("\nWhere the time goes (seconds of the measured window)\n")
    print(markdown_table(rows, tcols))
    strip = lambda r: {k: v for k, v in r.items() if k != "profile"}  # noqa: E731
    write_json(a.json, {"rows": [strip(r) for r in rows], "runs": [strip(r) for r in runs]})


if __name__ == "__main__":
    main()
