"""A typo'd configuration key or STREAMDP_* variable (issue 26 item 2): refused at start-up in one
line that names the nearest field, never ignored.

The attack (a careless operator): ``STREAMDP_EPSLION=0.1`` in a pod's environment was silently
ignored, so the service ran with the file's epsilon (1.0 by default) while the operator believed
0.1 was in force. A typo'd file key was refused, but with all the field names and no hint.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from streamdp.kafka.broker import free_port  # nothing listens there: a closed port
from streamdp.services.config import ConfigError, ServiceConfig, from_file, from_mapping

FIELDS = [f.name for f in dataclasses.fields(ServiceConfig)]


def _one_line_naming(exc: ConfigError, *names: str) -> str:
    msg = str(exc)
    assert "\n" not in msg, msg
    for name in names:
        assert name in msg, msg
    # not the whole field list: at most the two nearest fields are named
    assert sum(f"'{f}'" in msg for f in FIELDS) <= 2, msg
    return msg


@pytest.mark.parametrize("suffix, text", [
    (".json", '{"epsilom": 0.5, "n_topics": 3}'),
    (".toml", "epsilom = 0.5\nn_topics = 3\n"),
])
def test_a_typod_file_key_names_the_nearest_field(tmp_path, suffix, text):
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError, match="unknown configuration field") as e:
        from_file(path, env={})
    msg = _one_line_naming(e.value, "'epsilom'", "did you mean 'epsilon'?")
    assert "n_topics" not in msg


def test_several_typos_each_name_their_own_field_or_none():
    with pytest.raises(ConfigError) as e:
        from_mapping({"bootstrp": "kafka:9092", "privacyunit": "user", "zzqqxx": 1}, env={})
    msg = _one_line_naming(e.value, "'bootstrp' (did you mean 'bootstrap'?)",
                           "'privacyunit' (did you mean 'privacy_unit'?)",
                           "'zzqqxx' (no field has a similar name)")
    assert msg.count("did you mean") == 2


@pytest.mark.parametrize("name, meant", [
    ("STREAMDP_EPSLION", "STREAMDP_EPSILON"),
    ("STREAMDP_epsilon", "STREAMDP_EPSILON"),            # the variable is read in upper case only
    ("STREAMDP_NONPRIVATE", "STREAMDP_NON_PRIVATE"),
    ("STREAMDP_METRIC_PORT", "STREAMDP_METRICS_PORT"),    # ends in _PORT, but is no service link
])
def test_a_typod_environment_variable_is_refused_not_ignored(tmp_path, name, meant):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"epsilon": 1.0}))
    with pytest.raises(ConfigError, match="unknown environment variable") as e:
        from_file(path, env={name: "9400" if "PORT" in name else "0.1"})
    _one_line_naming(e.value, name, f"did you mean {meant}")


def test_other_streamdp_variables_are_not_fields_and_are_accepted():
    """Kubernetes' service links for the deployment's Services (streamdp-release ...), the
    progress switch and the test harness's variables are not configuration and pass."""
    env = {"STREAMDP_RELEASE_SERVICE_HOST": "10.0.0.7", "STREAMDP_RELEASE_SERVICE_PORT": "9400",
           "STREAMDP_RELEASE_SERVICE_PORT_METRICS": "9400",
           "STREAMDP_RELEASE_PORT": "tcp://10.0.0.7:9400",
           "STREAMDP_RELEASE_PORT_9400_TCP": "tcp://10.0.0.7:9400",
           "STREAMDP_RELEASE_PORT_9400_TCP_PROTO": "tcp",
           "STREAMDP_RELEASE_PORT_9400_TCP_PORT": "9400",
           "STREAMDP_RELEASE_PORT_9400_TCP_ADDR": "10.0.0.7",
           "STREAMDP_NO_PROGRESS": "1", "STREAMDP_UID": "10001",
           "STREAMDP_EPSILON": "0.5", "OTHER_EPSLION": "x"}
    assert from_mapping({}, env=env).epsilon == 0.5


def test_the_cli_refuses_a_typod_variable_in_one_line_before_the_ledger(tmp_path):
    cfg = tmp_path / "c.json"
    ledger = tmp_path / "ledger.jsonl"
    cfg.write_text(json.dumps({"epsilon": 1.0, "ledger": str(ledger),
                               "bootstrap": f"127.0.0.1:{free_port()}"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDP_")}
    env["STREAMDP_EPSLION"] = "0.1"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "streamdp", "release", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "STREAMDP_EPSLION" in lines[0], r.stderr
    assert "did you mean STREAMDP_EPSILON" in lines[0]
    assert not ledger.exists()
    # no broker round trip first (the bootstrap is a closed port): start-up, not a timeout
    assert time.monotonic() - t0 < 60
