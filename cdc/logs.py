"""Structured logs: JSON lines when stderr is not a terminal (containers, log
shippers), readable key=value lines on a terminal. Fields passed with
``extra={...}`` become keys. Secrets never reach a log line: DSNs and URLs are
never logged, and ``redact`` strips passwords from anything that might hold one.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import sys
from typing import Any

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_SECRET = re.compile(r"(?i)(://[^:/@\s]*:)[^@\s]+(@)|((?:pwd|password)\s*=\s*)[^;\s]+")


def redact(text: str) -> str:
    """Remove passwords from URLs (``user:pass@``) and ODBC/libpq strings (``PWD=``)."""
    return _SECRET.sub(lambda m: f"{m.group(1)}***{m.group(2)}" if m.group(1) else f"{m.group(3)}***", text)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
            **_fields(record),
        }
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(entry, default=lambda v: redact(str(v))).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{when} {record.levelname:<7} {redact(record.getMessage())}" + (
            f"  {extras}" if extras else ""
        )
        if record.exc_info:
            line += "\n" + redact(self.formatException(record.exc_info))
        return redact(line)


def setup_logging(level: str = "INFO", json_logs: bool | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    use_json = (not sys.stderr.isatty()) if json_logs is None else json_logs
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("apscheduler", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
