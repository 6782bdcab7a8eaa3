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
