"""Where the demo's screen goes.

On a terminal (``Screen``): the alternate screen buffer, redrawn in place
(cursor home, each line followed by clear-to-end-of-line, then clear to the
end of the screen), so the scrollback never grows, and leaving it restores
what was on the terminal before. Keys are read one at a time (cbreak: Ctrl-C
still signals). Logs go to a file meanwhile, as they would draw over the
screen.

Elsewhere (``Lines``: a pipe, a file, CI): plain lines, no escape codes: the
start-up information once, then a summary line per table every few seconds
and each event as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import termios
import time
import tty
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from cdc.demo.screen import footer_lines, render
from cdc.demo.view import View
from cdc.logs import TextFormatter

ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
LEAVE = "\x1b[?25h\x1b[?1049l"  # cursor shown, primary screen back
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
SUMMARY_EVERY = 5.0  # seconds between summary lines when not on a terminal


def say(text: str, stream: TextIO | None = None) -> None:
    """A line of progress; lost, not raised, once the terminal is gone (SIGHUP)."""
    with contextlib.suppress(OSError):
        print(f"[demo] {text}", file=stream or sys.stdout, flush=True)


class Screen:
    """The live screen on a terminal."""

    interactive = True

    def __init__(self, log_path: Path, stream: TextIO = sys.stdout, keys: TextIO = sys.stdin) -> None:
        self.stream, self.keys, self.log_path = stream, keys, log_path
        self._saved_tty: list[Any] | None = None
        self._saved_handlers: list[logging.Handler] = []

    def open(self, on_key: Callable[[str], None]) -> None:
        self._logs_to_file()
        if self.keys.isatty():
            fd = self.keys.fileno()
            self._saved_tty = termios.tcgetattr(fd)
            tty.setcbreak(fd)
            asyncio.get_running_loop().add_reader(fd, lambda: on_key(os.read(fd, 1).decode(errors="replace")))
        self.stream.write(ENTER)
        self.stream.flush()

    def show(self, view: View) -> None:
        columns, rows = shutil.get_terminal_size()
        # One column short of the edge: a line that fills the last column leaves
        # some terminals in a pending wrap, and the next line would start one lower.
        lines = render(view, columns - 1, rows)
        self.stream.write(HOME + "".join(f"{line}{CLEAR_LINE}\r\n" for line in lines[:-1]))
        self.stream.write(f"{lines[-1]}{CLEAR_LINE}{CLEAR_BELOW}" if lines else CLEAR_BELOW)
        self.stream.flush()

    def event(self, text: str) -> None:
        """Events are on the screen (``View.events``)."""

    def close(self) -> None:
        if self._saved_tty is not None:
            fd = self.keys.fileno()
            asyncio.get_running_loop().remove_reader(fd)
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(fd, termios.TCSADRAIN, self._saved_tty)
            self._saved_tty = None
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            self.stream.write(LEAVE)
            self.stream.flush()
        root = logging.getLogger()
        if self._saved_handlers:
            for handler in root.handlers:
                handler.close()
            root.handlers[:] = self._saved_handlers
            self._saved_handlers = []

    def _logs_to_file(self) -> None:
        handler = logging.FileHandler(self.log_path, encoding="utf-8")
        handler.setFormatter(TextFormatter())
        root = logging.getLogger()
        self._saved_handlers = list(root.handlers)
        root.handlers[:] = [handler]


class Lines:
    """Plain lines, for a pipe or a file."""

    interactive = False

    def __init__(self, stream: TextIO = sys.stdout) -> None:
        self.stream = stream
        self._next_summary = 0.0
        self._said_header = False
        self._events = 0

    def open(self, on_key: Callable[[str], None]) -> None:
        """No keys are read from a pipe."""

    def show(self, view: View) -> None:
        if not self._said_header:
            self._header(view)
        for event in view.events[self._events :]:
            say(event, self.stream)
        self._events = len(view.events)
        if time.monotonic() >= self._next_summary:
            self._next_summary = time.monotonic() + SUMMARY_EVERY
            for table in view.tables:
                lag = "?" if table.lag_seconds is None else f"{table.lag_seconds:.2f}s"
                say(
                    f"{view.elapsed:.0f}s {table.table}: {table.state}, {table.rate:.1f} changes/s, lag {lag},"
                    f" PostgreSQL {table.pg_rows} rows, Redis {table.redis_docs} documents,"
                    f" replica {table.replica_docs}",
                    self.stream,
                )

    def _header(self, view: View) -> None:
        """Once the sidecars are known: what to look at, and how."""
        if not view.sidecars:
            return
        self._said_header = True
        header = view.header
        say(f"config {header.config_path}; PostgreSQL {header.dsn}; Redis {header.redis_url}", self.stream)
        for sidecar in view.sidecars:
            say(
                f"sidecar {sidecar.name} pid {sidecar.pid}: {sidecar.health_url}/readyz, /metrics",
                self.stream,
            )
        for line in footer_lines(view, 10_000):
            say(line.strip(), self.stream)

    def event(self, text: str) -> None:
        say(text, self.stream)

    def close(self) -> None:
        """Nothing to restore."""
