"""Throw-away local servers on free loopback ports: redis-server, a Redis
Cluster, and PostgreSQL (initdb into a temporary directory).

Used by the test suite's session fixtures, by ``cdc demo`` and by the
benchmarks. PostgreSQL refuses to run as root, so when we are root the data
directory is handed to an unprivileged user (``postgres`` or ``nobody``) and
the server runs as that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


class ServerUnavailable(RuntimeError):
    """The binaries for a server are not installed here."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``predicate`` until it is true; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


# -- Redis -------------------------------------------------------------------


@dataclass
class RedisServer:
    """One redis-server process. ``start()``, ``stop()``, ``restart()``."""

    port: int = field(default_factory=free_port)
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="cdc-redis-")))
    appendonly: bool = False
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    # In a session of its own, Ctrl-C in a terminal does not reach it: its owner
    # stops it when it is done with it (cdc demo, after the sidecars).
    own_session: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerUnavailable("redis-server is not installed (apt-get install redis-server)")
        args = [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--protected-mode", "no",
            "--maxmemory-policy", "noeviction",
            *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=self.own_session
        )
        wait_until(lambda: _port_open(self.port), 20, f"redis-server on port {self.port}")
        return self

    def start_config(self) -> RedisServer:
        """Start with ``extra`` alone (a config file and its flags: a sentinel)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerUnavailable("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [binary, *self.extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=self.own_session,
        )  # fmt: skip
        wait_until(lambda: _port_open(self.port), 20, f"redis-server on port {self.port}")
        return self

    def stop(self) -> None:
        _terminate(self.proc)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class RedisCluster:
    """A Redis Cluster of ``masters`` masters, each with ``replicas`` replicas, on loopback."""

    masters: int = 3
    replicas: int = 0
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisCluster:
        try:
            return self._start()
        except BaseException:
            self.cleanup()  # no orphaned nodes when creating the cluster fails
            raise

    def _start(self) -> RedisCluster:
        for _ in range(self.masters * (1 + self.replicas)):
            node = RedisServer(
                port=free_cluster_port(), extra=("--cluster-enabled", "yes", "--cluster-node-timeout", "5000")
            )
            node.extra = (*node.extra, "--cluster-config-file", str(node.directory / "nodes.conf"))
            self.nodes.append(node.start())
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ServerUnavailable("redis-cli is not installed (apt-get install redis-tools)")
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

        # every node: each learns the slots by gossip, and answers CLUSTERDOWN until then
        def ready() -> bool:
            states = (
                subprocess.run(
                    [cli, "-p", str(n.port), "cluster", "info"], capture_output=True, text=True
                ).stdout
                for n in self.nodes
            )
            if not all("cluster_state:ok" in state for state in states):
                return False
            nodes = subprocess.run(
                [cli, "-p", str(self.nodes[0].port), "cluster", "nodes"], capture_output=True, text=True
            ).stdout  # every node known and connected (a replica too)
            replicas = sum(" slave " in line or ",slave " in line for line in nodes.splitlines())
            return nodes.count(" connected") == len(self.nodes) and replicas == self.masters * self.replicas

        wait_until(ready, 30, "the Redis Cluster to be ready", interval=0.1)
        return self

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


# -- PostgreSQL --------------------------------------------------------------


def postgres_bindir() -> Path:
    """Where initdb and postgres live (PATH, then Debian's versioned dirs)."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    raise ServerUnavailable("PostgreSQL server binaries are not installed (apt-get install postgresql)")


def _unprivileged_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServerUnavailable("running as root and no 'postgres' or 'nobody' user to run PostgreSQL as")


@dataclass
class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, trust auth on loopback."""

    port: int = field(default_factory=free_port)
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="cdc-pg-")))
    user: str = "cdc"
    database: str = "cdc"
    proc: subprocess.Popen[bytes] | None = None
    settings: tuple[str, ...] = ()
    own_session: bool = False  # as RedisServer.own_session

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def _demote(self) -> Callable[[], None] | None:
        account = _unprivileged_user()
        if account is None:
            return None

        def demote() -> None:
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)

        return demote

    def _chown(self) -> None:
        account = _unprivileged_user()
        if account is None:
            return
        for root, dirs, files in os.walk(self.directory):
            for name in (*dirs, *files):
                os.chown(os.path.join(root, name), account.pw_uid, account.pw_gid)
        os.chown(self.directory, account.pw_uid, account.pw_gid)

    def start(self) -> PostgresServer:
        bindir = postgres_bindir()
        demote = self._demote()
        if demote is not None and not self._reachable(demote):
            # Running as root in a directory the server's user cannot reach
            # (under /root, or pytest's 0700 tmp): keep the cluster in /tmp.
            self.directory = Path(tempfile.mkdtemp(prefix="cdc-pg-"))
        if not (self.data / "PG_VERSION").exists():
            self._chown()
            subprocess.run(
                [str(bindir / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
                 "-E", "UTF8", "--locale=C", "--no-sync"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=demote,
                cwd=str(self.directory),
            )  # fmt: skip
        args = [
            str(bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.directory}",
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=200", "-c", "shared_buffers=128MB",
        ]  # fmt: skip
        for setting in self.settings:
            args += ["-c", setting]
        log = open(self.directory / "postgres.log", "ab")
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=log, preexec_fn=demote, cwd=str(self.directory),
            start_new_session=self.own_session,
        )  # fmt: skip
        log.close()
        wait_until(self._accepting, 30, f"PostgreSQL on port {self.port}", interval=0.05)
        self._create_database(bindir)
        return self

    def _reachable(self, demote: Callable[[], None]) -> bool:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._chown()
        probe = subprocess.run(["test", "-w", str(self.directory)], preexec_fn=demote, check=False)
        return probe.returncode == 0

    def _accepting(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.directory / "postgres.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n{log}")
        return _port_open(self.port)

    def _create_database(self, bindir: Path) -> None:
        psql = [str(bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qtAc"]  # fmt: skip

        def try_psql() -> bool:
            return subprocess.run([*psql, "select 1"], capture_output=True).returncode == 0

        wait_until(try_psql, 30, "PostgreSQL to accept connections", interval=0.05)
        exists = subprocess.run(
            [*psql, f"select 1 from pg_database where datname = '{self.database}'"],  # noqa: S608 - our own name
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if not exists:
            subprocess.run([*psql, f'create database "{self.database}"'], check=True, capture_output=True)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (SIGINT) or ``immediate`` (SIGQUIT, like a crash)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        self.proc.send_signal(signal.SIGQUIT if mode == "immediate" else signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
