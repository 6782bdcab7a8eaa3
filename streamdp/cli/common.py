"""What several subcommands share: argument types, the service flags, the configuration.

:func:`config_from_args` builds a deployment's configuration from ``--config``, the flags and
the ``STREAMDP_<FIELD>`` environment; :func:`service_args` adds the flags every service
command takes; the argument types refuse bad values with a message that says what to give.
"""
from __future__ import annotations

import argparse
import json
import logging
import math

from streamdp import progress
from streamdp.errors import ConfigError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" after an option's help, except where there is nothing to show
    (no default, a flag) or the help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.default is None or action.default is False or action.default is argparse.SUPPRESS
                or "default" in text):
            return text
        return super()._get_help_string(action)


def _number(kind, test, what):
    def parse(raw: str):
        try:
            v = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not {what}") from None
        if not test(v):
            raise argparse.ArgumentTypeError(f"{raw!r} is not {what}")
        return v
    parse.__name__ = what
    return parse


def epsilon_type(raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        v = None
    if v is None or not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{raw!r}: ε must be a number > 0 (e.g. 1); without "
                                         "privacy use --non-private instead")
    return v


positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a number > 0")
probability = _number(float, lambda v: 0 < v < 1, "a number in (0, 1)")
positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
nonnegative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
port = _number(int, lambda v: 0 <= v <= 65535, "a TCP port 0..65535")


def service_args(sp, *, deployment: bool = True) -> None:
    sp.add_argument("--config", help="deployment configuration file (JSON, or TOML by its .toml "
                                     "suffix; docs/configuration.md)")
    sp.add_argument("--bootstrap", help="Kafka bootstrap servers (overrides the config; config "
                                        "default 127.0.0.1:9092)")
    sp.add_argument("--topic-prefix", dest="topic_prefix",
                    help="topic name prefix (overrides the config; config default streamdp)")
    if deployment:
        sp.add_argument("--vocabulary", help="vocabulary file, one word per line (overrides the "
                                             "config's 'vocabulary')")
        sp.add_argument("--start", choices=("auto", "tensor", "public"),
                        help="the start of the refinement (overrides the config's 'start'; "
                             "every service of a deployment must agree; docs/configuration.md)")
        sp.add_argument("--public-start-file", dest="public_start_file",
                        help="topics file of `streamdp public-start`: the public start (overrides "
                             "the config's 'public_start_file')")
        sp.add_argument("--metrics-port", dest="metrics_port", type=port,
                        help="HTTP port for /metrics, /healthz, /readyz (release: also "
                             "/snapshot/latest); 0 = any free port, logged at start (config "
                             "default 0)")
    sp.add_argument("--log-level", dest="log_level", default="INFO",
                    type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                    help="log level")


def progress_flag(sp) -> None:
    progress.add_flag(sp)


def config_from_args(a: argparse.Namespace):
    """--config (JSON or TOML), then flags, then STREAMDP_<FIELD> environment variables."""
    # services.config and the Kafka modules load confluent_kafka: imported when a command
    # runs, not for --help
    from streamdp.services.config import from_mapping, load_file
    values = load_file(a.config) if getattr(a, "config", None) else {}
    for field in ("bootstrap", "topic_prefix", "vocabulary", "ledger", "snapshot_dir",
                  "metrics_port", "epsilon", "sampler", "start", "public_start_file"):
        v = getattr(a, field, None)
        if v is not None:
            values[field] = v
    if getattr(a, "non_private", False):
        if getattr(a, "epsilon", None) is not None:
            raise ConfigError("--non-private and --epsilon contradict each other: give one")
        values["non_private"] = True
        values["epsilon"] = None       # the flag says it in so many words
    return from_mapping(values)


def check_reachable(cfg) -> None:
    """Fail within seconds, naming 'bootstrap', when Kafka cannot be reached."""
    # confluent_kafka: loaded when a command runs, not for --help
    from streamdp.kafka.clients import service_client_config
    from streamdp.kafka.connectivity import check_bootstrap
    check_bootstrap(service_client_config(cfg.bootstrap, cfg.kafka, "admin"), timeout=10.0)


def setup_logging(a) -> None:
    logging.basicConfig(level=getattr(a, "log_level", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def read_documents(path: str, tokenizer) -> list[list[str]]:
    """Token lists of a JSONL file ({"text": ...} or {"tokens": [...]} per line) or a plain
    text file (one document per line). Bad lines are errors naming the line."""
    docs = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column "
                                     f"{exc.colno}): {line[:60]!r}{'…' if len(line) > 60 else ''}"
                                     ) from None
                if isinstance(obj.get("tokens"), list):
                    docs.append([str(t) for t in obj["tokens"]])
                elif isinstance(obj.get("text"), str):
                    docs.append(tokenizer.tokenize(obj["text"]))
                else:
                    raise ValueError(f"{path}:{lineno}: a JSON document needs a 'text' string or "
                                     "a 'tokens' list")
            else:
                docs.append(tokenizer.tokenize(line))
    return docs
