"""Configuration from the environment (and CLI flags that override it)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from falcon_es.db import DEFAULT_URL

LANGUAGES = ("en", "zh")


class SettingsError(ValueError):
    """An environment variable holds a value Falcon-ES cannot use."""


def database_url(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("FALCON_DB_URL") or DEFAULT_URL


@dataclasses.dataclass(frozen=True)
class Settings:
    db_url: str = DEFAULT_URL
    language: str = "en"
    default_timeout_seconds: int = 24 * 3600
    max_timeout_seconds: int = 7 * 24 * 3600
    controller_id: str = "falcon-controller"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        language = env.get("FALCON_LANG", "en").split("_")[0].lower() or "en"
        if language not in LANGUAGES:
            raise SettingsError(
                f"FALCON_LANG={env['FALCON_LANG']!r}: expected one of {', '.join(LANGUAGES)}"
            )
        return cls(
            db_url=database_url(env),
            language=language,
            default_timeout_seconds=_int(env, "FALCON_DEFAULT_TIMEOUT", cls.default_timeout_seconds),
            max_timeout_seconds=_int(env, "FALCON_MAX_TIMEOUT", cls.max_timeout_seconds),
            controller_id=env.get("FALCON_CONTROLLER_ID") or env.get("HOSTNAME")
            or cls.controller_id,
        )


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a whole number of seconds") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r}: must be positive")
    return value
