"""Console logging for the agent, with every known secret scrubbed from every line.

Secrets are registered once (``settings`` does it when it reads them); ``redact`` is then
applied to log records, the training child's output and every text file before upload.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator

REDACTED = "***"
# Shorter values would scrub ordinary words; real tokens and API keys are far longer.
_MIN_SECRET_LENGTH = 8

_secrets: set[str] = set()
_secrets_lock = threading.Lock()

logger = logging.getLogger("trainbox")


def register_secret(value: str | None) -> None:
    if value and len(value) >= _MIN_SECRET_LENGTH:
        with _secrets_lock:
            _secrets.add(value)


def redact(text: str) -> str:
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_bytes(data: bytes) -> bytes:
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        raw = secret.encode()
        if raw in data:
            data = data.replace(raw, REDACTED.encode())
    return data


def contains_secret(data: bytes) -> bool:
    with _secrets_lock:
        return any(secret.encode() in data for secret in _secrets)


def longest_secret() -> int:
    with _secrets_lock:
        return max((len(secret.encode()) for secret in _secrets), default=0)


class _RedactingFormatter(logging.Formatter):
    def __init__(self, json_lines: bool) -> None:
        super().__init__()
        self.json_lines = json_lines

    def format(self, record: logging.LogRecord) -> str:
        message = redact(record.getMessage())
        if record.exc_info:
            message += "\n" + redact(self.formatException(record.exc_info))
        if self.json_lines:
            return json.dumps({"time": round(record.created, 3), "level": record.levelname.lower(), "message": message})
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        level = "" if record.levelno == logging.INFO else f"{record.levelname}: "
        return f"trainbox {stamp} {level}{message}"


def setup(json_lines: bool = False, verbose: bool = False) -> None:
    """Send the agent's log to stderr (stdout carries the training output and ``--json`` data)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter(json_lines))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Log one line when a step ends, with its duration."""
    started = time.monotonic()
    yield
    logger.info("%s (%.1f s)", what, time.monotonic() - started)
