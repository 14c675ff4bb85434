"""Throw-away Redis Sentinel groups on loopback: a primary, its replicas and
the sentinels watching them, optionally with ACL users and TLS everywhere.

Used by the failover tests (tests/publishers/test_sentinel.py,
tests/cdc/test_failover.py); built on ``cdc.devservers.RedisServer``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cdc.devservers import RedisServer, ServerUnavailable, wait_until


def make_certificates(directory: Path) -> Path:
    """A throw-away CA and a server certificate for 127.0.0.1 (openssl) in
    ``directory``: ``ca.crt``, ``server.crt``, ``server.key``. Returns the CA."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerUnavailable("openssl is not installed (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
         "-days", "2", "-subj", "/CN=cdc-test-ca"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf"],
    ]  # fmt: skip
    for step in steps:
        subprocess.run([openssl, *step], cwd=directory, check=True, capture_output=True)
    return directory / "ca.crt"


@dataclass
class SentinelGroup:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels watching
    them as ``master``, on loopback. With ``password`` the data nodes require
    it of the ``default`` user and have an ACL user ``cdc`` with it; the
    sentinels require ``sentinel_password`` likewise."""

    master: str = "cdcmaster"
    replicas: int = 1
    sentinels: int = 3
    password: str = ""
    sentinel_password: str = ""
    appendfsync: str = "always"
    down_after_ms: int = 1000
    tls: bool = False  # every node and sentinel on TLS only, with a CA of its own (``ca``)
    ca: Path | None = None
    data: list[RedisServer] = field(default_factory=list)  # [0]: the first primary
    watchers: list[RedisServer] = field(default_factory=list)

    def start(self) -> SentinelGroup:
        try:
            return self._start()
        except BaseException:
            self.cleanup()
            raise

    def _start(self) -> SentinelGroup:
        if self.tls:
            self.ca = make_certificates(Path(tempfile.mkdtemp(prefix="cdc-tls-")))
        primary = self._data_node(None)
        for _ in range(self.replicas):
            self._data_node(primary.port)
        wait_until(self._replicas_online, 30, "the replicas to sync", interval=0.05)
        for _ in range(self.sentinels):
            watcher = RedisServer()
            conf = watcher.directory / "sentinel.conf"
            conf.write_text(self._sentinel_conf(watcher, primary.port))
            watcher.extra = (str(conf), "--sentinel")
            self.watchers.append(watcher.start_config())
        wait_until(self._sentinels_agree, 30, "the sentinels to see each other", interval=0.1)
        return self

    def _data_node(self, replica_of: int | None) -> RedisServer:
        node = RedisServer(appendonly=True)
        node.extra = (*self._tls_args(node.port), *self._data_args(replica_of))
        self.data.append(node)
        return node.start()

    def _tls_args(self, port: int) -> tuple[str, ...]:
        """Later flags win: ``--port 0`` closes the plain port the server was given."""
        if self.ca is None:
            return ()
        files = self.ca.parent
        return (
            "--port", "0", "--tls-port", str(port), "--tls-replication", "yes", "--tls-auth-clients", "no",
            "--tls-cert-file", str(files / "server.crt"), "--tls-key-file", str(files / "server.key"),
            "--tls-ca-cert-file", str(self.ca),
        )  # fmt: skip

    def _data_args(self, replica_of: int | None) -> tuple[str, ...]:
        args: tuple[str, ...] = ("--appendfsync", self.appendfsync)
        if self.password:
            args += ("--requirepass", self.password, "--masterauth", self.password)
            args += ("--user", "cdc", "on", f">{self.password}", "~*", "&*", "+@all")
        if replica_of is not None:
            args += ("--replicaof", "127.0.0.1", str(replica_of))
        return args

    def _sentinel_conf(self, watcher: RedisServer, primary: int) -> str:
        lines = [
            "bind 127.0.0.1", "protected-mode no", f"dir {watcher.directory}",
            f"sentinel monitor {self.master} 127.0.0.1 {primary} {self.sentinels // 2 + 1}",
            f"sentinel down-after-milliseconds {self.master} {self.down_after_ms}",
            f"sentinel failover-timeout {self.master} 10000",
        ]  # fmt: skip
        if self.password:
            lines.append(f"sentinel auth-pass {self.master} {self.password}")
        if self.sentinel_password:
            lines += [
                f"requirepass {self.sentinel_password}",
                f"sentinel sentinel-pass {self.sentinel_password}",
            ]
            lines.append(f"user cdc on >{self.sentinel_password} +@all")
        # In a config file a second "port" line does not override the first
        # (the sentinel kept a plain listener): the TLS flags alone say the ports.
        flags = self._tls_args(watcher.port) or ("--port", str(watcher.port))
        lines += [f"{flags[i][2:]} {flags[i + 1]}" for i in range(0, len(flags), 2)]
        return "\n".join(lines) + "\n"

    def cli(self, port: int, *command: str, password: str | None = None) -> str:
        """A redis-cli command's output (as the ``default`` user)."""
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ServerUnavailable("redis-cli is not installed (apt-get install redis-tools)")
        auth = password if password is not None else self.password
        env = {**os.environ, "REDISCLI_AUTH": auth} if auth else None
        tls = ("--tls", "--cacert", str(self.ca)) if self.ca is not None else ()
        done = subprocess.run(
            [cli, *tls, "-p", str(port), *command], capture_output=True, text=True, env=env, timeout=10
        )
        return done.stdout

    def _replicas_online(self) -> bool:
        info = self.cli(self.data[0].port, "info", "replication")
        return f"connected_slaves:{self.replicas}" in info and info.count("state=online") == self.replicas

    def _sentinels_agree(self) -> bool:
        for watcher in self.watchers:
            out = self.cli(watcher.port, "sentinel", "master", self.master, password=self.sentinel_password)
            fields = out.split("\n")
            values = dict(zip(fields[::2], fields[1::2], strict=False))
            if values.get("num-other-sentinels") != str(self.sentinels - 1):
                return False
            if values.get("num-slaves") != str(self.replicas):
                return False
        return True

    def primary_port(self) -> int:
        """The port the sentinels name as the primary now."""
        out = self.cli(
            self.watchers[0].port, "sentinel", "get-master-addr-by-name", self.master,
            password=self.sentinel_password,
        ).split()  # fmt: skip
        return int(out[1])

    def node(self, port: int) -> RedisServer:
        return next(node for node in self.data if node.port == port)

    @property
    def nodes(self) -> tuple[tuple[str, int], ...]:
        return tuple(("127.0.0.1", watcher.port) for watcher in self.watchers)

    def cleanup(self) -> None:
        for server in (*self.watchers, *self.data):
            server.cleanup()
        if self.ca is not None:
            shutil.rmtree(self.ca.parent, ignore_errors=True)
