"""The config file and the environment, read into a validated ``Config``.

Every key can be overridden from the environment as ``PGSUB_<PATH>``: ``PGSUB_WAREHOUSE``,
``PGSUB_SPARK_MASTER``, ``PGSUB_SUBSCRIPTIONS_0_CONNECTION`` (by position) or
``PGSUB_SUBSCRIPTIONS_SUB1_CONNECTION`` (by name); values are read as YAML (``true``,
``5``, ``[a, b]``). What is wrong is a ``ConfigError`` naming the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from subscriber.runtime.config import Config, ConfigError, SubscriptionConfig

ENV_PREFIX = "PGSUB_"
# pgsub's environment variables that are not config keys.
_NOT_CONFIG = re.compile(r"^PGSUB_(DSN|JARS_DIR|CONFIG|FAILPOINTS|TEST_.*|PG\d+_BIN)$")


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    return dict(model.model_fields)


def _apply_override(
    data: dict[str, Any], tokens: list[str], value: Any, model: type[BaseModel], env: str
) -> None:
    """Set ``value`` at the path ``tokens`` (lower-case words) of ``data``."""
    fields = _fields(model)
    for size in range(len(tokens), 0, -1):
        name = "_".join(tokens[:size])
        if name not in fields:
            continue
        rest = tokens[size:]
        if not rest:
            data[name] = value
            return
        annotation = fields[name].annotation
        if name == "subscriptions":
            items = data.setdefault(name, [])
            _apply_to_item(items, rest, value, env)
            return
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            child = data.setdefault(name, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{env}: {name} is not a section")
            _apply_override(child, rest, value, annotation, env)
            return
    raise ConfigError(f"{env} names no config key")


def _apply_to_item(items: list[Any], tokens: list[str], value: Any, env: str) -> None:
    selector, rest = tokens[0], tokens[1:]
    if not rest:
        raise ConfigError(f"{env}: name a key of the subscription, e.g. {env}_CONNECTION")
    if selector.isdigit() and int(selector) < len(items):
        item = items[int(selector)]
    else:
        matches = [
            i for i in items if isinstance(i, dict) and str(i.get("name", "")).lower() == selector
        ]
        if not matches:
            raise ConfigError(f"{env}: no subscription {selector!r} (by position or name)")
        item = matches[0]
    _apply_override(item, rest, value, SubscriptionConfig, env)


def apply_environment(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    for key in sorted(environ):
        if not key.startswith(ENV_PREFIX) or _NOT_CONFIG.match(key):
            continue
        tokens = key[len(ENV_PREFIX) :].lower().split("_")
        _apply_override(data, tokens, yaml.safe_load(environ[key]), Config, key)
    return data


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def load(path: Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read, override from the environment and validate; ConfigError names what is wrong."""
    environ = os.environ if environ is None else environ
    data: Any = {}
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read the config file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys")
    data = apply_environment(data, environ)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        source = str(path) if path is not None else "the configuration"
        raise ConfigError(f"{source} is not valid:\n{_describe(exc)}") from None
    config.reach_warehouse()
    return config
