"""Structured logs: step context on every line, optional JSON lines, secrets redacted.

- `log_context(turn_id=…, step=…, attempt=…)` (a contextvar) is set around a step delivery; `ContextFilter`
  copies it onto every record logged inside it, whichever logger logs it (tools included: the dispatcher
  runs them in a copy of the caller's context).
- `RedactFilter` masks the values of known secret environment variables and bearer / API-key / URL-password
  patterns in the message and the traceback, before any formatter sees the record.
- `STEPQ_LOG_JSON=true` switches the handlers to `JsonFormatter`: one JSON object per line.

Workers install this on Celery's handlers (workers/signals.py); the CLI calls `configure_logging`.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from stepq.config.settings import Settings

CONTEXT_FIELDS = ("turn_id", "step", "attempt")
SECRET_ENV_VARS = (
    "STEPQ_APPROVAL_SECRET",
    "STEPQ_APPROVAL_OLD_SECRETS",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_BEARER_TOKEN_BEDROCK",
    "OPENAI_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "AZURE_OPENAI_AD_TOKEN",
    "STEPQ_OPENAI_COMPATIBLE_API_KEY",
)
URL_ENV_VARS = ("STEPQ_REDIS_URL", "STEPQ_BROKER_URL")  # their passwords are secrets too
MASK = "***"
MIN_SECRET_LEN = 6  # shorter values would mask ordinary words

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("stepq_log_context", default=None)


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Attach `fields` (turn_id, step, attempt) to every record logged inside the block."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Update the fields of the enclosing `log_context` (a no-op outside one, so nothing leaks)."""
    current = _context.get()
    if current is not None:
        _context.set({**current, **fields})


def current_context() -> dict[str, Any]:
    return dict(_context.get() or {})


class ContextFilter(logging.Filter):
    """Sets `turn_id`, `step`, `attempt` on each record (None outside a step) so formats can use them."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _context.get() or {}
        for name in CONTEXT_FIELDS:
            if getattr(record, name, None) is None:
                setattr(record, name, ctx.get(name))
        return True


# --------------------------------------------------------------------------- redaction

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9\-._~+/]+=*"), rf"\g<1>{MASK}"),
    (
        re.compile(
            r"(?i)\b(x-api-key|x-goog-api-key|api[_-]?key|access[_-]?token|secret[_-]?access[_-]?key|session[_-]?token"
            r"|approval[_-]?secret|password)(\"?'?\s*[:=]\s*\"?'?)([^\s\"',;&}]+)"
        ),
        rf"\g<1>\g<2>{MASK}",
    ),
    (re.compile(r"(?i)([?&]key=)[^&\s\"']+"), rf"\g<1>{MASK}"),  # Google's ?key=… query parameter
    (re.compile(r"(?i)\b(Signature=)[0-9a-f]{16,}"), rf"\g<1>{MASK}"),  # AWS SigV4
    (re.compile(r"(://[^:/@\s]*:)([^@/\s]+)(@)"), rf"\g<1>{MASK}\g<3>"),  # scheme://user:password@host
]


def secret_values(settings: Settings | None = None, environ: dict[str, str] | None = None) -> list[str]:
    """Values that must never appear in a log line: secret env vars, URL passwords, the settings' secrets."""
    env = os.environ if environ is None else environ
    found: set[str] = set()
    for name in SECRET_ENV_VARS:
        for part in env.get(name, "").split(","):
            found.add(part.strip())
    urls = [env.get(name, "") for name in URL_ENV_VARS]
    if settings is not None:
        if settings.approval_secret is not None:
            found.add(settings.approval_secret.get_secret_value())
        found.update(s.get_secret_value() for s in settings.approval_old_secrets)
        found.update(settings.credential_keks)
        urls += [settings.redis_url or "", settings.broker_url or ""]
    for url in urls:
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            found.add(password)
    return sorted((v for v in found if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)


# each pattern above needs one of these words (in any case): a line with none of them (most lines) skips the
# five substitutions, a quarter of a worker's cost per log line
_TRIGGERS = ("bearer", "key", "token", "secret", "password", "signature", "://")


class Redactor:
    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = [s for s in secrets if s]

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        lowered = text.lower()
        if not any(word in lowered for word in _TRIGGERS):
            return text
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
        return text


def describe_exception(exc: BaseException, redact: Redactor, limit: int) -> str:
    """An exception as a user reads it: its type and its message on one line, bounded, secrets masked
    (masked before it is cut: no half secret survives). An exception whose `__str__` raises is named by
    its type alone: describing a failure must not fail."""
    try:
        message = str(exc)
    except Exception:
        message = ""
    text = redact(" ".join(message.split()))
    if len(text) > limit:
        text = text[:limit] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class RedactFilter(logging.Filter):
    """Masks secrets in the message, its traceback and stack info (the record is rewritten in place)."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redact = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it later; nothing to mask
            return True
        record.msg, record.args = self.redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


# --------------------------------------------------------------------------- formatters


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, process, thread, step context, exception."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redact = redactor or Redactor(())

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for name in (*CONTEXT_FIELDS, "task_name", "task_id"):
            value = getattr(record, name, None)
            if value is not None and value != "???":  # Celery's TaskFormatter placeholder outside a task
                payload[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exc_info"] = record.exc_text
        if record.stack_info:
            payload["stack_info"] = record.stack_info
        return self.redact(json.dumps(payload, ensure_ascii=False, default=str))


class ContextTextFormatter(logging.Formatter):
    """Wraps a text formatter (Celery's, say): appends `[turn=… step=… attempt=…]` inside a step, redacts."""

    def __init__(self, inner: logging.Formatter | None, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.redact = redactor or Redactor(())

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        turn_id = getattr(record, "turn_id", None)
        if turn_id is not None:
            text += f" [turn={turn_id} step={getattr(record, 'step', None)} attempt={getattr(record, 'attempt', None)}]"
        return self.redact(text)


# --------------------------------------------------------------------------- installation


def install(handler: logging.Handler, redactor: Redactor, json_lines: bool) -> None:
    """Add the context and redaction filters to `handler` and set its formatter (idempotent)."""
    for existing in list(handler.filters):
        if isinstance(existing, ContextFilter | RedactFilter):
            handler.removeFilter(existing)
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactFilter(redactor))
    current = handler.formatter
    if isinstance(current, ContextTextFormatter):
        current = current.inner
    elif isinstance(current, JsonFormatter):
        current = None
    handler.setFormatter(JsonFormatter(redactor) if json_lines else ContextTextFormatter(current, redactor))


def install_on_logger(logger: logging.Logger, settings: Settings) -> None:
    """Install on every handler of `logger` (Celery's root and task loggers after it set them up)."""
    redactor = Redactor(secret_values(settings))
    for handler in logger.handlers:
        install(handler, redactor, settings.log_json)


def configure_logging(settings: Settings, level: int | str | None = None) -> None:
    """For processes Celery does not set up (the CLI): a stderr handler on the root logger if it has none."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    if level is not None:
        root.setLevel(level)
    install_on_logger(root, settings)


def redact_url(url: str) -> str:
    """A URL with its password masked, for error messages (a Redis or broker URL may carry one)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:{MASK}@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
