"""Helpers for the fault-injection tests: sidecar processes that can be killed,
frozen and thawed, a subscriber that follows a partition across faults, and
the checks that end every fault case (no version ever went backwards).

The user-level checks themselves (documents equal rows, seq gap-free) are in
``tests.e2e``; this module adds what a fault needs around them.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from publishers.layout import Layout
from publishers.subscriber import Subscriber
from tests.e2e import actual_documents, assert_mirrored, assert_seq_gap_free, wait_for

SECTIONS = ("items", "lines")


TEST_CLIENT = "cdc-test"  # the name of the tests' own Redis connections: chaos never cuts them


def checking_client(url: str, name: str = TEST_CLIENT) -> aioredis.Redis:
    """The test's own client for a server that a fault restarts: it retries a
    command that met a closed connection (the product's clients do not; the
    subscriber under test gets a plain one)."""
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 40)
    return aioredis.Redis.from_url(
        url, client_name=name, retry=retry, retry_on_error=[rex.ConnectionError, rex.TimeoutError, OSError]
    )


# -- sidecar processes ----------------------------------------------------------


class Sidecar:
    """``python -m cdc.cli run -c FILE`` as a child process, its log in a file."""

    def __init__(self, config_path: Path, log_path: Path, *, once: bool = False) -> None:
        self.log_path = log_path
        args = [sys.executable, "-m", "cdc.cli", "--json-logs", "run", "-c", str(config_path)]
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([*args, "--once"] if once else args, stdout=log, stderr=log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def is_worker(self, worker_id: str | None) -> bool:
        """Whether ``worker_id`` (host-pid-random) is this process."""
        return worker_id is not None and f"-{self.pid}-" in worker_id

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    async def stop(self, timeout: float = 40) -> int:
        """SIGTERM (the graceful path) and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, timeout)

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line})
        return out

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


async def lease_holders(client: aioredis.Redis, namespace: str, tables: Iterable[str]) -> dict[str, str]:
    """table -> the worker id in its ``ns:@lease:{table}`` key (free tables absent)."""
    out = {}
    for table in tables:
        holder = await client.get(Layout(namespace).lease(table))
        if holder is not None:
            out[table] = holder.decode()
    return out


async def published(client: aioredis.Redis, namespace: str) -> int:
    """Messages published so far over every partition of the e2e tables."""
    layout, total = Layout(namespace), 0
    for section in SECTIONS:
        for partition in await client.smembers(layout.partitions(section)):
            total += int(await client.get(layout.seq(partition.decode())) or 0)
    return total


async def wait_published_more(client: aioredis.Redis, namespace: str, than: int, timeout: float) -> None:
    async def more() -> bool:
        return await published(client, namespace) > than

    await wait_for(more, timeout, f"more than {than} published messages")


class Proxy:
    """A TCP proxy in front of Redis whose client-to-server direction can be
    held: what a sidecar sends while it is held arrives later, all at once, as
    writes delayed in the network do (the case fencing tokens exist for)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.delayed = bytearray()  # what arrived from clients while held
        self._hold_at: bytes | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def hold(self, at: bytes | None = None) -> None:
        """Hold from now on, or (``at``) from the first data carrying ``at`` on,
        e.g. the apply script's SHA: the next apply call and all after it."""
        self.delayed.clear()
        if at is None:
            self._flowing.clear()
        self._hold_at = at

    def release(self) -> None:
        self._hold_at = None
        self._flowing.set()

    async def close(self) -> None:
        """Stop accepting, close every connection, and wait for the pumps."""
        if self._server is not None:
            self._server.close()
        self.release()
        for writer in list(self._writers):
            writer.close()
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)
            await asyncio.gather(self._pump(reader, up_writer, True), self._pump(up_reader, writer, False))
        except OSError:
            writer.close()
        finally:
            self._tasks.discard(task)

    async def _pump(self, source: asyncio.StreamReader, target: asyncio.StreamWriter, gated: bool) -> None:
        try:
            while data := await source.read(1 << 16):
                if gated and self._hold_at is not None and self._hold_at in data:
                    self._flowing.clear()
                if gated and not self._flowing.is_set():
                    self.delayed += data
                    await self._flowing.wait()
                target.write(data)
                await target.drain()
        except (OSError, RuntimeError):  # RuntimeError: the other side closed the transport
            pass
        finally:
            target.close()


# -- versions never go backwards -------------------------------------------------


async def assert_versions_never_decrease(
    client: aioredis.Redis, namespace: str, sections: tuple[str, ...] = SECTIONS
) -> int:
    """Per document, the versions of its messages in the stream never decrease
    (the streams of the tests are never trimmed, so this is every published
    change). Returns the number of messages checked."""
    layout, checked = Layout(namespace), 0
    partitions: set[str] = set()
    for section in sections:
        partitions |= {p.decode() for p in await client.smembers(layout.partitions(section))}
    for partition in sorted(partitions):
        last: dict[tuple[str, str], tuple[int, int]] = {}
        for _, fields in await client.xrange(layout.stream(partition)):
            message = json.loads(fields[b"m"])
            where = (message["section"], message["key"])
            if where in last:
                seq, version = last[where]
                assert message["version"] >= version, (
                    f"{partition}/{where}: version {message['version']} (seq {message['seq']}) "
                    f"after {version} (seq {seq})"
                )
            last[where] = (message["seq"], message["version"])
            checked += 1
    return checked


