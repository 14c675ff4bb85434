"""What a demo killed with SIGKILL leaves running, and stopping it at the next start.

PostgreSQL, Redis and the sidecars run in sessions of their own (so that
Ctrl-C reaches the demo alone, which stops them in order). A demo that dies
without its orderly stop (SIGKILL, an OOM kill) therefore leaves them
running, and the next demo in the same ``--dir`` would fail to start
PostgreSQL on the same data directory (``FATAL: lock file "postmaster.pid"
already exists``).

So the demo records what it starts in ``<dir>/pids.json``: each process's pid
and its start time (``/proc/<pid>/stat``, field 22 ``starttime``, in clock
ticks since boot; proc(5)). A pid alone could name an unrelated process by
then (pids are reused); the pair never does, so nothing but what the demo
started is ever signalled. At start, ``stop_leftovers`` stops what a previous
run left: the sidecars, then Redis (SIGTERM, SIGKILL after a deadline), then
PostgreSQL with ``pg_ctl stop -m fast`` on its data directory, as its owner.
The orderly stop removes the file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from cdc.devservers import postgres_bindir
from cdc.errors import CdcError

PIDS_FILE = "pids.json"
TERM_TIMEOUT = 10.0  # seconds a leftover gets after SIGTERM (or pg_ctl stop -m fast) before SIGKILL
KILL_TIMEOUT = 5.0  # seconds a leftover gets to vanish after SIGKILL
DEMO, POSTGRES, REDIS = "demo", "PostgreSQL", "Redis"


class LeftoverError(CdcError):
    """A previous demo's process that cannot be stopped, or a demo still running in the directory."""


@dataclass(frozen=True)
class Started:
    """A process the demo started (or the demo itself)."""

    role: str  # "demo", "PostgreSQL", "Redis", "sidecar A"...
    pid: int
    start_time: int  # /proc/<pid>/stat starttime: with the pid, this process and no other
    data: str | None = None  # PostgreSQL: its data directory (pg_ctl -D)

    def running(self) -> bool:
        """Whether this very process still runs (not a later one with the same pid)."""
        return start_time(self.pid) == self.start_time

    def described(self) -> str:
        return f"{self.role} (pid {self.pid})"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when it is
    gone or a zombie (it runs no more: only its exit status is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ")":
    # the fields after the last ")" are 3 (state) onwards; starttime is 22.
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[22 - 3])


class PidFile:
    """``<dir>/pids.json``: role -> what the demo started, written as each starts."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / PIDS_FILE

    def entries(self) -> list[Started]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise LeftoverError(
                f"{self.path} cannot be read ({exc}): stop what a previous demo left running by hand "
                "(ps -ef | grep -e 'cdc.cli' -e postgres -e redis-server), then remove the file"
            ) from exc
        return [Started(**entry) for entry in raw]

    def record(self, role: str, pid: int, data: Path | None = None) -> None:
        started = start_time(pid)
        if started is None:  # gone already: nothing to stop later
            return
        entry = Started(role, pid, started, str(data) if data else None)
        entries = [e for e in self.entries() if e.role != role] + [entry]
        self._write(entries)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _write(self, entries: list[Started]) -> None:
        # Written whole, then renamed over the old one: a kill mid-write leaves the old file.
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps([asdict(e) for e in entries], indent=1), encoding="utf-8")
        scratch.replace(self.path)


def stop_leftovers(directory: Path, say: Callable[[str], None]) -> None:
    """Stop what a previous demo in ``directory`` left running; one line if
    there was any. ``LeftoverError`` when a demo still runs there, or when a
    leftover cannot be stopped."""
    pids = PidFile(directory)
    running = [e for e in pids.entries() if e.running() and e.pid != os.getpid()]
    demo = next((e for e in running if e.role == DEMO), None)
    if demo is not None:
        raise LeftoverError(
            f"another cdc demo (pid {demo.pid}) is running with --dir {directory}: stop it "
            f"(Ctrl-C in its terminal, or kill {demo.pid}), or give this one another --dir"
        )
    if running:
        say(
            f"a previous demo in {directory} was stopped without its orderly stop and left "
            + ", ".join(e.described() for e in running)
            + " running: stopping them"
        )
    # The sidecars first (while their servers are up), then Redis, then PostgreSQL.
    for entry in sorted(running, key=lambda e: (e.role == POSTGRES, e.role == REDIS)):
        if entry.role == POSTGRES and entry.data and Path(entry.data).is_dir():
            _stop_postgres(entry)
        else:
            _stop_process(entry)
    pids.remove()


def _stop_process(entry: Started) -> None:
    """SIGTERM, then SIGKILL after ``TERM_TIMEOUT``."""
    _signal(entry, signal.SIGTERM)
    if _gone(entry, TERM_TIMEOUT):
        return
    _signal(entry, signal.SIGKILL)
    if not _gone(entry, KILL_TIMEOUT):
        raise _cannot_stop(entry, f"it still runs {KILL_TIMEOUT:.0f}s after SIGKILL")


def _stop_postgres(entry: Started) -> None:
    """``pg_ctl stop -m fast`` (SIGINT to the postmaster: it ends the sessions
    and shuts down cleanly), as the data directory's owner (pg_ctl refuses to
    run as root); SIGKILL if it has not stopped within ``TERM_TIMEOUT``."""
    data = Path(entry.data or "")
    command = [str(postgres_bindir() / "pg_ctl"), "stop", "-D", str(data), "-m", "fast", "-w"]
    command += ["-t", str(int(TERM_TIMEOUT))]
    stopped = subprocess.run(command, capture_output=True, check=False, preexec_fn=_as_owner_of(data))
    if stopped.returncode == 0 and _gone(entry, KILL_TIMEOUT):
        return
    _signal(entry, signal.SIGKILL)
    if not _gone(entry, KILL_TIMEOUT):
        detail = stopped.stderr.decode(errors="replace").strip()
        raise _cannot_stop(
            entry, f"pg_ctl stop -m fast -D {data} failed ({detail}) and SIGKILL did not stop it"
        )


def _as_owner_of(path: Path) -> Callable[[], None] | None:
    """Run as the owner of ``path`` when we are root (devservers runs PostgreSQL as another user)."""
    if os.geteuid() != 0:
        return None
    owner = path.stat()

    def demote() -> None:
        os.setgid(owner.st_gid)
        os.setuid(owner.st_uid)

    return demote


def _signal(entry: Started, signum: signal.Signals) -> None:
    if not entry.running():  # checked right before: the pid is never one another process reuses
        return
    try:
        os.kill(entry.pid, signum)
    except ProcessLookupError:
        return
    except PermissionError as exc:
        raise _cannot_stop(entry, f"{signum.name} is not permitted ({exc})") from exc


def _gone(entry: Started, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while entry.running():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _cannot_stop(entry: Started, why: str) -> LeftoverError:
    return LeftoverError(
        f"a previous demo left {entry.described()} running and it cannot be stopped: {why}. "
        f"Stop it yourself (sudo kill -9 {entry.pid}), then run the demo again"
    )
