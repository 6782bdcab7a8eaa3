"""Configuration shared by the sketcher and release services.

One frozen, validated object; :func:`from_mapping` builds it from a JSON/TOML
mapping or CLI flags and fails at start-up with a message that names the field
and says what to fix.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from streamdp.kafka.topics import TopicNames
from streamdp.moments.clipping import WARMUP_NORMALISING_CLIP, ClipBounds
from streamdp.privacy.epochs import EpochClock
from streamdp.services.partition_state import Routing


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which and how to fix it."""


@dataclass(frozen=True)
class ServiceConfig:
    """Everything a streamdp deployment must agree on (sketchers and release service).

    Model (public): vocabulary, n_topics, alpha0, oversampling, seed.
    Privacy: epsilon (None = non-private), delta, horizon, sampler, ledger.
    Time: stream_start, epoch_seconds, lateness.
    Kafka: bootstrap, topic_prefix, group_id.
    """

    bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = "streamdp"
    group_id: str = "streamdp-sketchers"
    vocabulary: str = ""
    tokenizer: dict = field(default_factory=dict)
    n_topics: int = 10
    alpha0: float = 1.0
    oversampling: int | None = None
    seed: int = 0
    epsilon: float | None = 1.0
    delta: float = 1e-6
    horizon: int = 1024
    sampler: str = "opendp"
    noise_seed: int | None = None
    clip_quantile: float = 0.97
    clip_budget_share: float = 0.05
    stream_start: float = 0.0
    epoch_seconds: float = 3600.0
    lateness: float = 0.0
    ledger: str = "streamdp-ledger.jsonl"
    snapshot_dir: str = "snapshots"
    batch_size: int = 2000
    checkpoint_seconds: float = 5.0
    max_document_bytes: int = 1 << 20
    max_document_tokens: int = 100_000
    max_future_seconds: float = 300.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    poll_seconds: float = 1.0
    liveness_seconds: float = 120.0
    kafka: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        def bad(name, why):
            raise ConfigError(f"configuration field {name!r}: {why}")

        if not self.bootstrap or not isinstance(self.bootstrap, str):
            bad("bootstrap", "set the Kafka bootstrap servers, e.g. 127.0.0.1:9092")
        try:
            TopicNames.from_prefix(self.topic_prefix)
        except ValueError as exc:
            bad("topic_prefix", str(exc))
        if not (isinstance(self.n_topics, int) and self.n_topics >= 1):
            bad("n_topics", f"must be an integer >= 1, got {self.n_topics!r}")
        if not (self.alpha0 > 0 and math.isfinite(self.alpha0)):
            bad("alpha0", f"must be a finite number > 0, got {self.alpha0!r}")
        if self.epsilon is not None and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            bad("epsilon", f"must be > 0 (or null for a non-private deployment), got {self.epsilon!r}")
        if not 0 < self.delta < 1:
            bad("delta", f"must be in (0, 1), got {self.delta!r}")
        if not (isinstance(self.horizon, int) and self.horizon >= 1):
            bad("horizon", f"must be an integer number of epochs >= 1, got {self.horizon!r}")
        if self.sampler not in ("opendp", "fast"):
            bad("sampler", f"must be 'opendp' (vetted, default) or 'fast', got {self.sampler!r}")
        if not 0 < self.clip_quantile <= 1:
            bad("clip_quantile", f"must be in (0, 1], got {self.clip_quantile!r}")
        if not 0 < self.clip_budget_share < 1:
            bad("clip_budget_share", f"must be in (0, 1), got {self.clip_budget_share!r}")
        try:
            EpochClock(float(self.stream_start), float(self.epoch_seconds))
            Routing(EpochClock(float(self.stream_start), float(self.epoch_seconds)), float(self.lateness))
        except (ValueError, TypeError) as exc:
            bad("stream_start/epoch_seconds/lateness", str(exc))
        for name in ("batch_size", "max_document_bytes", "max_document_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                bad(name, f"must be an integer >= 1, got {v!r}")
        if not isinstance(self.kafka, dict) or not all(isinstance(k, str) for k in self.kafka):
            bad("kafka", "must be a mapping of librdkafka client properties, e.g. "
                         '{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}')
        if "bootstrap.servers" in self.kafka or "group.id" in self.kafka:
            bad("kafka", "set bootstrap servers with 'bootstrap' and the group with 'group_id', "
                         "not inside 'kafka'")
        for name in ("checkpoint_seconds", "poll_seconds", "max_future_seconds", "liveness_seconds"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                bad(name, f"must be a number of seconds > 0, got {v!r}")
        if not (isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535):
            bad("metrics_port", f"must be a TCP port 0..65535 (0 = any free port), got {self.metrics_port!r}")

    # ------------------------------------------------------------- derived
    @property
    def private(self) -> bool:
        return self.epsilon is not None

    def client(self, role: str, **overrides) -> dict:
        """confluent-kafka configuration for ``role`` with the deployment's extra ``kafka``
        properties (security: SASL/TLS) applied to every client."""
        from streamdp.kafka.topics import client_config
        return client_config(self.bootstrap, role, **{**self.kafka, **overrides})

    def state_store(self):
        """The deployment's StateStore, its clients configured with the ``kafka`` properties."""
        from confluent_kafka import Producer
        from streamdp.kafka.state_store import StateStore
        producer = Producer(self.client("producer", **{
            "enable.idempotence": True, "acks": "all", "linger.ms": 5}))
        return StateStore(producer, self.bootstrap, self.topics.state,
                          consumer_overrides=dict(self.kafka), owns_producer=True)

    @property
    def topics(self) -> TopicNames:
        return TopicNames.from_prefix(self.topic_prefix)

    @property
    def routing(self) -> Routing:
        return Routing(EpochClock(float(self.stream_start), float(self.epoch_seconds)),
                       float(self.lateness))

    def k_prime(self, d: int) -> int:
        over = self.n_topics if self.oversampling is None else self.oversampling
        k_prime = min(self.n_topics + over, d)
        if k_prime < self.n_topics:
            raise ConfigError(f"n_topics={self.n_topics} exceeds the vocabulary size {d}")
        return k_prime

    @property
    def warmup_clip(self) -> float:
        return WARMUP_NORMALISING_CLIP if self.private else ClipBounds.unclipped().warmup

    def load_vocabulary(self):
        from streamdp.text.vocabulary import Vocabulary
        if not self.vocabulary:
            raise ConfigError("configuration field 'vocabulary': set the path of the public "
                              "vocabulary file (one word per line; see docs/schemas.md)")
        if not Path(self.vocabulary).is_file():
            raise ConfigError(f"configuration field 'vocabulary': no file at {self.vocabulary!r}")
        return Vocabulary.load(self.vocabulary)

    def tokenizer_(self):
        from streamdp.text.tokenizer import Tokenizer
        try:
            return Tokenizer.from_config(self.tokenizer) if self.tokenizer else Tokenizer()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"configuration field 'tokenizer': {exc}") from exc

    def replace(self, **changes) -> "ServiceConfig":
        return dataclasses.replace(self, **changes)


def from_mapping(values: dict, *, env: dict | None = None) -> ServiceConfig:
    """Build a config from a mapping, then ``STREAMDP_<FIELD>`` environment overrides."""
    names = {f.name: f for f in dataclasses.fields(ServiceConfig)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError(f"unknown configuration field(s) {unknown}; valid fields: {sorted(names)}")
    merged = dict(values)
    env = os.environ if env is None else env
    for name, f in names.items():
        raw = env.get(f"STREAMDP_{name.upper()}")
        if raw is None:
            continue
        default = getattr(ServiceConfig, name, None) if not isinstance(f.default_factory, type) else None
        try:
            merged[name] = _parse_env(raw, f.type, default)
        except ValueError as exc:
            raise ConfigError(f"environment STREAMDP_{name.upper()}={raw!r}: {exc}") from exc
    try:
        return ServiceConfig(**merged)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


def load_file(path: str | os.PathLike) -> dict:
    """Read a configuration file into a plain mapping (JSON, or TOML by its ``.toml`` suffix).

    JSON: one object, ``null`` for "not set" (e.g. ``"epsilon": null`` = non-private).
    TOML: top-level keys; TOML has no null, so a field that accepts ``None``
    (``epsilon``, ``oversampling``, ``noise_seed``) takes the string ``"none"``
    for it. Errors are :class:`ConfigError` naming the file and the position.
    """
    import json
    import tomllib

    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {str(path)!r}: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".toml":
        try:
            values = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"configuration file {str(path)!r} is not valid TOML: {exc}") from None
        optional = {f.name for f in dataclasses.fields(ServiceConfig) if "None" in str(f.type)}
        for name in optional & set(values):
            if isinstance(values[name], str) and values[name].strip().lower() in ("none", "null"):
                values[name] = None
    else:
        try:
            values = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            hint = " (TOML files need the .toml suffix)" if path.suffix.lower() != ".json" else ""
            raise ConfigError(f"configuration file {str(path)!r} is not valid JSON: {exc}{hint}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"configuration file {str(path)!r} must hold one object/table of fields, "
                          f"got {type(values).__name__}")
    return values


def from_file(path: str | os.PathLike, overrides: dict | None = None, *,
              env: dict | None = None) -> ServiceConfig:
    """:func:`load_file`, then ``overrides`` (e.g. CLI flags), then ``STREAMDP_<FIELD>`` variables."""
    values = load_file(path)
    values.update(overrides or {})
    return from_mapping(values, env=env)


def _parse_env(raw: str, typ, default):
    import json
    t = str(typ)
    if raw.lower() in ("null", "none", "") and "None" in t:
        return None
    if t.startswith("int"):
        return int(raw)
    if t.startswith("float"):
        return float(raw)
    if t.startswith("dict"):
        return json.loads(raw)
    return raw
