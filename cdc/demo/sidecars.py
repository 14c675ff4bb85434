"""The demo's sidecars: ``cdc run -c <dir>/tables.yaml`` subprocesses, as in
production, sharing the tables through their leases.

Each runs in a session of its own (``start_new_session``): Ctrl-C in the
terminal signals the terminal's foreground process group, and the demo, not
the terminal, decides the order things stop in (writer, then sidecars, then
servers). Each has its own health port (``CDC_HEALTH``, which the demo's
config reads) and its own log file.

Their environment is the shell's without its ``CDC_*`` variables: an operator
who exported ``CDC_SOURCE_DSN``/``CDC_REDIS_URL`` for a real database and Redis
(or ``CDC_CONFIG``) must not have the demo's sidecars reach them; the demo's
config names its own servers and reads no other variable.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cdc.devservers import free_port

OPERATOR_PREFIX = "CDC_"  # the operator's settings (CDC_SOURCE_DSN, CDC_REDIS_URL, CDC_CONFIG...)
STOP_TIMEOUT = 30.0  # seconds a sidecar gets to drain and stop after SIGTERM


@dataclass
class Sidecar:
    name: str
    config_path: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Sidecar:
        env = sidecar_environment(os.environ, health=f"127.0.0.1:{self.port}")
        command = [sys.executable, "-m", "cdc.cli", "--text-logs", "run", "-c", str(self.config_path)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
            )
        return self

    def kill(self) -> None:
        """SIGKILL: no drain, no lease released, as a crash or an OOM kill."""
        if self.alive and self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.killed = True

    async def stop(self) -> int | None:
        """SIGTERM (the sidecar drains, persists its checkpoints and releases
        its leases), then its exit code; SIGKILL after ``STOP_TIMEOUT``."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(proc.wait, STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            return await asyncio.to_thread(proc.wait)


@dataclass
class Sidecars:
    """The demo's sidecars, named A, B, C... in the order they started."""

    config_path: Path
    directory: Path
    started: Callable[[str, int], None] | None = None  # (role, pid) of each sidecar started (pids.json)
    all: list[Sidecar] = field(default_factory=list)

    def start_one(self) -> Sidecar:
        name = chr(ord("A") + len(self.all)) if len(self.all) < 26 else f"S{len(self.all)}"
        sidecar = Sidecar(name, self.config_path, self.directory / f"sidecar-{name}.log").start()
        self.all.append(sidecar)
        if self.started is not None and sidecar.pid is not None:
            self.started(f"sidecar {name}", sidecar.pid)
        return sidecar

    def live(self) -> list[Sidecar]:
        return [s for s in self.all if s.alive]

    def by_pid(self, pid: int) -> Sidecar | None:
        return next((s for s in self.all if s.pid == pid), None)

    async def stop_all(self) -> dict[str, int | None]:
        """Stop every live sidecar together; name -> exit code."""
        live = self.live()
        codes = await asyncio.gather(*(s.stop() for s in live))
        return {s.name: code for s, code in zip(live, codes, strict=True)}


def sidecar_environment(environ: Mapping[str, str], *, health: str) -> dict[str, str]:
    """``environ`` without any ``CDC_*`` variable, and ``CDC_HEALTH`` = ``health``."""
    kept = {name: value for name, value in environ.items() if not name.startswith(OPERATOR_PREFIX)}
    return {**kept, "CDC_HEALTH": health}


def worker_pid(worker_id: str) -> int | None:
    """The pid in a worker id ``<host>-<pid>-<random>`` (cdc.daemon.Daemon)."""
    parts = worker_id.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
