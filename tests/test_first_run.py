"""Issue 14, "first-run fixes": what a new user hits first gives a message, not a traceback.

Each test reproduces one finding of the issue (a subprocess runs the real CLI)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest

from streamdp.kafka.broker import free_port  # nothing listens there: a closed port


def run_cli(*args, cwd=None, timeout=120, env=None):
    import os
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = os.getcwd() + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "streamdp", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=e)



def one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("streamdp: error:")]
    assert len(errors) == 1, r.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


# ------------------------------------------------------------------ 1. topics, missing vocabulary
def test_topics_with_a_missing_vocabulary_names_the_file_and_the_flag(tmp_path):
    (tmp_path / "snaps").mkdir()
    r = run_cli("topics", "--snapshot-dir", str(tmp_path / "snaps"),
                "--vocabulary", str(tmp_path / "nope.txt"))
    one_line_error(r, "nope.txt", "--vocabulary")
    # without --vocabulary it looks next to the snapshots, and says so
    r = run_cli("topics", "--snapshot-dir", str(tmp_path / "snaps"))
    one_line_error(r, str(tmp_path / "snaps" / "vocabulary.txt"), "--vocabulary")
    # a missing folder is named first (issue 27: it used to complain about the vocabulary)
    r = run_cli("topics", "--snapshot-dir", str(tmp_path / "missing-dir"),
                "--vocabulary", str(tmp_path / "nope.txt"))
    one_line_error(r, "missing-dir", "--snapshot-dir")


# ------------------------------------------------------------------ 2. produce, bad lines
def test_produce_skips_and_counts_bad_lines_sends_the_rest_and_says_so(kafka_broker, kafka_topics,
                                                                       tmp_path):
    from confluent_kafka import Consumer, TopicPartition
    from streamdp.kafka.topics import client_config
    prefix = kafka_topics.documents.rsplit(".", 1)[0]
    lines = [json.dumps({"id": f"d{i}", "ts": 1000.0 + i, "text": "apples and pears"})
             for i in range(30)]
    lines[4] = json.dumps({"id": "no-ts", "text": "apples"})          # line 5: no ts
    lines[9] = json.dumps({"ts": 1009.0, "text": "apples"})           # line 10: no id
    lines[14] = '{"id": "broken", "ts": 1014.0, "text": '             # line 15: not JSON
    lines[19] = json.dumps({"id": "x", "ts": "yesterday", "text": "a"})  # line 20: ts not a number
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    r = run_cli("produce", "--bootstrap", kafka_broker.bootstrap, "--topic-prefix", prefix,
                str(corpus))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "KeyError" not in r.stderr, r.stderr
    assert f"{corpus}:5: missing field 'ts'" in r.stderr
    assert f"{corpus}:10: missing field 'id'" in r.stderr
    assert f"{corpus}:15: not valid JSON" in r.stderr
    assert f"{corpus}:20: field 'ts' must be a number" in r.stderr
    assert "delivered 26 of 26 documents" in r.stdout and "4 line(s)" in r.stdout, r.stdout
    # the 26 good documents really are in the topic
    c = Consumer(client_config(kafka_broker.bootstrap, "consumer", **{
        "group.id": f"{prefix}-check", "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    try:
        keys = set()
        c.assign([TopicPartition(kafka_topics.documents, p, 0) for p in (0, 1)])
        deadline = time.time() + 20
        while len(keys) < 26 and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                keys.add(m.key().decode())
    finally:
        c.close()
    assert keys == {f"d{i}" for i in range(30)} - {"d4", "d9", "d14", "d19"}


def test_produce_rejections_in_process_name_line_and_field(tmp_path):
    from streamdp.services.produce import Rejections, encoded_records
    f = tmp_path / "c.jsonl"
    f.write_text('{"id": 1, "ts": 5, "text": "a b"}\n[1, 2]\n\n{"id": 2, "ts": 6}\n')
    rej = Rejections()
    good = list(encoded_records(f, rej))
    assert [g[0] for g in good] == ["1"]
    assert rej.count == 2
    assert rej.first[0].startswith(f"{f}:2: a document must be a JSON object")
    assert rej.first[1].startswith(f"{f}:4: document '2': give exactly one of text")


# ------------------------------------------------------------------ 3. produce --create-topics
def test_produce_create_topics_with_a_wrong_bootstrap_names_bootstrap_fast(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "ts": 1, "text": "x"}\n')
    t0 = time.monotonic()
    r = run_cli("produce", "--bootstrap", f"127.0.0.1:{free_port()}", "--create-topics",
                str(corpus), timeout=60)
    assert time.monotonic() - t0 < 15
    one_line_error(r, "bootstrap", "cannot reach Kafka")
    assert "TimeoutError" not in r.stderr and len(r.stderr.splitlines()) < 5, r.stderr


# ------------------------------------------------------------------ 4. the release service's port
def test_release_service_logs_its_http_port_when_the_os_picks_it(kafka_broker, tmp_path, caplog):
    import re
    from service_helpers import fresh_topics, make_config, make_corpus
    from streamdp.services.release import ReleaseService
    corpus = make_corpus(200, 200, 1, seed=1)
    names = fresh_topics(kafka_broker.bootstrap)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, names, corpus, metrics_port=0)
    svc = ReleaseService(cfg)
    with caplog.at_level(logging.INFO, logger="streamdp"):
        svc.run(max_seconds=0.5, install_signals=False)
    lines = [r.getMessage() for r in caplog.records if "/snapshot/latest" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)", lines[0]).group(1))
    assert port > 0 and port == svc.server.port


# ------------------------------------------------------------------ 5. arguments before work
def test_simulate_refuses_bad_arguments_before_generating_data():
    for args, needle in ((["--epsilon", "0"], "--epsilon"), (["--epsilon", "nan"], "--epsilon"),
                         (["--delta", "2"], "--delta"), (["--batch", "0"], "--batch"),
                         (["--warmup", "0"], "--warmup"), (["--vocab", "10", "--topics", "20"],
                                                           "--topics")):
        t0 = time.monotonic()
        # defaults are 300,000 documents (seconds of generation): a refusal must come first
        r = run_cli("simulate", *args, timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "generated" not in r.stdout, (args, r.stdout)
        assert needle in r.stderr, (args, r.stderr)
        assert "None" not in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert time.monotonic() - t0 < 10
    r = run_cli("simulate", "--epsilon", "0")
    assert "--non-private" in r.stderr       # what to type instead


def test_demo_epsilon_zero_refuses_before_a_broker_or_a_work_folder(tmp_path):
    work = tmp_path / "work"
    r = run_cli("demo", "--epsilon", "0", "--workdir", str(work), timeout=60)
    assert r.returncode == 2 and "--epsilon" in r.stderr and "starting" not in r.stdout, r.stdout
    assert not work.exists()
    from streamdp.services.demo import run_demo
    said = []
    for kw in (dict(epsilon=0.0), dict(epsilon=float("inf")), dict(epochs=0),
               dict(epsilon=None, vocabulary="private"), dict(vocabulary="nope")):
        with pytest.raises(ValueError):
            run_demo(workdir=str(work), out=said.append, **kw)
    assert said == [] and not work.exists()


def test_every_option_has_help_and_shows_its_default():
    import argparse
    from streamdp.cli import build_parser

    def parsers(p):
        yield p
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction):
                for sp in act.choices.values():
                    yield from parsers(sp)
    checked = 0
    for p in parsers(build_parser()):
        text = p.format_help()
        for act in p._actions:
            if isinstance(act, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert act.help, (p.prog, act.option_strings or act.dest)
            if act.default not in (None, False) and act.option_strings:
                # the rendered help shows the value (or the help text says it in words)
                assert f"default: {act.default}" in " ".join(text.split()) or "default" in act.help, \
                    (p.prog, act.option_strings)
            checked += 1
    assert checked > 60


# ------------------------------------------------------------------ 6. relative vocabulary path
def test_relative_vocabulary_in_a_config_file_resolves_against_its_folder(tmp_path, monkeypatch):
    import argparse
    from streamdp.cli.common import config_from_args as _config
    from streamdp.services.config import from_file
    from streamdp.text.vocabulary import Vocabulary
    conf = tmp_path / "deploy"
    conf.mkdir()
    Vocabulary([f"w{i}" for i in range(20)]).save(conf / "v.txt")
    (conf / "c.json").write_text(json.dumps({"vocabulary": "v.txt", "n_topics": 3,
                                             "vocabulary_public_by_assumption": True}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = from_file("../deploy/c.json", env={})
    assert cfg.vocabulary == str(conf / "v.txt")
    assert len(cfg.load_vocabulary()) == 20
    # the CLI path (--config) does the same
    ns = argparse.Namespace(config="../deploy/c.json")
    assert _config(ns).vocabulary == str(conf / "v.txt")
    # an absolute path stays as it is
    (conf / "abs.json").write_text(json.dumps({"vocabulary": str(conf / "v.txt")}))
    assert from_file(conf / "abs.json", env={}).vocabulary == str(conf / "v.txt")
    # a flag or an environment variable is the typist's own path: the working directory
    Vocabulary([f"u{i}" for i in range(10)]).save(elsewhere / "u.txt")
    assert _config(argparse.Namespace(config="../deploy/c.json", vocabulary="u.txt")).vocabulary == "u.txt"
    cfg = from_file("../deploy/c.json", env={"STREAMDP_VOCABULARY": "u.txt"})
    assert cfg.vocabulary == "u.txt" and len(cfg.load_vocabulary()) == 10


# ------------------------------------------------------------------ 7. stream_start in the past
def test_stream_start_more_than_one_epoch_ago_needs_confirmation_on_a_new_deployment():
    from streamdp.services.config import ConfigError, ServiceConfig, check_stream_start
    now = 1_800_000_000.0
    day = 86400.0
    cfg = ServiceConfig(stream_start=now - 322.5 * day, epoch_seconds=day, horizon=365)
    with pytest.raises(ConfigError) as e:
        check_stream_start(cfg, first_start=True, now=now)
    msg = str(e.value)
    assert "'stream_start'" in msg and "322 epoch(s)" in msg and "confirm_backfill: true" in msg
    assert f"{now - 0.5 * day:.0f}" in msg           # the current epoch's start, to copy
    check_stream_start(cfg.replace(confirm_backfill=True), first_start=True, now=now)
    check_stream_start(cfg, first_start=False, now=now)               # an existing deployment
    check_stream_start(cfg.replace(stream_start=now - 0.9 * day), first_start=True, now=now)
    check_stream_start(cfg.replace(stream_start=now + day), first_start=True, now=now)
    with pytest.raises(ConfigError):
        check_stream_start(ServiceConfig(), first_start=True, now=now)   # the default, 1970


def test_release_service_refuses_an_old_stream_start_before_writing_anything(kafka_broker, tmp_path):
    from confluent_kafka import Consumer, TopicPartition
    from service_helpers import fresh_topics, make_config, make_corpus
    from streamdp.kafka.topics import client_config
    from streamdp.services.config import ConfigError
    from streamdp.services.release import ReleaseService
    corpus = make_corpus(200, 200, 1, seed=1, stream_start=time.time() - 10 * 86400)
    names = fresh_topics(kafka_broker.bootstrap)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, names, corpus, epsilon=1.0, noise_seed=None,
                      confirm_backfill=False, non_production=True)   # sampler 'fast'
    with pytest.raises(ConfigError, match=r"stream_start.*240 epoch\(s\).*confirm_backfill"):
        ReleaseService(cfg)
    assert not (tmp_path / "ledger.jsonl").exists()
    c = Consumer(client_config(kafka_broker.bootstrap, "consumer", **{
        "group.id": f"{names.state}-check", "enable.partition.eof": True}))
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(names.state, 0), timeout=10)
        assert hi == lo == 0                          # nothing on the state topic either
    finally:
        c.close()
    ReleaseService(cfg.replace(confirm_backfill=True)).close()       # confirmed: it starts
    ReleaseService(cfg).close()        # and once it has started, the deployment is not new


def test_release_cli_with_the_readmes_old_stream_start_says_what_to_fix(kafka_broker, tmp_path):
    from streamdp.kafka.topics import TopicNames, ensure_topics
    from streamdp.text.vocabulary import Vocabulary
    Vocabulary([f"w{i}" for i in range(30)]).save(tmp_path / "v.txt")
    prefix = f"old-{time.time_ns()}"
    ensure_topics(kafka_broker.bootstrap, TopicNames.from_prefix(prefix), partitions=1)
    (tmp_path / "c.json").write_text(json.dumps({
        "bootstrap": kafka_broker.bootstrap, "topic_prefix": prefix,
        "vocabulary": "v.txt", "vocabulary_public_by_assumption": True, "n_topics": 3,
        "stream_start": 1767225600, "epoch_seconds": 86400, "ledger": str(tmp_path / "l.jsonl"),
        "snapshot_dir": str(tmp_path / "s"), "non_production": True}))
    r = run_cli("release", "--config", str(tmp_path / "c.json"), timeout=60)
    one_line_error(r, "stream_start", "confirm_backfill")
    assert not (tmp_path / "l.jsonl").exists()


# ------------------------------------------------------------------ services before the topics
def test_services_without_their_topics_say_how_to_create_them(kafka_broker, tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({
        "bootstrap": kafka_broker.bootstrap, "topic_prefix": f"absent-{time.time_ns()}",
        "vocabulary_mode": "public", "n_topics": 3, "stream_start": time.time() + 3600,
        "ledger": str(tmp_path / "l.jsonl"), "snapshot_dir": str(tmp_path / "s"),
        "non_production": True}))
    for cmd in ("release", "sketcher"):
        r = run_cli(cmd, "--config", str(tmp_path / "c.json"), timeout=60)
        one_line_error(r, "does not exist", "--create-topics", "topic_prefix")
    assert not (tmp_path / "l.jsonl").exists()


# ------------------------------------------------------------------ librdkafka's own log lines
def test_plain_clients_do_not_flood_stderr_with_librdkafka_lines():
    """client_config routes librdkafka's log through Python logging (the demo, produce, tests
    use it directly): a refused connection used to print a '%3|...|FAIL|' line every 50 ms."""
    code = (
        "import socket\n"
        "from confluent_kafka import KafkaException\n"
        "from confluent_kafka.admin import AdminClient\n"
        "from streamdp.kafka.topics import client_config\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "a = AdminClient(client_config(f'127.0.0.1:{port}', 'admin'))\n"
        "try:\n"
        "    a.list_topics(timeout=2)\n"
        "except KafkaException:\n"
        "    print('refused')\n")
    import os
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.stdout.strip() == "refused", r.stderr[-2000:]
    assert "%3|" not in r.stderr and len(r.stderr.splitlines()) <= 2, r.stderr[-2000:]


def test_librdkafka_lines_are_log_records_one_per_episode_at_warning(caplog, capfd):
    """A producer against a closed port: librdkafka's 'Connection refused' lines (logged at
    syslog err, one per reconnect) arrive as ONE WARNING record of the librdkafka logger,
    the repeats counted, and nothing raw ('%3|...') on stderr."""
    from confluent_kafka import Producer
    from streamdp.kafka.connectivity import LIBRDKAFKA_LOGGER, LOG_GATE
    from streamdp.kafka.topics import client_config
    LOG_GATE.end_episode()
    with caplog.at_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER):
        p = Producer(client_config(f"127.0.0.1:{free_port()}", "producer", **{
            "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 20}))
        p.produce("t", b"x")
        p.flush(2)
        del p
    records = [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER]
    refused = [r for r in records if "Connection refused" in r.getMessage()]
    try:
        assert len(refused) == 1, [r.getMessage() for r in records]
        assert refused[0].levelno == logging.WARNING        # syslog err (ERROR), demoted
        assert "repeats suppressed" in refused[0].getMessage()
        assert LOG_GATE.suppressed >= 3                     # librdkafka did retry, quietly
    finally:
        LOG_GATE.end_episode()
    err = capfd.readouterr().err
    assert "%3|" not in err and "Connection refused" not in err, err[-2000:]


def test_librdkafka_lines_are_debug_while_a_broker_is_stopped_on_purpose(caplog):
    from confluent_kafka import Producer
    from streamdp.kafka.connectivity import LIBRDKAFKA_LOGGER, LOG_GATE, quiet_librdkafka
    from streamdp.kafka.topics import client_config
    LOG_GATE.end_episode()
    with caplog.at_level(logging.INFO, logger=LIBRDKAFKA_LOGGER), quiet_librdkafka():
        p = Producer(client_config(f"127.0.0.1:{free_port()}", "producer"))
        p.produce("t", b"x")
        p.flush(1)
        del p
    assert not [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER]
    assert not LOG_GATE.in_episode        # a dropped line starts no episode
    with caplog.at_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER), quiet_librdkafka():
        p = Producer(client_config(f"127.0.0.1:{free_port()}", "producer"))
        p.produce("t", b"x")
        p.flush(1)
        del p
    got = [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER]
    LOG_GATE.end_episode()
    assert got and all(r.levelno == logging.DEBUG for r in got)


# ------------------------------------------------------------------ progress bars
def _on_a_terminal(args, cwd=None):
    """Run the CLI with standard error on a pseudo-terminal (80 columns), standard output on
    a pipe: (returncode, stdout, stderr)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    env.pop("STREAMDP_NO_PROGRESS", None)
    p = subprocess.Popen([sys.executable, "-m", "streamdp", *args], stdout=subprocess.PIPE,
                         stderr=slave, stdin=subprocess.DEVNULL, cwd=cwd, env=env)
    os.close(slave)
    err = b""
    out = []
    import threading
    reader = threading.Thread(target=lambda: out.append(p.stdout.read()))
    reader.start()
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
        elif p.poll() is not None:
            break
    p.wait(120)
    reader.join(10)
    os.close(master)
    return p.returncode, out[0].decode(), err.decode(errors="replace")


