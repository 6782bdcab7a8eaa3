"""Configuration shared by the sketcher and release services.

One frozen, validated object (:class:`ServiceConfig`, :mod:`streamdp.services.service_config`);
:func:`from_mapping` builds it from a JSON/TOML mapping or CLI flags, then ``STREAMDP_<FIELD>``
environment overrides, and fails at start-up with a message that names the field and says what
to fix. This module re-exports ``ServiceConfig``, ``ConfigError`` and the start-up checks.
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from streamdp.errors import ConfigError
from streamdp.services.service_config import ServiceConfig, _closest  # noqa: F401 (re-exported)
# the deployment's start-up checks, for callers (and tests) that import them from here
from streamdp.services.start_checks import check_privacy_mode, check_stream_start  # noqa: F401

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["from_mapping", "NON_FIELD_VARIABLES", "load_file", "RELATIVE_TO_CONFIG_FILE",
           "from_file", "ConfigError", "ServiceConfig", "check_privacy_mode", "check_stream_start"]


def from_mapping(values: dict, *, env: dict | None = None) -> ServiceConfig:
    """Build a config from a mapping, then ``STREAMDP_<FIELD>`` environment overrides."""
    names = {f.name: f for f in dataclasses.fields(ServiceConfig)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError("unknown configuration field(s): " + "; ".join(
            f"{key!r}{_closest(str(key), names)}" for key in unknown)
            + " (docs/configuration.md lists every field)")
    merged = dict(values)
    env = os.environ if env is None else env
    unknown_env = sorted(v for v, raw in env.items() if _unknown_variable(v, raw, names))
    if unknown_env:
        raise ConfigError("unknown environment variable(s): " + "; ".join(
            v + _closest(v[len("STREAMDP_"):].lower(), names, "STREAMDP_{}", str.upper)
            for v in unknown_env)
            + " (a configuration field is STREAMDP_<FIELD>, the field name in upper case; "
              "docs/configuration.md lists every field): correct or unset it")
    for name, f in names.items():
        raw = env.get(f"STREAMDP_{name.upper()}")
        if raw is None:
            continue
        if not raw.strip():
            raise ConfigError(
                f"environment STREAMDP_{name.upper()} is set but blank: unset it to keep the "
                f"configuration file's {name!r}, or give it a value"
                + (" (a number > 0; a non-private deployment sets STREAMDP_NON_PRIVATE=true and "
                   "STREAMDP_EPSILON=null)" if name == "epsilon" else ""))
        try:
            merged[name] = _parse_env(raw, f.type)
        except ValueError as exc:
            raise ConfigError(f"environment STREAMDP_{name.upper()}={raw!r}: {exc}") from exc
    for name, v in merged.items():
        if isinstance(v, str) and not v.strip() and not str(names[name].type).startswith(("str", "Literal")):
            raise ConfigError(f"configuration field {name!r} is blank: give it a value or remove it"
                              + (" (epsilon: a number > 0; a non-private deployment says "
                                 "non_private: true and epsilon: null)" if name == "epsilon" else ""))
    if merged.get("non_private") is True and "epsilon" not in merged:
        merged["epsilon"] = None        # non_private: true alone means what it says
    return ServiceConfig(**merged)


#: STREAMDP_* variables that are not configuration fields: the progress switch
#: (streamdp/progress.py), the image's user id (services/Dockerfile) and the test harness's.
NON_FIELD_VARIABLES = frozenset({
    "STREAMDP_NO_PROGRESS", "STREAMDP_UID", "STREAMDP_TANSU_BIN", "STREAMDP_CHROMIUM",
    "STREAMDP_TEST_ARTIFACTS", "STREAMDP_REQUIRE_BROWSER"})
#: Kubernetes injects <SERVICE>_SERVICE_HOST, <SERVICE>_PORT=tcp://..., <SERVICE>_PORT_9400_TCP...
#: for every Service of the namespace (the deployment's are named streamdp-*): never a field.
_SERVICE_LINK = re.compile(r"_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)_"
                           r"(PROTO|PORT|ADDR))$")
_SERVICE_LINK_URL = re.compile(r"_PORT(_\d+_(TCP|UDP|SCTP))?$")   # their value: tcp://ip:port


def _unknown_variable(name: str, value: str, fields) -> bool:
    """An environment variable that looks meant for streamdp but names no field: a typo such
    as STREAMDP_EPSLION would otherwise be ignored and the file's value used instead."""
    if not name.startswith("STREAMDP_") or name in NON_FIELD_VARIABLES:
        return False
    field_name = name[len("STREAMDP_"):].lower()
    if field_name in fields and name == f"STREAMDP_{field_name.upper()}":
        return False
    if _SERVICE_LINK.search(name) or (_SERVICE_LINK_URL.search(name)
                                      and re.match(r"(tcp|udp|sctp)://", str(value))):
        return False
    return True


def load_file(path: str | os.PathLike) -> dict:
    """Read a configuration file into a plain mapping (JSON, or TOML by its ``.toml`` suffix).

    JSON: one object, ``null`` for "not set" (e.g. ``"epsilon": null`` = non-private).
    A relative ``vocabulary`` path is resolved against the file's folder.
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
    # A file path written in a configuration file is the author's path next to that file,
    # wherever the service is started from (flags and STREAMDP_* variables keep the working
    # directory: the person typing them means their own).
    for name in RELATIVE_TO_CONFIG_FILE:
        v = values.get(name)
        if isinstance(v, str) and v.strip():
            v = os.path.expanduser(v)
            values[name] = v if os.path.isabs(v) else str(path.resolve().parent / v)
    return values


#: Fields whose relative paths in a configuration file resolve against the file's folder.
RELATIVE_TO_CONFIG_FILE = ("vocabulary",)


def from_file(path: str | os.PathLike, overrides: dict | None = None, *,
              env: dict | None = None) -> ServiceConfig:
    """:func:`load_file`, then ``overrides`` (e.g. CLI flags), then ``STREAMDP_<FIELD>`` variables."""
    values = load_file(path)
    values.update(overrides or {})
    return from_mapping(values, env=env)


def _parse_env(raw: str, typ):
    import json
    t = str(typ)
    if raw.strip().lower() in ("null", "none") and "None" in t:
        return None
    if t.startswith("bool"):
        low = raw.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ValueError("must be true or false")
    if t.startswith("int"):
        return int(raw)
    if t.startswith("float"):
        return float(raw)
    if t.startswith("dict"):
        return json.loads(raw)
    return raw
