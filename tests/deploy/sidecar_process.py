"""A `cdc run` process as a container runs it: JSON logs on stderr, read line by
line, so a test can wait for what the sidecar says (where its health server
listens) with a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.e2e import cdc, create_tables, write_config


class Sidecar:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.logs: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, config: Path, environ: dict[str, str] | None = None) -> Sidecar:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cdc.cli",
            "--json-logs",
            "run",
            "-c",
            str(config),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **(environ or {})},
        )
        return cls(process)

    async def wait_for_log(self, message: str, timeout: float = 30) -> dict[str, Any]:
        """The first JSON log line whose ``msg`` is ``message`` (every line read is kept)."""
        assert self.process.stderr is not None
        deadline = time.monotonic() + timeout
        for line in self.logs:
            if line.get("msg") == message:
                return line
        while (left := deadline - time.monotonic()) > 0:
            raw = await asyncio.wait_for(self.process.stderr.readline(), left)
            if not raw:
                raise AssertionError(
                    f"the sidecar exited ({await self.process.wait()}) before logging {message!r}"
                )
            line = json.loads(raw)
            self.logs.append(line)
            if line.get("msg") == message:
                return line
        raise AssertionError(f"timed out after {timeout}s waiting for the log line {message!r}")

    async def stop(self) -> int:
        """SIGTERM, as the kubelet and `docker stop` send it; the exit code."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), 40)
        finally:
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()


async def tracked_config(
    path: Path, postgres_dsn: str, redis_url: str, schema: str, namespace: str, **worker: Any
) -> Path:
    """A config file for two tracked tables with a row each (tests/e2e.py's tables)."""
    await create_tables(postgres_dsn, schema)
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f"insert into {schema}.items (id, name, qty) values (1, 'one', 1)")
        await conn.execute(f"insert into {schema}.lines values (1, 1, 'a', 1)")
    write_config(path, schema, postgres_dsn, redis_url, namespace, **worker)
    enabled = cdc("tracking", "enable", "-c", str(path))
    assert enabled.returncode == 0, enabled.stderr
    return path


def docker_healthcheck(command: list[str]) -> list[str]:
    """The ``cdc health`` command inside the HEALTHCHECK's ``sh -c "... || exit 1"``:
    Docker reserves exit code 2, which ``cdc health`` gives for a config error."""
    shell, flag, script = command
    assert (shell, flag) == ("sh", "-c")
    probe, fallback = script.split("||")
    assert fallback.strip() == "exit 1"
    return shlex.split(probe)
