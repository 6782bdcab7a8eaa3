"""The configuration's types and single-field rules (issue 26 item 2: config as data, on pydantic).

The attack (a careless operator): a value of the wrong type in a configuration file — ``"delta":
"1e-6"`` quoted, ``"seed": "7"``, ``"ledger": null`` — must be refused at start-up in one line
that names the field, like every other bad value. Before the move some fields had no check at
all (the service started with a string seed or a null ledger path) and some failed with a
traceback (``TypeError`` from a comparison) instead of the CLI's one-line error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import typing

import pytest

from streamdp.privacy.events import PRIVACY_UNITS
from streamdp.privacy.noise import SAMPLER_KINDS
from streamdp.privacy.user_bounding import SCHEDULES
from streamdp.services.config import ConfigError, ServiceConfig, from_mapping
from streamdp.start import SERVICE_START_CHOICES


@pytest.mark.parametrize("values, field", [
    ({"delta": "1e-6"}, "delta"),               # a TypeError in a comparison before
    ({"clip_quantile": "0.9"}, "clip_quantile"),
    ({"seed": "7"}, "seed"),                    # accepted before: no check
    ({"oversampling": 2.5}, "oversampling"),    # accepted before
    ({"ledger": None}, "ledger"),               # accepted before
    ({"group_id": 3}, "group_id"),              # accepted before
    ({"tokenizer": "english"}, "tokenizer"),    # accepted before
    ({"n_topics": "3"}, "n_topics"),            # strict: no "3" for an int
    ({"n_topics": True}, "n_topics"),           # nor true
    ({"horizon": 8.0}, "horizon"),              # nor 8.0
    ({"alpha0": True}, "alpha0"),               # no true for a number
    ({"alpha0": float("nan")}, "alpha0"),
    ({"poll_seconds": float("inf")}, "poll_seconds"),
    ({"metrics_port": 70000}, "metrics_port"),
    ({"closing": "never"}, "closing"),
])
def test_a_value_of_the_wrong_type_or_range_is_one_config_error_line(values, field):
    with pytest.raises(ConfigError) as e:
        from_mapping(values, env={})
    msg = str(e.value)
    assert type(e.value) is ConfigError and "\n" not in msg, msg
    assert msg.startswith(f"configuration field {field!r}: ") and f"got {values[field]!r}" in msg, msg


def test_replace_validates_like_the_constructor():
    cfg = ServiceConfig()
    with pytest.raises(ConfigError, match="configuration field 'n_topics': must be an integer >= 1"):
        cfg.replace(n_topics=0)
    with pytest.raises(ConfigError, match="unknown configuration field 'epsilom'.*'epsilon'"):
        ServiceConfig(epsilom=1.0)
    assert cfg.replace(n_topics=3).n_topics == 3
    assert isinstance(ServiceConfig(epoch_seconds=7200).epoch_seconds, float)   # an int is a number


def test_the_choices_are_the_lists_the_engine_checks():
    hints = typing.get_type_hints(ServiceConfig)
    assert typing.get_args(hints["sampler"]) == SAMPLER_KINDS
    assert typing.get_args(hints["user_weights"]) == SCHEDULES
    assert typing.get_args(hints["start"]) == SERVICE_START_CHOICES
    assert typing.get_args(hints["privacy_unit"]) == PRIVACY_UNITS


def test_the_cli_prints_a_type_error_as_one_line(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"delta": "1e-6", "ledger": str(tmp_path / "ledger.jsonl")}))
    r = subprocess.run([sys.executable, "-m", "streamdp", "release", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("streamdp: error: configuration field 'delta': must be in (0, 1), "
                                "got '1e-6'"), r.stderr
    assert not (tmp_path / "ledger.jsonl").exists()
