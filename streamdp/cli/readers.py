"""The commands that read released snapshots: ``topics`` (and ``topics --trends``) and
``report`` (docs/consumers.md, docs/report.md). They read only published output.
"""
from __future__ import annotations

import json
from pathlib import Path

from streamdp import snapshots
from streamdp import trends as T
from streamdp.cli.common import HelpFormatter, positive_float, positive_int
# the report package loads its renderer (jinja2, plotly) only when write_report runs
from streamdp.report import write_report
from streamdp.report.load import load_snapshots, load_vocabulary, open_source
from streamdp.snapshots import KafkaSource
from streamdp.text.vocabulary import Vocabulary


def _topics(a) -> int:
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


def add_report(sub) -> None:
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


def add_topics(sub) -> None:
    """``streamdp topics``."""
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
