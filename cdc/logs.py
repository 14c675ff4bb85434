"""Structured logs: JSON lines when stderr is not a terminal (containers, log
shippers), readable key=value lines on a terminal. Fields passed with
``extra={...}`` become keys. Secrets never reach a log line: DSNs and URLs are
never logged, and ``publishers.redaction.redact`` strips from every message,
field and traceback the secrets the process knows (its config's, remembered by
the command line), whole or in pieces, and anything that looks like a password.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
from typing import Any, TextIO

import orjson

from publishers.redaction import redact

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's ``extra`` fields, their text redacted (an error's message may quote a secret)."""
    return {
        k: redact(v) if isinstance(v, str) else v
        for k, v in record.__dict__.items()
        if k not in _STANDARD and not k.startswith("_")
    }


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
        line = f"{when} {record.levelname:<7} {record.getMessage()}" + (f"  {extras}" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
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
    scheduler = logging.getLogger("apscheduler.scheduler")
    if not any(isinstance(f, _LateJobFilter) for f in scheduler.filters):
        scheduler.addFilter(_LateJobFilter())


class _LateJobFilter(logging.Filter):
    """Drops apscheduler's "skipped: maximum number of running instances": a
    periodic job (the shape watch, say) still running when its next time
    comes, behind a long read of the same source session, is late, not
    broken; the warning repeated every interval for as long as the read ran."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances" not in str(record.msg)


class RedactedStream:
    """A text stream that passes on whole lines, each redacted: the last guard
    of everything the command line prints, whoever prints it (a command's
    output, click, rich, a warning, a traceback). A line is held until its
    end is written (a secret may arrive in two writes) or the stream is flushed."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # click probes with b"" for a binary stream
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._pending += text
            done, newline, self._pending = self._pending.rpartition("\n")
            if newline:
                self.stream.write(redact(done + newline))
        return len(text)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, ""
            if pending:
                self.stream.write(redact(pending))
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, errors...
        return getattr(self.stream, name)


def redact_output(stdout: bool = True) -> None:
    """Route ``sys.stderr`` (and ``sys.stdout`` unless it carries data, e.g.
    ``cdc subscribe``'s messages, which must stay exact) through ``RedactedStream``."""
    if not isinstance(sys.stderr, RedactedStream):
        sys.stderr = RedactedStream(sys.stderr)
    if stdout and not isinstance(sys.stdout, RedactedStream):
        sys.stdout = RedactedStream(sys.stdout)
