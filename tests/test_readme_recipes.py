"""The README's "Against an existing Kafka" recipe, executed as written (issue 27 item 3).

The bash block is taken from README.md and run by bash with three substitutions only: the
bootstrap (`kafka:9092` → the embedded broker), the data folder (`/var/lib/streamdp` → a
temporary one) and the topic prefix (unique per run on the shared test broker); `streamdp` is
this checkout's CLI. A corpus.jsonl of the demo corpus in the selection window is given to
`produce`. The long-running services are started in the background as the recipe starts them:
both must come up (the release service logs its HTTP address, the sketcher joins its group)
and stop cleanly on SIGTERM. The `topics`/`report` lines need a released day: they are run
and must say there is nothing yet in one line, not fail with a traceback. (The embedded broker
stamps CreateTime whatever the topic says, so this production sketcher dead-letters the
documents as producer_timestamp; a real Kafka stamps LogAppendTime. What runs here is the
recipe's configuration and every start-up check.)

Before issue 27 the recipe had no control_key_file (refused), and with one the sketcher died at
start: its broker-time check passed the admin client's configuration where a bootstrap string
was expected (streamdp.kafka.topics._admin), so every production sketcher timed out.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from streamdp.services.demo_corpus import sample_texts

REPO = Path(__file__).resolve().parents[1]


def readme_block(heading: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def wait_for_text(path: Path, needle: str, timeout: float, proc) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return text
        if proc.poll() is not None:
            pytest.fail(f"{path.name}: exited {proc.returncode} before '{needle}':\n{text[-3000:]}")
        time.sleep(0.3)
    pytest.fail(f"{path.name}: no '{needle}' within {timeout} s:\n{text[-3000:]}")


@pytest.mark.slow
def test_against_an_existing_kafka_runs_as_written(kafka_broker, tmp_path):
    block = readme_block("Against an existing Kafka")
    prefix = f"tickets{uuid.uuid4().hex[:8]}"
    data = tmp_path / "var"
    script = (block.replace("kafka:9092", kafka_broker.bootstrap)
              .replace("/var/lib/streamdp", str(data))
              .replace('"topic_prefix": "tickets"', f'"topic_prefix": "{prefix}"'))
    assert '"control_key_file"' in script and "openssl rand" in script
    setup, _, rest = script.partition("streamdp sketcher")
    services = [l for l in ("streamdp sketcher" + rest).splitlines()
                if l.startswith(("streamdp sketcher", "streamdp release"))]
    after = [l for l in ("streamdp sketcher" + rest).splitlines()
             if l.startswith(("streamdp topics", "streamdp report"))]
    assert len(services) == 2 and len(after) == 2, script
    # the documents the recipe produces: the demo corpus inside the selection window
    start = (int(time.time()) // 86400) * 86400 + 86400
    texts, _, _ = sample_texts(400, seed=2)
    (tmp_path / "corpus.jsonl").write_text("".join(
        json.dumps({"id": f"t-{i}", "ts": start - 86400 - 3600 + i, "text": t}) + "\n"
        for i, t in enumerate(texts)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    shim = f'streamdp() {{ "{sys.executable}" -m streamdp "$@"; }}\n'
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", shim + setup], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert (tmp_path / "control.key").stat().st_size >= 64
    procs = []
    try:
        for line, name in zip(services, ("sketcher", "release")):
            log = open(tmp_path / f"{name}.log", "w")
            procs.append((name, subprocess.Popen(["bash", "-c", shim + "exec " + line.split("#")[0]
                                                  .replace("streamdp ", f'"{sys.executable}" -m streamdp ', 1)],
                                                 cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True)))
        sketcher, release = procs[0][1], procs[1][1]
        wait_for_text(tmp_path / "release.log", "release service HTTP on", 120, release)
        wait_for_text(tmp_path / "sketcher.log", "assign", 120, sketcher)
        for line in after:
            r = subprocess.run(["bash", "-c", shim + line], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
            assert "Traceback" not in r.stderr, (line, r.stderr[-3000:])
            assert r.returncode == 2 and r.stderr.count("\n") == 1, (line, r.returncode, r.stderr)
            assert "no snapshots" in r.stderr or "no snapshot" in r.stderr, (line, r.stderr)
    finally:
        for name, p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for name, p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                pytest.fail(f"{name} did not stop within 60 s of SIGTERM")
    for name, p in procs:
        text = (tmp_path / f"{name}.log").read_text(errors="replace")
        assert p.returncode == 0, (name, p.returncode, text[-3000:])
        assert "Traceback" not in text, (name, text[-3000:])
