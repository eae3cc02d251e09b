"""Logs: one JSON object per line for the log pipeline, or a readable line for people,
with credentials removed before anything is written.

Context goes in through ``extra`` and becomes top-level JSON fields, so a log query can
filter by task or cluster without parsing the message::

    log.info("node pool ready", extra={"task_id": t, "cluster": c, "pool": p})

Redaction runs in the formatters themselves (and is also available as a filter), so a
credential in a message, an argument, an ``extra`` value or a traceback never reaches
the stream whichever way the record arrived.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

import re
import sys
from collections.abc import Callable
from typing import Any, TextIO

JSON, TEXT = "json", "text"
LOG_FORMATS = (JSON, TEXT)

#: ``extra`` keys promoted to top-level fields, in the order they are written.
CONTEXT_FIELDS = (
    "task_id", "cluster", "pool", "job", "event_type", "seq", "stream_id", "api",
    "method", "code", "attempt", "controller", "role",
)

REDACTED = "***"

_SECRET_WORDS = (
    r"access_token|refresh_token|id_token|token|password|passwd|pwd|secret|client_secret"
    r"|api_key|apikey|private_key|credentials?|x-goog-signature|signature|sig"
)

#: (pattern, replacement) pairs applied in order; immutable by construction.
_REDACTIONS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # PEM private keys (a service-account JSON key pasted into a message).
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
                re.DOTALL), "[private key " + REDACTED + "]"),
    # user:password@ in any URL: database URLs, proxies, basic auth in links. The password
    # runs to the last '@' before the host, so an unencoded '@' in it is covered too.
    (re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/?#\s@]*):[^\s/?#]*@"),
     r"\g<head>:" + REDACTED + "@"),
    # Authorization / Proxy-Authorization headers in any quoting: "Bearer x", "Basic x".
    (re.compile(r"(?i)(\b(?:proxy-)?authorization\b['\"]?\s*[:=]\s*['\"]?)"
                r"(?:(bearer|basic|token|negotiate)\s+)?[^\s'\",;}]+"),
     lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + REDACTED),
    # A bare bearer token anywhere else.
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]+=*"), r"\1 " + REDACTED),
    # key=value in query strings, form bodies and messages: token=..., password=...
    (re.compile(rf"(?i)\b({_SECRET_WORDS})=[^&\s'\",;]+"), r"\1=" + REDACTED),
    # "password": "...", 'token': '...' in reprs of dicts and JSON.
    (re.compile(rf"(?i)(['\"](?:{_SECRET_WORDS})['\"]\s*:\s*['\"])[^'\"]*(['\"])"),
     r"\1" + REDACTED + r"\2"),
    # Google OAuth2 access tokens and JWTs (ID tokens, signed service-account assertions).
    (re.compile(r"\bya29\.[A-Za-z0-9_\-.]+"), "ya29." + REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+"), "[jwt " + REDACTED + "]"),
)

#: The "  " between the fixed part of a text line and its context.
_TEXT_CONTEXT_SEPARATOR = "  "


def redact(text: str) -> str:
    """Remove credentials from free text (URLs, headers, key=value, dict reprs, tokens)."""
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return redact(str(value))


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {
        name: _redact_value(getattr(record, name))
        for name in CONTEXT_FIELDS
        if getattr(record, name, None) is not None
    }


def _timestamp(record: logging.LogRecord) -> str:
    moment = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the context fields
    given in ``extra``, then ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        entry.update(_context(record))
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``2026-11-01 09:00:00.123 INFO falcon_es.engine.runtime: message  task_id=... cluster=...``"""

    def format(self, record: logging.LogRecord) -> str:
        moment = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        line = (f"{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond // 1000:03d} "
                f"{record.levelname} {record.name}: {redact(record.getMessage())}")
        context = _context(record)
        if context:
            line += _TEXT_CONTEXT_SEPARATOR + " ".join(f"{k}={v}" for k, v in context.items())
        if record.exc_info:
            line += "\n" + redact(self.formatException(record.exc_info))
        if record.stack_info:
            line += "\n" + redact(self.formatStack(record.stack_info))
        return line


class RedactingFilter(logging.Filter):
    """For handlers that use another formatter: rewrites the record's message, arguments
    and context fields without credentials (the record is shared by every handler, so
    redacting it once protects them all)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            # Arguments that do not fit the format: leave the record to the handler,
            # whose formatter reports it (and redacts what it prints).
            return True
        record.msg = redact(message)
        record.args = None
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if isinstance(value, str):
                setattr(record, name, redact(value))
        return True


class LogFormatError(ValueError):
    """FALCON_LOG_FORMAT or --log-format names no known format."""


def make_formatter(log_format: str) -> logging.Formatter:
    if log_format == JSON:
        return JsonFormatter()
    if log_format == TEXT:
        return TextFormatter()
    raise LogFormatError(f"log format {log_format!r}: expected one of {', '.join(LOG_FORMATS)}")


def configure_logging(
    log_format: str = TEXT,
    level: str = "INFO",
    *,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send every log record to ``stream`` (stderr) in the chosen format (the CLI passes
    the observability settings', ``--log-format`` applied). Replaces a handler installed
    by an earlier call, so the CLI can call it once per command. Returns the handler.
    """
    chosen_format = log_format.lower()
    chosen_level = level.upper()
    if not isinstance(logging.getLevelName(chosen_level), int):
        raise LogFormatError(f"log level {chosen_level!r}: expected DEBUG, INFO, WARNING or ERROR")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(make_formatter(chosen_format))
    handler.addFilter(RedactingFilter())
    handler.set_name("falcon-es")
    root = logging.getLogger()
    for existing in [h for h in root.handlers if h.get_name() == "falcon-es"]:
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(chosen_level)
    return handler
