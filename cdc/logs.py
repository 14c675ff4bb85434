"""Structured logs: JSON lines when stderr is not a terminal (containers, log
shippers), readable key=value lines on a terminal. Fields passed with
``extra={...}`` become keys. Secrets never reach a log line: DSNs and URLs are
never logged, and ``publishers.redaction.mask_passwords`` strips passwords from
anything that might hold one.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from typing import Any

import orjson

from publishers.redaction import mask_passwords

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": mask_passwords(record.getMessage()),
            **_fields(record),
        }
        if record.exc_info:
            entry["exc"] = mask_passwords(self.formatException(record.exc_info))
        return orjson.dumps(entry, default=lambda v: mask_passwords(str(v))).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{when} {record.levelname:<7} {mask_passwords(record.getMessage())}" + (
            f"  {extras}" if extras else ""
        )
        if record.exc_info:
            line += "\n" + mask_passwords(self.formatException(record.exc_info))
        return mask_passwords(line)


def setup_logging(level: str = "INFO", json_logs: bool | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    use_json = (not sys.stderr.isatty()) if json_logs is None else json_logs
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("apscheduler", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
