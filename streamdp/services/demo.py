"""``streamdp demo``: broker + two sketchers + release service on a readable corpus.

Everything runs in one process (threads) against a real Kafka-protocol broker:
the embedded Tansu broker by default, or ``--bootstrap`` for an existing Kafka.

The vocabulary (issue 11) is not the generator's word list: by default the release
service selects it privately (``vocabulary_mode: private``) from a selection window of
documents before the warm-up; ``vocabulary="public"`` uses wordfreq's most frequent words
(no budget); ``vocabulary="corpus"`` is the generator's own list, public by assumption.
The true topics are compared with the released ones on the words they share.
"""
from __future__ import annotations

import gc
import logging
import math
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from confluent_kafka import Producer

from streamdp import progress
from streamdp.evaluation import matched_topic_error
from streamdp.kafka.broker import EmbeddedBroker
from streamdp.kafka.connectivity import quiet_librdkafka
from streamdp.privacy.noise import DEFAULT_SAMPLER
from streamdp.kafka.topics import TopicNames, client_config, ensure_topics
from streamdp.public_start import PublicStart
from streamdp.report import report_from_dir
from streamdp.services import control
from streamdp.services import vocabulary as vocab_mod
from streamdp.services.config import ServiceConfig
from streamdp.services.demo_corpus import TOPICS, sample_texts, zipf_users
from streamdp.services.produce import produce
from streamdp.services.release import ReleaseService
from streamdp.services.sketcher import Sketcher
from streamdp.services.start_checks import documents_partition_count
from streamdp.start import save_public_start
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary

log = logging.getLogger("streamdp.demo")


VOCABULARY_CHOICES = ("private", "public", "corpus")
#: what the demo's error figure is (matched_topic_error's l2_mean)
ERROR_WHAT = "mean L2 distance of each released topic to its matched true topic"


def error_scale(truth: np.ndarray) -> str:
    """How to read a topic error against ``truth``: 0 is exact; uniform topics (nothing
    learned) score the value printed, so an error is also given as a share of it."""
    return f"0 = the true topics, {uniform_error(truth):.2f} = uniform topics (nothing learned)"


def uniform_error(truth: np.ndarray) -> float:
    return matched_topic_error(truth, np.full_like(truth, 1.0 / truth.shape[1]))["l2_mean"]


def describe_error(err: dict, truth: np.ndarray) -> str:
    """"0.0302 (13% of uniform topics' 0.24; worst topic 0.0410)" for matched_topic_error's dict."""
    u = uniform_error(truth)
    return (f"{err['l2_mean']:.4f} ({100 * err['l2_mean'] / u:.0f}% of uniform topics' {u:.2f}; "
            f"worst topic {err['l2_max']:.4f})")


def align_topics(topics: np.ndarray, words: list[str], vocabulary) -> np.ndarray:
    """The true (k, d_true) topics over ``vocabulary``'s columns: a word the vocabulary lacks
    loses its mass, a vocabulary word the generator never uses gets none; rows renormalised."""
    index = {w: i for i, w in enumerate(words)}
    out = np.zeros((topics.shape[0], len(vocabulary)))
    for j, w in enumerate(vocabulary):
        if w in index:
            out[:, j] = topics[:, index[w]]
    return out / np.maximum(out.sum(axis=1, keepdims=True), 1e-300)


def _demo_public_start(work: Path, vocab_fields: dict, k: int, n_docs: int, seed: int, out) -> str:
    """The demo's public start file: ``n_docs`` other documents about the same themes (another
    seed of the generator: the same six topics, other word weights), standing in for documents
    an operator declares public, fitted without privacy on the deployment's vocabulary."""
    if vocab_fields.get("vocabulary_mode") == "public":    # the one the release service builds
        vocab, _ = vocab_mod.public_vocabulary(ServiceConfig(**vocab_fields))
    else:
        vocab = Vocabulary.load(vocab_fields["vocabulary"])
    texts, _, _ = sample_texts(n_docs, seed=seed + 1000)
    tok = Tokenizer()
    X, _ = vocab.vectorize([tok.tokenize(t) for t in texts])
    start = PublicStart.fit(X, k, source=f"demo: {n_docs:,} public documents (generator seed "
                                         f"{seed + 1000})", seed=seed)
    path = work / "public-start.json"
    save_public_start(start, path, vocab)
    out(f"public start: {k} topics fitted without privacy on {n_docs:,} documents declared "
        f"public ({path}); no budget, named in every privacy report")
    return str(path)