SIMULATE_SMALL = ("simulate", "--warmup", "20000", "--stream", "40000", "--vocab", "200",
                  "--topics", "4", "--sampler", "fast", "--non-production", "--batch", "4096", "--json")


def test_simulate_progress_only_on_a_terminal_and_never_on_stdout():
    r = run_cli(*SIMULATE_SMALL)                         # stderr is a pipe: no bar
    assert r.returncode == 0, r.stderr[-2000:]
    plain = json.loads(r.stdout)                          # stdout is exactly one JSON object
    assert "%|" not in r.stderr and "doc/s" not in r.stderr, r.stderr[-2000:]
    rc, out, err = _on_a_terminal(SIMULATE_SMALL)
    assert rc == 0, err[-2000:]
    on_tty = json.loads(out)                              # still exactly one JSON object
    assert "generating documents" in err and "warm-up + sketch" in err and "doc/s" in err, err
    assert on_tty.keys() == plain.keys() and on_tty["documents"] == plain["documents"]
    assert len(on_tty["per_topic"]) == 4
    rc, out, err = _on_a_terminal((*SIMULATE_SMALL, "--no-progress"))
    assert rc == 0 and json.loads(out).keys() == plain.keys()
    assert "%|" not in err and "doc/s" not in err, err


def test_produce_progress_on_a_terminal_stdout_is_the_summary_only(kafka_broker, kafka_topics,
                                                                 tmp_path):
    prefix = kafka_topics.documents.rsplit(".", 1)[0]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "ts": 1000.0 + i, "text": "pears"}) + "\n"
                              for i in range(3000)))
    args = ("produce", "--bootstrap", kafka_broker.bootstrap, "--topic-prefix", prefix, str(corpus))
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = f"delivered 3,000 of 3,000 documents to {kafka_topics.documents}; 0 line(s) of {corpus} rejected"
    assert r.stdout.splitlines() == [summary], r.stdout
    assert "%|" not in r.stderr and "doc/s" not in r.stderr, r.stderr
    rc, out, err = _on_a_terminal(args)
    assert rc == 0, err[-2000:]
    assert out.splitlines() == [summary], out
    assert "documents sent" in err and "/3.00k" in err and "doc/s" in err, err   # of the file's lines
