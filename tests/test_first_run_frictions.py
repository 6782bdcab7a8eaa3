"""First-run frictions a new user met (issue 27 item 3), each pinned: clear one-line errors
instead of tracebacks or misleading advice, counts that say what they count."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from streamdp.cli import main
from streamdp.services.produce import read_corpus
from streamdp.services.demo_corpus import sample_texts

REPO = Path(__file__).resolve().parents[1]


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "streamdp", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_broker_on_a_port_in_use_says_so_in_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = cli("broker", "--port", str(port), timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert lines == [f"streamdp: error: port {port} in use; pick --port (another broker or "
                     f"Kafka is listening on 127.0.0.1:{port})"], r.stderr[-2000:]


def test_topics_names_a_missing_snapshot_folder_first(tmp_path, capsys):
    assert main(["topics", "--snapshot-dir", str(tmp_path / "nosuch")]) == 2
    err = capsys.readouterr().err
    assert "no snapshot folder at" in err and "vocabulary" not in err, err


def test_topics_help_has_a_description():
    r = cli("topics", "--help")
    assert r.returncode == 0
    assert "Print the newest released snapshot's topics" in r.stdout and "--trends" in r.stdout


def test_report_last_counts_what_it_shows(tmp_path):
    from test_report import make_snapshots, write_dir
    snaps, vocab = make_snapshots(epsilon=2.0, n_warmup=3000, n_stream=4000)
    folder = write_dir(tmp_path / "snaps", snaps, vocab)
    r = cli("report", str(folder), "--out", str(tmp_path / "r.html"), "--last", "2")
    assert r.returncode == 0, r.stderr
    assert "(the last 2 of 4 release(s) read from" in r.stdout, r.stdout
    r = cli("report", str(folder), "--out", str(tmp_path / "r.html"))
    assert "(4 release(s) read from" in r.stdout, r.stdout


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):
    texts, _, _ = sample_texts(3000, seed=1)
    p = tmp_path_factory.mktemp("vocab") / "docs.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return p


def test_vocab_private_says_how_many_words_rose_above_the_noise(docs_file, tmp_path):
    r = cli("vocab", "private", "--in", str(docs_file), "--out", str(tmp_path / "v.txt"),
            "--epsilon", "1", "--sampler", "fast", "--non-production")
    assert r.returncode == 0, r.stderr
    # the demo corpus has ~137 words: the rest of the 5000 come from the public list's rank
    assert "5000 words (" in r.stdout and "rose above the noise" in r.stdout
    above = int(r.stdout.split("5000 words (")[1].split(" rose")[0].replace(",", ""))
    assert 50 < above < 200, r.stdout


def test_vocab_private_errors_are_one_line_with_this_commands_advice(docs_file, tmp_path):
    few = tmp_path / "few.jsonl"
    few.write_text("".join(docs_file.read_text().splitlines(True)[:100]))
    r = cli("vocab", "private", "--in", str(few), "--out", str(tmp_path / "v.txt"),
            "--epsilon", "0.1", "--sampler", "fast", "--non-production")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("streamdp: error: ")
    assert "slice_share" not in r.stderr and "--epsilon" in r.stderr and ".." not in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a b c"}\n{"text": }\n')
    r = cli("vocab", "private", "--in", str(bad), "--out", str(tmp_path / "v.txt"),
            "--epsilon", "1", "--sampler", "fast", "--non-production")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{bad}:2: not valid JSON (Expecting value at column 10)" in r.stderr, r.stderr


def test_produce_names_a_bad_line_once(tmp_path):
    bad = tmp_path / "docs.jsonl"
    bad.write_text('{"id": "a", "ts": 1, "text": "x"}\n{"id": "b", "ts": 1, "text": }\n')
    (where, err), = [(w, o) for w, o in read_corpus(bad) if isinstance(o, Exception)]
    assert where.endswith("docs.jsonl:2")
    assert str(err) == "not valid JSON (Expecting value at column 30)"


@pytest.mark.parametrize("service", ["release", "sketcher"])
def test_a_refused_configuration_writes_and_starts_nothing(kafka_broker, tmp_path, service):
    """The README's production config without control_key_file: refused in one line, within
    seconds, before the ledger, the vocabulary file or the snapshot folder is written or a
    server is started (issue 27: it used to write them first)."""
    import time as _time
    data = tmp_path / "var"
    cfg = {"bootstrap": kafka_broker.bootstrap, "topic_prefix": "tickets-refused", "vocabulary_mode": "private",
           "selection_end": 1e9, "vocabulary_size": 5000, "n_topics": 20, "epsilon": 1.0,
           "delta": 1e-6, "horizon": 1024, "stream_start": 1e9 + 86400, "epoch_seconds": 86400,
           "lateness": 3600, "ledger": str(data / "ledger.jsonl"),
           "snapshot_dir": str(data / "snapshots")}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    t0 = _time.monotonic()
    r = cli(service, "--config", str(tmp_path / "c.json"), timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert _time.monotonic() - t0 < 30
    assert "control_key_file" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not data.exists(), list(data.rglob("*"))
    assert "HTTP on" not in r.stderr
