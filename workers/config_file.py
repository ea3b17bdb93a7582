"""``pagoda.yaml``: the engine and serving settings of a deployment, from ``$PAGODA_CONFIG``.

    engine:                      # engine/config.py's SETTINGS, checked with its schema
      max_model_len: 4096        # context length
      gpu_memory_utilization: 0.85   # KV budget as a fraction of GPU memory (or kv_cache_memory: bytes)
      max_num_seqs: 64           # batch limits
      max_num_batched_tokens: 2048
      quantization: int4
      enable_prefix_caching: true    # cache policy
    serving:                     # the web processes' queue bounds and the workers' drain
      max_queued_per_model: 256
      max_requests_in_flight: 64   # per web process (unset: the serving workers' max_num_seqs, summed)
      queue_timeout_s: 30
      request_timeout_s: 600
      drain_timeout_s: 30

Precedence, lowest first: the engine's defaults, the file, a model version's own settings (the
console's), then the environment: ``PAGODA_ENGINE_<SETTING>`` (a YAML value, e.g.
``PAGODA_ENGINE_MAX_NUM_SEQS=32``) for an engine setting, the ``PAGODA_*`` variables in
``SERVING_ENV`` for a serving one. An unknown key or a bad value is a ``ConfigError`` naming the
key and the file (or the variable). Imports no torch: the web process reads it too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from engine.config import SETTINGS_BY_NAME
from engine.errors import InvalidParameterError

ENV_PREFIX = "PAGODA_ENGINE_"
# serving key -> (environment variable, type, default); None means unset.
SERVING_ENV = {
    "max_queued_per_model": ("PAGODA_MAX_QUEUED_PER_MODEL", int, None),
    "max_requests_in_flight": ("PAGODA_MAX_REQUESTS_IN_FLIGHT", int, None),
    "queue_timeout_s": ("PAGODA_QUEUE_TIMEOUT_S", float, 30.0),
    "request_timeout_s": ("PAGODA_REQUEST_TIMEOUT_S", float, 600.0),
    "drain_timeout_s": ("PAGODA_DRAIN_TIMEOUT", float, 30.0),
}
# serving keys whose value may not go below this (else 0 and up); None stays unset
SERVING_MINIMUM = {"max_requests_in_flight": 1}  # 0 places would refuse every generation request
SECTIONS = ("engine", "serving")


class ConfigError(InvalidParameterError):
    """A pagoda.yaml (or environment) setting that cannot be used: ``param`` names the file and
    key (``/etc/pagoda.yaml: engine.max_num_seqs``) or the variable. An InvalidParameterError, so
    a worker refuses it as it refuses any bad engine setting (exit status 2)."""


@dataclass(frozen=True)
class PagodaConfig:
    path: str | None  # the file read, if any
    engine: dict = field(default_factory=dict)  # engine settings from the file and environment
    serving: dict = field(default_factory=dict)  # every serving key, defaults filled in
    sources: dict = field(default_factory=dict)  # key -> the file path or the variable it came from
    env_engine: frozenset = frozenset()  # engine keys the environment set (these beat a version's)

    def engine_settings(self, version_settings: Mapping | None = None) -> dict:
        """The settings an engine for a version gets: file < the version's own < environment."""
        merged = {k: v for k, v in self.engine.items() if k not in self.env_engine}
        merged.update(version_settings or {})
        merged.update({k: self.engine[k] for k in self.env_engine})
        return dict(sorted(merged.items()))

    def describe(self, version_settings: Mapping | None = None) -> str:
        """One log line: each effective non-default value and where it came from."""
        settings = self.engine_settings(version_settings)
        parts = [f"{k}={v!r} ({self.source(k, version_settings)})" for k, v in settings.items()]
        return "; ".join(parts) or "engine defaults"

    def source(self, key: str, version_settings: Mapping | None = None) -> str:
        if key in self.env_engine:
            return self.sources[key]
        if version_settings and key in version_settings:
            return "the version's settings"
        return self.sources.get(key, "default")


def load_config(environ: Mapping[str, str] | None = None) -> PagodaConfig:
    """Read ``$PAGODA_CONFIG`` (if set) and the environment's overrides; ConfigError when bad."""
    environ = os.environ if environ is None else environ
    path = environ.get("PAGODA_CONFIG") or None
    data = _read(path) if path else {}
    engine, sources = {}, {}
    for key, value in (data.get("engine") or {}).items():
        _check_engine(key, value, f"{path}: engine.{key}")
        engine[key], sources[key] = value, path
    env_engine = set()
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):].lower()
        value = _yaml_value(raw, name)
        _check_engine(key, value, name)
        engine[key], sources[key] = value, name
        env_engine.add(key)
    serving = {}
    file_serving = data.get("serving") or {}
    for key in file_serving:
        if key not in SERVING_ENV:
            raise ConfigError(f"{path}: serving.{key}", f"unknown serving setting; known: {', '.join(SERVING_ENV)}")
    for key, (variable, kind, default) in SERVING_ENV.items():
        where, value = "default", default
        if key in file_serving:
            where, value = f"{path}: serving.{key}", file_serving[key]
        if environ.get(variable):
            where, value = variable, _yaml_value(environ[variable], variable)
        serving[key] = _check_serving(value, kind, where, SERVING_MINIMUM.get(key, 0))
        sources[key] = where.split(": ")[0] if where != "default" else "default"
    return PagodaConfig(path, engine, serving, sources, frozenset(env_engine))


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError("PAGODA_CONFIG", f"cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(path, f"not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a mapping with the sections {', '.join(SECTIONS)}")
    for key, value in data.items():
        if key not in SECTIONS:
            raise ConfigError(f"{path}: {key}", f"unknown key; known sections: {', '.join(SECTIONS)}")
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{path}: {key}", "must be a mapping of settings")
    return data


def _yaml_value(raw: str, where: str):
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _check_engine(key: str, value, where: str) -> None:
    setting = SETTINGS_BY_NAME.get(key)
    if setting is None:
        raise ConfigError(where, f"unknown engine setting; known: {', '.join(SETTINGS_BY_NAME)}")
    try:
        setting.check(value)
    except InvalidParameterError as exc:
        raise ConfigError(where, exc.message) from exc


def _check_serving(value, kind: type, where: str, minimum: int = 0):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or (
            kind is int and not isinstance(value, int)):
        raise ConfigError(where, f"must be {'an integer' if kind is int else 'a number'} >= {minimum}, got {value!r}")
    return kind(value)
