import json
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "streamdp", *args], capture_output=True, text=True,
                          timeout=300)


def test_simulate_runs_and_reports():
    r = run("simulate", "--vocab", "200", "--topics", "4", "--warmup", "5000", "--stream", "20000",
            "--epsilon", "2")
    assert r.returncode == 0, r.stderr
    assert "mean matched L2 error" in r.stdout
    err = float(r.stdout.split("mean matched L2 error ")[1].split()[0])
    assert err < 0.05
    assert '"unit": "one document"' in r.stdout


def test_bad_arguments_fail_with_a_message():
    r = run("simulate", "--topics", "0", "--warmup", "100", "--stream", "100")
    assert r.returncode == 2
    assert "--topics" in r.stderr     # names the flag the user typed
    assert run("--help").returncode == 0


def test_every_subcommand_has_help():
    for cmd in ("demo", "broker", "sketcher", "release", "produce", "control", "topics", "simulate",
                "report"):
        r = run(cmd, "--help")
        assert r.returncode == 0, (cmd, r.stderr)
        assert "usage:" in r.stdout


def test_bad_service_configuration_fails_at_start_with_what_to_fix(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"bootstrap": "127.0.0.1:1", "vocabulary": "missing.txt", "n_topics": 3}')
    r = run("sketcher", "--config", str(cfg))
    assert r.returncode == 2 and "vocabulary" in r.stderr and "missing.txt" in r.stderr
    cfg.write_text('{"bootstrap": "127.0.0.1:1", "epsilon": -1}')
    r = run("release", "--config", str(cfg))
    assert r.returncode == 2 and "'epsilon'" in r.stderr
    cfg.write_text('{"bootstrp": "x"}')
    r = run("release", "--config", str(cfg))
    assert r.returncode == 2 and "unknown configuration field" in r.stderr and "bootstrp" in r.stderr
    r = run("release", "--config", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "nope.json" in r.stderr


def test_demo_runs_end_to_end_on_the_embedded_broker(tmp_path):
    """The README's main job, smaller: broker + 2 sketchers + release, topics printed.

    The noise is seeded (``--noise-seed``, insecure, for tests): unseeded, one run in about a
    dozen drew an epoch-1 release of error 0.09 (typical 0.06) and its refined epoch 3 came out
    at 0.061 against the 0.05 below (typical 0.016). Seeded, the figures are the same every run
    (epoch 3: 0.0158), so a change in them is a change in the code."""
    r = run("demo", "--warmup-docs", "4000", "--stream-docs", "12000", "--epochs", "3",
            "--epsilon", "4", "--sampler", "fast", "--noise-seed", "1", "--workdir", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # three epochs: with the refinement model lag of 2 (docs/privacy.md) epochs 1 and 2 are
    # spectral releases and epoch 3 is the first refined one, folded into epoch 1's snapshot
    assert "epoch 3/3 released" in r.stdout, r.stdout[-2000:]
    err = float(r.stdout.split("\ntopic error ")[1].split()[0])
    assert err < 0.05, r.stdout
    # numbers come with their scale (issue 14): a noised count says so, the error says what it
    # is and what no information scores, the budget is spent-of-total as ε at δ with a percentage
    assert "stream documents ≈ " in r.stdout and "(a noised count; 12,000 were produced)" in r.stdout
    assert "mean L2 distance of each released topic to its matched true topic" in r.stdout
    scale = r.stdout.split("0 = the true topics, ")[1]
    uniform = float(scale.split()[0])
    assert scale.startswith(f"{uniform:.2f} = uniform topics (nothing learned)") and 0.1 < uniform < 1
    share = r.stdout.split("\ntopic error ")[1].split("(")[1].split("%")[0]
    assert abs(int(share) - 100 * err / uniform) < 1.5, (share, err, uniform)   # printed roundings
    assert "worst topic " in r.stdout
    assert "budget ε=4 at δ=1e-06 for all 3 releases" in r.stdout
    assert "spent so far: ε 4.00 of 4.00 at δ 1e-06, 100% of the budget" in r.stdout, r.stdout
    # librdkafka's disconnect lines at shutdown are debug-level: nothing on stderr
    assert "rdkafka" not in r.stderr and "%3|" not in r.stderr, r.stderr[-2000:]
    snaps = sorted((tmp_path / "snapshots").glob("epoch-*.msgpack"))
    assert len(snaps) == 3
    # it ends by saying how to look at the snapshots, and the command it prints works
    assert "/snapshot/latest" in r.stdout
    printed = [ln.split() for ln in r.stdout.splitlines() if ln.strip().startswith("streamdp topics")]
    assert len(printed) == 2 and "--json" in printed[1], r.stdout[-1500:]
    # every command it prints works (the explanation after the command is not part of it)
    printed = [cmd[:cmd.index("--json") + 1] if "--json" in cmd else cmd[:6] for cmd in printed]
    t = run(*printed[1][1:])
    assert t.returncode == 0, (printed[1], t.stderr)
    assert json.loads(t.stdout)["epoch"] == 3
    t = run(*printed[0][1:], "-n", "5")
    assert t.stdout.count("topic ") == 6 and "epoch 3" in t.stdout
    # and it ends by pointing at the HTML report it wrote (tests/test_report.py renders one)
    last = r.stdout.strip().splitlines()[-1]
    assert "open in a browser" in last and last.endswith(str(tmp_path / "report.html")), last
    page = (tmp_path / "report.html").read_text()
    assert page.count('class="card topic-card"') == 6 and 'id="privacy-budget"' in page
    assert "3 releases read (epoch 1 → epoch 3)" in page


def test_control_messages_from_the_cli_are_signed(kafka_broker, kafka_topics, tmp_path):
    """`streamdp control` signs with the deployment's control key (control_key_file), so the
    release service of a production deployment acts on them; without a key it refuses."""
    import json
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from streamdp.kafka.topics import client_config
    from streamdp.services import control

    key_file = tmp_path / "control.key"
    key_file.write_text("a1" * 32 + "\n")
    prefix = kafka_topics.documents.rsplit(".", 1)[0]
    base = {"bootstrap": kafka_broker.bootstrap, "topic_prefix": prefix, "epsilon": 1.0}
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**base, "control_key_file": str(key_file)}))
    r = run("control", "--config", str(cfg), "flush")
    assert r.returncode == 0, r.stderr
    r = run("control", "--config", str(cfg), "close", "--through", "3")
    assert r.returncode == 0, r.stderr

    c = Consumer(client_config(kafka_broker.bootstrap, "consumer", **{
        "group.id": f"cli-test-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(kafka_topics.control, 0, OFFSET_BEGINNING)])
        got = []
        for _ in range(100):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(control.decode(m.value()))
            if len(got) == 2:
                break
    finally:
        c.close()
    assert [g["type"] for g in got] == ["flush", "close"] and got[1]["through"] == 3
    key = key_file.read_bytes().strip()
    assert all(control.authentic(g, key) for g in got)
    assert not any(control.authentic(g, b"b2" * 32) for g in got)

    # a production deployment without a control key: refused, naming the field
    cfg.write_text(json.dumps(base))
    r = run("control", "--config", str(cfg), "flush")
    assert r.returncode == 2 and "control_key_file" in r.stderr, r.stderr


def test_help_loads_no_kafka_config_report_or_numba():
    """Why the CLI's command bodies, the report's renderer and the numba kernels are imported
    inside functions (docs/architecture.md, "Layers"): `streamdp --help` loads none of them."""
    code = ("import runpy, sys\nsys.argv = ['streamdp', '--help']\n"
            "try:\n    runpy.run_module('streamdp', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "heavy = ('confluent_kafka', 'pydantic', 'plotly', 'jinja2', 'numba')\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
