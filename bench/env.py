"""What every benchmark shares: the servers, the sidecar as a measured
subprocess, config files, and the machine's description.

``Env`` starts one PostgreSQL and one redis-server (``cdc.devservers``) on free
loopback ports. ``run_sidecar`` runs ``cdc run -c FILE [--once]`` as a child
process, the way it runs in production, and measures it from the outside:
wall time, CPU seconds and peak RSS from ``wait4``'s rusage (the kernel's own
accounting of the child), RSS samples while it runs, and its JSON log lines.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import psycopg

from cdc.devservers import PostgresServer, RedisServer, postgres_bindir

WORK = Path(__file__).resolve().parent / ".work"
NAMESPACE = "bench"
TRACKING_SCHEMA = "cdc_tracking"


@dataclass
class Env:
    """The servers of one benchmark run."""

    postgres: PostgresServer = field(default_factory=PostgresServer)
    redis: RedisServer = field(default_factory=RedisServer)

    def start(self) -> Env:
        WORK.mkdir(parents=True, exist_ok=True)
        self.postgres.settings = ("max_wal_size=4GB", "checkpoint_timeout=30min")
        self.postgres.start()
        self.redis.start()
        return self

    def stop(self) -> None:
        self.redis.cleanup()
        self.postgres.cleanup()

    @property
    def dsn(self) -> str:
        return self.postgres.dsn

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def sql(self, *statements: str) -> None:
        """Run statements in one transaction (DDL, bulk writes)."""
        with psycopg.connect(self.dsn) as conn:
            for statement in statements:
                conn.execute(statement.encode())

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(statement.encode()).fetchall()

    def version_bound(self) -> int:
        """What a read now would return as its consistent bound (xmin - 1)."""
        return int(self.query("select pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1")[0][0])

    def vacuum_analyze(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("vacuum analyze")

    def redis_client(self) -> Any:
        """A blocking client with room for slow commands (SAVE, FLUSHALL of a big dataset)."""
        import redis

        return redis.Redis.from_url(self.redis_url, socket_timeout=600)

    def save_redis(self, name: str) -> Path:
        """SAVE the dataset and keep a copy of the RDB file (``restore_redis``)."""
        client = self.redis_client()
        try:
            client.save()
        finally:
            client.close()
        kept = WORK / f"{name}.rdb"
        shutil.copyfile(self.redis.directory / "dump.rdb", kept)
        return kept

    def restore_redis(self, rdb: Path) -> None:
        """Restart redis-server (same port) on a kept RDB file."""
        self.redis.stop()
        shutil.copyfile(rdb, self.redis.directory / "dump.rdb")
        self.redis.start()
        import redis

        client = self.redis_client()
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.BusyLoadingError):
                    if client.ping():
                        return
                time.sleep(0.05)
        finally:
            client.close()

    def flush_redis(self) -> None:
        client = self.redis_client()
        try:
            client.flushall()
        finally:
            client.close()


# -- configs ---------------------------------------------------------------------


def write_config(
    env: Env,
    name: str,
    tables: list[dict[str, Any]],
    *,
    worker: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
    redis: dict[str, Any] | None = None,
) -> Path:
    """A config file for ``cdc run``; ``tables`` entries as in the YAML."""
    config = {
        "source": {"kind": "postgres", "dsn": env.dsn, "tracking_schema": TRACKING_SCHEMA, **(source or {})},
        "redis": {"url": env.redis_url, "namespace": NAMESPACE, "stream_max_len": 100_000, **(redis or {})},
        "worker": {"health": None, **(worker or {})},
        "tables": tables,
    }
    path = WORK / f"{name}.yaml"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
    return path


def cdc_command(*args: str) -> list[str]:
    """The ``cdc`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "cdc"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "from cdc.cli import main; main()", *args]


def cdc(*args: str) -> None:
    """Run a ``cdc`` command to completion (e.g. ``tracking enable``)."""
    subprocess.run(cdc_command(*args), check=True, capture_output=True)


# -- the sidecar as a measured subprocess -------------------------------------------


@dataclass
class SidecarRun:
    """What one ``cdc run`` process did."""

    seconds: float  # wall time from spawn to exit
    user: float  # CPU seconds
    system: float
    peak_rss: int  # bytes, ru_maxrss
    samples: list[tuple[float, int]]  # (seconds since spawn, RSS bytes)
    logs: list[dict[str, Any]]
    returncode: int

    @property
    def cpu(self) -> float:
        return self.user + self.system

    def log_time(self, message: str, **match: Any) -> float | None:
        """Seconds since spawn of the first log line with ``message`` (and ``match``)."""
        for entry in self.logs:
            if entry.get("msg") == message and all(entry.get(k) == v for k, v in match.items()):
                return float(entry["_t"])
        return None


class Sidecar:
    """``cdc run`` in a child process, sampled while it runs."""

    def __init__(self, config: Path, *, once: bool, name: str) -> None:
        self.log_path = WORK / f"{name}.log"
        self.command = cdc_command("--log-level", "INFO", "--json-logs", "run", "-c", str(config))
        if once:
            self.command.append("--once")
        self.started = 0.0
        self.proc: subprocess.Popen[bytes] | None = None
        self.samples: list[tuple[float, int]] = []

    def start(self) -> Sidecar:
        self.started = time.time()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU seconds so far."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.samples.append((time.time() - self.started, self.rss()))

    def wait(self, timeout: float, interval: float = 0.25) -> SidecarRun:
        """Wait for the process to exit (sampling RSS), and reap it with wait4."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid == self.pid:
                break
            if time.monotonic() > deadline:
                self.proc.kill()
                pid, status, usage = os.wait4(self.pid, 0)
                raise TimeoutError(f"{' '.join(self.command)} did not finish within {timeout:.0f}s")
            self.sample()
            time.sleep(interval)
        ended = time.time()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        run = SidecarRun(
            seconds=ended - self.started,
            user=usage.ru_utime,
            system=usage.ru_stime,
            peak_rss=usage.ru_maxrss * 1024,
            samples=self.samples,
            logs=self._logs(),
            returncode=self.proc.returncode,
        )
        if run.returncode != 0:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{' '.join(self.command)} exited with {run.returncode}:\n{tail}")
        return run

    def stop(self, timeout: float = 60) -> SidecarRun:
        """SIGTERM (a graceful stop), then wait."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            with contextlib.suppress(ChildProcessError):
                os.wait4(self.pid, 0)
            self.proc.returncode = -9

    def _logs(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "ts" in entry:
                when = dt.datetime.fromisoformat(entry["ts"]).timestamp()
                entry["_t"] = when - self.started
                entries.append(entry)
        return entries


@contextlib.contextmanager
def sidecar(config: Path, *, once: bool, name: str) -> Iterator[Sidecar]:
    """A running sidecar that is killed if the block fails."""
    process = Sidecar(config, once=once, name=name).start()
    try:
        yield process
    finally:
        process.kill()


# -- the machine ---------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def versions(env: Env) -> dict[str, str]:
    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    redis_version = next((w[2:] for w in server if w.startswith("v=")), " ".join(server))
    postgres = subprocess.run(
        [str(postgres_bindir() / "postgres"), "--version"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "python": platform.python_version(),
        "postgresql": next((w for w in postgres.split() if w[:1].isdigit()), postgres),
        "redis": redis_version,
        "redis_py": metadata.version("redis"),
        "hiredis": metadata.version("hiredis"),
        "psycopg": metadata.version("psycopg"),
        "orjson": metadata.version("orjson"),
        "cdc_sync": metadata.version("cdc-sync"),
    }


def other_load(seconds: float = 1.0) -> float:
    """CPU % of one core used by processes that are not ours (nor the servers
    and sidecars we started) over ``seconds``."""
    ours = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        ours |= {p.pid for p in psutil.Process().children(recursive=True)}
    total = 0.0
    procs = [p for p in psutil.process_iter(["pid"]) if p.pid not in ours]
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.cpu_percent(None)
    time.sleep(seconds)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.cpu_percent(None)
    return total


class LoadWatch:
    """Samples ``other_load`` in a thread while the benchmarks run."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-watch", daemon=True)

    def start(self) -> LoadWatch:
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        samples = self.samples or [0.0]
        return {"mean": round(sum(samples) / len(samples), 1), "max": round(max(samples), 1),
                "samples": len(self.samples)}  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(other_load(2.0))


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process, its live children and its reaped children
    (a PostgreSQL postmaster's backends come and go)."""
    try:
        root = psutil.Process(pid)
        times = root.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
        return float(total)
    except psutil.Error:
        return 0.0


@dataclass
class ServerCpu:
    """CPU seconds the servers spent between ``start`` and ``stop``."""

    env: Env
    redis: float = 0.0
    postgres: float = 0.0

    def _now(self) -> tuple[float, float]:
        redis_pid = self.env.redis.proc.pid if self.env.redis.proc else 0
        pg_pid = self.env.postgres.proc.pid if self.env.postgres.proc else 0
        return tree_cpu(redis_pid), tree_cpu(pg_pid)

    def start(self) -> ServerCpu:
        self.redis, self.postgres = self._now()
        return self

    def stop(self) -> dict[str, float]:
        redis_now, pg_now = self._now()
        return {"redis": round(redis_now - self.redis, 2), "postgres": round(pg_now - self.postgres, 2)}