def run_demo(*, epsilon: float | None = 1.0, warmup_docs: int = 20_000, stream_docs: int = 60_000,
             epochs: int = 4, sketchers: int = 2, bootstrap: str | None = None,
             workdir: str | None = None, sampler: str = DEFAULT_SAMPLER, seed: int = 0,
             timeout: float = 600.0, out=print, vocabulary: str | None = None,
             selection_docs: int = 10_000, privacy_unit: str = "document",
             max_docs_per_user_epoch: int | None = None, start: str = "auto",
             public_docs: int = 5_000, refinement_share_public: float | None = None,
             noise_seed: int | None = None) -> dict:

    # everything that can be refused is refused before a broker starts or a folder is made
    if epsilon is not None and (isinstance(epsilon, bool) or not isinstance(epsilon, (int, float))
                                or not (math.isfinite(epsilon) and epsilon > 0)):
        raise ValueError(f"epsilon must be a number > 0 (e.g. 1), got {epsilon!r}; for a demo "
                         "without privacy use --non-private")
    if vocabulary is not None and vocabulary not in VOCABULARY_CHOICES:
        raise ValueError(f"vocabulary must be one of {VOCABULARY_CHOICES}, got {vocabulary!r}")
    if vocabulary == "private" and epsilon is None:
        raise ValueError("--vocabulary private needs a budget: a non-private demo uses public or corpus")
    if privacy_unit not in ("document", "user"):
        raise ValueError(f"privacy_unit must be 'document' or 'user', got {privacy_unit!r}")
    if privacy_unit == "user" and epsilon is None:
        raise ValueError("--privacy-unit user needs a budget (a unit of privacy means nothing "
                         "without noise): drop --non-private")
    if privacy_unit == "user" and vocabulary == "private":
        raise ValueError("--privacy-unit user: a user-level vocabulary selection is not "
                         "implemented; use --vocabulary public or corpus")
    if start not in ("auto", "tensor", "public"):
        raise ValueError(f"start must be auto, tensor or public, got {start!r}")
    if start == "public" and vocabulary in (None, "private"):
        raise ValueError("--start public needs a vocabulary known before the start (a public "
                         "start is fitted on it): add --vocabulary public or corpus")
    if privacy_unit == "document" and max_docs_per_user_epoch is not None:
        raise ValueError("--max-docs-per-user-epoch bounds users: add --privacy-unit user")
    for name, n in (("warmup_docs", warmup_docs), ("stream_docs", stream_docs), ("epochs", epochs),
                    ("sketchers", sketchers), ("selection_docs", selection_docs)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
    t_start = time.time()
    broker = None
    if bootstrap is None:
        out("starting the embedded Kafka-protocol broker (Tansu, memory only) ...")
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap
    work = Path(workdir or tempfile.mkdtemp(prefix="streamdp-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    prefix = f"demo-{uuid.uuid4().hex[:8]}"
    names = TopicNames.from_prefix(prefix)
    ensure_topics(bootstrap, names, partitions=max(2, sketchers))
    out(f"broker {bootstrap}; topics {prefix}.*; work dir {work}")

    if vocabulary is None:      # private needs a budget: a non-private demo takes the public list
        # (and a user-level deployment a public vocabulary: no user-level selection yet)
        vocabulary = "private" if epsilon is not None and privacy_unit == "document" else "public"
    if vocabulary not in VOCABULARY_CHOICES:
        raise ValueError(f"vocabulary must be one of {VOCABULARY_CHOICES}, got {vocabulary!r}")
    if vocabulary != "private":
        selection_docs = 0
    n_all = selection_docs + warmup_docs + stream_docs
    with progress.bar(total=n_all, desc="generating the demo corpus", unit="doc") as bar:
        texts, topics, words = sample_texts(n_all, seed=seed, progress=bar.update)
    user_fields: dict = {}
    user_partitions = None
    if privacy_unit == "user":
        authors = zipf_users(n_all, seed=seed + 3)
        user_partitions = max(2, sketchers)       # the topics' partition count (ensure_topics)
        # decaying weights: under a Zipf law most users write one document, which then keeps
        # weight 1/H2(M) >= 0.6 instead of 1/M (docs/privacy.md "The user-level unit")
        user_fields = {"privacy_unit": "user", "user_weights": "decaying",
                       "max_docs_per_user_epoch": max_docs_per_user_epoch}
        per_user = np.unique(authors, return_counts=True)[1]
        out(f"privacy unit: the user. {len(per_user):,} users wrote the {n_all:,} documents "
            f"(documents per user from a Zipf law: median {int(np.median(per_user))}, most "
            f"{int(per_user.max())}); each user's documents go to partition "
            f"partition_for_user(user, {user_partitions})")

    def doc(i: int) -> dict:
        d = {"id": f"doc-{i}", "ts": float(ts[i]), "text": texts[i]}
        if user_partitions is not None:
            d["user"] = authors[i]
        return d
    epoch_seconds = 3600.0
    stream_start = float(int(time.time()) - 7 * 86400)    # a week ago: a replayed feed
    selection_end = stream_start - 86400.0
    ts = np.concatenate([
        np.sort(selection_end - 1 - 86400 * np.random.default_rng(seed + 2).random(selection_docs)),
        np.sort(stream_start - 86400 * np.random.default_rng(seed).random(warmup_docs)),
        stream_start + np.sort(np.random.default_rng(seed + 1).random(stream_docs)) * epochs * epoch_seconds])
    if vocabulary == "corpus":
        Vocabulary(words).save(work / "vocabulary.txt")
        vocab_fields = dict(vocabulary=str(work / "vocabulary.txt"),
                            vocabulary_public_by_assumption=True)
        out("vocabulary: the generator's own word list, public by assumption")
    elif vocabulary == "public":
        # the demo's words are everyday English: all but two are in wordfreq's top 20,000
        vocab_fields = dict(vocabulary_mode="public", vocabulary_size=20_000)
        out("vocabulary: wordfreq's 20,000 most frequent English words (public, no budget)")
    else:
        vocab_fields = dict(vocabulary_mode="private", selection_end=selection_end,
                            vocabulary_size=500, vocabulary_candidates=50_000,
                            vocabulary_max_words_per_document=16)
        out(f"vocabulary: selected privately from the {selection_docs:,} documents before "
            "selection_end, out of wordfreq's 50,000 most frequent English words")
    start_fields: dict = {"start": start}
    if refinement_share_public is not None:
        start_fields["refinement_share_public"] = float(refinement_share_public)
    if start == "public":
        start_fields["public_start_file"] = _demo_public_start(
            work, vocab_fields, topics.shape[0], public_docs, seed, out)
    cfg = ServiceConfig(bootstrap=bootstrap, topic_prefix=prefix, group_id=f"{prefix}-sketchers",
                        **vocab_fields, **start_fields, n_topics=topics.shape[0],
                        alpha0=1.0, epsilon=epsilon, non_private=epsilon is None, delta=1e-6,
                        horizon=epochs,
                        sampler=sampler, stream_start=stream_start, epoch_seconds=epoch_seconds,
                        ledger=str(work / "ledger.jsonl"), snapshot_dir=str(work / "snapshots"),
                        checkpoint_seconds=2.0, poll_seconds=0.5, seed=seed,
                        non_production=True,   # embedded broker: CreateTime, derived control key
                        # reproducible noise for tests: insecure, refused outside non_production
                        noise_seed=noise_seed, insecure_reproducible_noise=noise_seed is not None,
                        confirm_backfill=True,  # a replay of last week's documents, on purpose
                        closing="operator",   # a replay: epochs close by the flush below
                        **user_fields)
    if user_partitions is not None:     # what the release service records (and checks)
        user_partitions = documents_partition_count(cfg)
    release = ReleaseService(cfg)
    workers = [Sketcher(cfg, instance=f"sketcher-{i}") for i in range(sketchers)]
    threads = [threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True,
                                name=w.instance) for w in workers]
    threads.append(threading.Thread(target=release.run, kwargs={"install_signals": False},
                                    daemon=True, name="release"))
    for t in threads:
        t.start()
    try:
        if selection_docs:
            out(f"producing {selection_docs:,} selection-window documents; the sketchers hold "
                "the later ones until the vocabulary is selected")
            with progress.bar(total=selection_docs, desc="producing", unit="doc") as bar:
                produce(bootstrap, names.documents, (doc(i) for i in range(selection_docs)),
                        progress=bar.update, user_partitions=user_partitions)
        out(f"producing {warmup_docs:,} warm-up and {stream_docs:,} stream documents "
            f"({epochs} hourly epochs), one epoch at a time as a live feed would: the documents "
            "of epoch e are folded into the release of epoch e - 2 (refinement; the sketchers hold "
            "them until it exists)")
        control_producer = Producer(client_config(bootstrap, "producer"))
        epoch_of = np.where(np.arange(len(texts)) < selection_docs, 0, np.where(
            np.arange(len(texts)) < selection_docs + warmup_docs, 1, np.minimum(
                np.floor((ts - stream_start) / epoch_seconds).astype(int) + 1, epochs)))
        vocab_announced = []

        def truth():
            return align_topics(topics, words, release.vocabulary)
        deadline = time.time() + timeout
        seen_releases: set[str] = set()

        def report(snap) -> None:
            if snap is None or snap.release_id in seen_releases:
                return
            seen_releases.add(snap.release_id)
            t = truth()
            e = matched_topic_error(t, snap.topic_word)
            if not seen_releases - {snap.release_id}:       # the first release: say the scale
                out(f"  topic error = {ERROR_WHAT}: {error_scale(t)}")
            out(f"  [{time.time() - t_start:5.1f} s] epoch {snap.epoch}/{epochs} released: "
                f"{snap.stage} topics, topic error {describe_error(e, t)}")
            if snap.quality_note:
                out(f"      quality note: {snap.quality_note}")

        for e in range(1, epochs + 1):
            rows = np.flatnonzero(epoch_of == e)
            what = "warm-up and first-epoch" if e == 1 else f"epoch {e}"
            with progress.bar(total=len(rows), desc=f"producing {what} documents",
                              unit="doc") as bar:
                produce(bootstrap, names.documents, (doc(i) for i in rows),
                        progress=bar.update, user_partitions=user_partitions)
            out(f"  [{time.time() - t_start:5.1f} s] produced {len(rows):,} {what} documents; "
                "closing the epoch ...")
            # flush --through e: the operator's explicit order closes the warm-up and epochs <= e
            # once all partitions are caught up (a plain flush would close every epoch whose
            # close time has passed on the clock: all of them, in a replay of last week)
            control_producer.produce(names.control, value=control.encode(
                "flush", key=control.load_key(cfg), through=int(e)))
            control_producer.flush(10)
            while time.time() < deadline and not release.exhausted:
                if release.vocabulary is not None and not vocab_announced:
                    vocab_announced.append(release.vocabulary.id)
                    v = release.vocabulary_report()
                    missing = [w for w in words if w not in release.vocabulary]
                    out(f"  [{time.time() - t_start:5.1f} s] vocabulary {v['vocabulary_id']}: "
                        f"{len(release.vocabulary):,} words ({v['mode']}); of the generator's "
                        f"{len(words)} words {len(words) - len(missing)} are in it"
                        + (f" (missing: {' '.join(missing[:8])})" if missing else ""))
                report(release.latest)
                if release.latest is not None and release.latest.epoch >= e:
                    break           # released (the sketchers fetch its model when they need it)
                time.sleep(0.2)
            report(release.latest)
            if release.exhausted or time.time() >= deadline:
                break
        del control_producer
        snap = release.latest
        http_url = release.server.url if release.server is not None else "http://HOST:PORT"
        if snap is None:
            raise RuntimeError(f"no snapshot was released within {timeout:.0f} s"
                               + (f": {release.exhausted}" if release.exhausted else ""))
        vocab = release.vocabulary
        vocab.save(work / "vocabulary.txt")          # for `streamdp topics --vocabulary`
        t = truth()
        err = matched_topic_error(t, snap.topic_word)
        count = (f"≈ {snap.n_docs:,.0f} (a noised count" if epsilon is not None
                 else f"{snap.n_docs:,.0f} (exact, non-private")
        out(f"\nrelease {snap.release_id}: epoch {snap.epoch} of {epochs}; stream documents "
            f"{count}; {stream_docs:,} were produced)")
        out(f"topic error {describe_error(err, t)}")
        out(f"  ({ERROR_WHAT}; {error_scale(t)})")
        names_true = list(TOPICS)
        perm = err["permutation"]
        for i, top in enumerate(snap.top_words(vocab.words, 8)):
            true_i = int(np.flatnonzero(perm == i)[0]) if i in perm else None
            label = names_true[true_i] if true_i is not None else "?"
            out(f"  topic {i} ({label:>8}, α={snap.alpha[i]:.2f}): " + " ".join(w for w, _ in top))
        pr = snap.privacy
        if epsilon is not None:
            acc = pr["accountant"]
            spent, budget = acc["rho_worst_case"], acc["rho_budget"]
            first, last = pr["epochs_covered"][0], pr["epochs_covered"][-1]
            span = f"{first}–{last}" if first != last else f"{first}"
            out(f"\nprivacy: unit {pr['unit']}, neighbours: {pr['neighbouring']}; budget "
                f"ε={pr['epsilon']:g} at δ={pr['delta']:g} for all {pr['horizon']} releases "
                f"(epochs {span} of {pr['horizon']} released)")
            ub = pr.get("user_bounding")
            if ub:
                out(f"  user bounding: at most {ub['max_docs_per_user_epoch']} documents per user "
                    f"per epoch and {ub['max_docs_per_user']} in all, {ub['weights']} weights "
                    f"summing to ≤ 1 per user; the warm-up takes {ub['warmup_share']:.0%} of the "
                    "budget, charged with the stream (a user may write on both sides)")
            st = pr.get("start") or {}
            out(f"  start: {st.get('kind', 'tensor')} ({(st.get('choice') or {}).get('rule', '')})"
                + (f"; public input {st.get('source')!r}, no budget" if st.get("public_input") else ""))
            rule = (st.get("choice") or {}).get("auto_rule") or (st.get("choice") or {})
            if "warmup_nts" in rule:     # the start rule's released inputs (docs/privacy.md)
                nts = rule["warmup_nts"]
                pick = "tensor" if rule["rule_choice"] == "tensor" else "public"
                out(f"  start rule: warm-up count index {rule['index']:.3g}, warm-up subspace "
                    f"noise-to-signal {'inf' if nts is None else format(nts, '.3g')} -> {pick}"
                    + (" start (no public start file here: tensor)"
                       if pick != rule["start"] else " start"))
            out(f"  spent so far: ε {acc['epsilon_worst_case']:.2f} of {pr['epsilon']:.2f} at "
                f"δ {pr['delta']:g}, {100 * spent / budget:.0f}% of the budget (counted as zCDP "
                f"ρ, which adds up across releases where ε does not: ρ {spent:.4g} of {budget:.4g})")
            v = pr.get("vocabulary") or {}
            if v.get("mode") == "private":
                out(f"  the vocabulary selection spent the whole budget of its own documents (the "
                    f"window before selection_end: parallel composition, ρ "
                    f"{acc['rho_by_atom'].get('vocabulary', 0):.4g}): the other documents keep "
                    "their full budget")
        else:
            out("\nprivacy: none (--non-private): the topics and the count are exact")
        snap_dir = Path(cfg.snapshot_dir)
        vocab_file = work / "vocabulary.txt"
        out(f"\ndone in {time.time() - t_start:.1f} s. The snapshots are in {snap_dir}: "
            "epoch-*.msgpack, one per release, and latest.json (format: docs/schemas.md).")
        out("Look at them:")
        topics_cmd = f"streamdp topics --snapshot-dir {snap_dir} --vocabulary {vocab_file}"
        out(f"  {topics_cmd}            the latest topics, in words")
        out(f"  {topics_cmd} --json     the same as JSON (reading snapshots: docs/consumers.md)")
        out(f"A running release service also serves the latest one as JSON at GET /snapshot/latest "
            f"(this demo's was {http_url}/snapshot/latest until it stopped; a deployment logs "
            "'release service HTTP on ...' at start).")
        report_path = report_from_dir(snap_dir, work / "report.html", vocabulary=vocab)
        out(f"\nThe report (topics, their history, privacy spent), to open in a browser: {report_path}")
        return {"error": err["l2_mean"], "epoch": snap.epoch, "snapshot": snap, "workdir": str(work),
                "vocabulary_id": vocab.id, "report": str(report_path)}
    finally:
        # stopping on purpose: librdkafka's disconnect lines are DEBUG, not failures
        with quiet_librdkafka():
            for w in workers:
                w.stop()
            release.stop()
            for t in threads:
                t.join(timeout=30)
            # a client destroyed after the broker is gone logs its disconnects: destroy them first
            del workers, release, threads
            gc.collect()
            if broker is not None:
                broker.stop()