class VersionSampler:
    """Samples every live document's ``@v`` while a fault runs and records
    any that went down between two samples (the stream shows published
    changes only; this sees the others too)."""

    def __init__(self, client: aioredis.Redis, namespace: str, interval: float = 0.05) -> None:
        self.client, self.layout, self.interval = client, Layout(namespace), interval
        self.seen: dict[tuple[str, str, str], int] = {}
        self.regressions: list[str] = []
        self.samples = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> VersionSampler:
        self._stopping.clear()
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        """Ask the loop to end (a cancellation may be swallowed by the client
        mid-command), and wait for it."""
        if self._task is not None:
            self._stopping.set()
            await asyncio.wait_for(asyncio.gather(self._task, return_exceptions=True), 10)
            self._task = None

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.sample()
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                pass  # Redis is down in some of the faults: sample again later
            except rex.ResponseError:
                pass  # e.g. LOADING while an AOF is replayed
            await asyncio.sleep(self.interval)

    async def sample(self) -> None:
        for section in SECTIONS:
            for raw in await self.client.smembers(self.layout.partitions(section)):
                partition = raw.decode()
                keys = [k.decode() for k in await self.client.smembers(self.layout.index(partition, section))]
                pipe = self.client.pipeline(transaction=False)
                for key in keys:
                    pipe.hget(self.layout.document(partition, section, key), "@v")
                for key, value in zip(keys, await pipe.execute(), strict=True):
                    if value is None:
                        continue
                    where, version = (partition, section, key), int(value)
                    if version < self.seen.get(where, -1):
                        self.regressions.append(f"{where}: @v {version} after {self.seen[where]}")
                    self.seen[where] = max(version, self.seen.get(where, -1))
        self.samples += 1


# -- a subscriber across faults --------------------------------------------------


class Follower:
    """A ``Subscriber`` following one partition with ``async for``, as an
    application would, for the whole test; it must come through every fault
    with a replica equal to the documents."""

    def __init__(self, client: aioredis.Redis, namespace: str, partition: str = "orders") -> None:
        self.subscriber = Subscriber(client, namespace, partition, block=0.2)
        self.partition = partition
        self.messages = 0
        self.error: BaseException | None = None
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        try:
            async for _ in self.subscriber:
                self.messages += 1
        except Exception as exc:  # kept for the assertion: a subscriber must not die
            self.error = exc

    async def assert_replica_equals_documents(
        self, client: aioredis.Redis, namespace: str, timeout: float = 30
    ) -> None:
        async def equal() -> bool:
            assert self.error is None, f"the subscriber failed: {self.error!r}"
            documents = await actual_documents(client, namespace)
            expected: dict[str, dict[str, dict[str, Any]]] = {}
            for (partition, section, key), doc in documents.items():
                if partition == self.partition:
                    expected.setdefault(section, {})[key] = doc
            replica = {s: docs for s, docs in self.subscriber.replica.items() if docs}
            return replica == expected

        await wait_for(equal, timeout, f"the subscriber's replica of {self.partition} to equal the documents")

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.wait_for(asyncio.gather(self._task, return_exceptions=True), 10)


# -- health endpoint ---------------------------------------------------------------


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """GET a health route: (status, JSON body); (0, {}) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


async def wait_health(
    port: int, status: int, timeout: float, contains: str = "", path: str = "/readyz"
) -> dict[str, Any]:
    """Wait until ``path`` (readiness: what a fault degrades) answers
    ``status`` (and its body mentions ``contains``)."""
    body: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal body
        code, body = await asyncio.to_thread(get, port, path)
        return code == status and contains in json.dumps(body)

    try:
        await wait_for(reached, timeout, f"{path} to answer {status} {contains!r}")
    except AssertionError as exc:
        raise AssertionError(f"{exc} (last answer: {body})") from None
    return body


# -- the end of every fault case -------------------------------------------------------


async def assert_nothing_lost(
    dsn: str,
    schema: str,
    client: aioredis.Redis,
    namespace: str,
    follower: Follower,
    sampler: VersionSampler | None = None,
    timeout: float = 30,
) -> None:
    """Documents equal the rows, the subscriber's replica equals the documents,
    every partition's seq is gap-free, and no document's version ever went
    backwards (in the stream, and in the samples taken during the fault)."""
    await assert_mirrored(dsn, schema, client, namespace, timeout=timeout)
    await assert_seq_gap_free(client, namespace, SECTIONS)
    await assert_versions_never_decrease(client, namespace)
    await follower.assert_replica_equals_documents(client, namespace, timeout=timeout)
    if sampler is not None:
        await sampler.stop()
        assert sampler.samples > 0
        assert not sampler.regressions, sampler.regressions[:5]
