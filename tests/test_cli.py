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
    assert "n_topics" in r.stderr
    assert run("--help").returncode == 0


def test_every_subcommand_has_help():
    for cmd in ("demo", "broker", "sketcher", "release", "produce", "control", "topics", "simulate"):
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
    """The README's main job, smaller: broker + 2 sketchers + release, topics printed."""
    r = run("demo", "--warmup-docs", "4000", "--stream-docs", "12000", "--epochs", "2",
            "--epsilon", "4", "--sampler", "fast", "--workdir", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "epochs released: 2/2" in r.stdout
    err = float(r.stdout.split("mean matched L2 error vs the true topics ")[1].split()[0])
    assert err < 0.05, r.stdout
    assert "privacy: one document, add/remove; ε=4" in r.stdout
    snaps = sorted((tmp_path / "snapshots").glob("epoch-*.msgpack"))
    assert len(snaps) == 2
    t = run("topics", "--snapshot-dir", str(tmp_path / "snapshots"),
            "--vocabulary", str(tmp_path / "vocabulary.txt"), "-n", "5")
    assert t.returncode == 0, t.stderr
    assert t.stdout.count("topic ") == 6 and "epoch 2" in t.stdout
