"""Issue 19's proof, on real servers: three consumer processes share a section
spanning two partitions while changes are written; one is SIGKILLed in the
middle of a handler; one document is poison. Then every message was handled,
the only ones handled twice are those the killed process held, each
document's messages were handled in seq order (across the kill and the
retries, never two at once), the poison messages are in the dead letter
after 3 deliveries, and nothing is left pending or held."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdc.config import RedisConfig
from publishers.manager import DataManager
from publishers.model import Change

PARTITIONS = ("east", "west{1}")  # one needs encoding inside keys
WORKER = Path(__file__).with_name("consumer_process.py")
POISON = "poison"
DOCS, ROUNDS = 30, 30


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


def changes(round_: int) -> list[Change]:
    """One change of every document (and the poison one) in both partitions."""
    out = []
    for partition in PARTITIONS:
        for d in range(DOCS):
            values = {"n": orjson.dumps(round_)}
            out.append(Change("dbo.alpha", partition, "alpha", f"d{d}", "U", round_ * 100 + d, values))  # type: ignore[arg-type]
        if round_ % 4 == 0:
            out.append(Change("dbo.alpha", partition, "alpha", POISON, "U", round_ * 100 + 99, {"n": b"0"}))  # type: ignore[arg-type]
    return out


def events(log: Path) -> list[list[Any]]:
    """The log's complete lines (a line being written while we read is left for the next read)."""
    if not log.exists():
        return []
    lines = log.read_bytes().split(b"\n")[:-1]
    return [orjson.loads(line) for line in lines]


async def until(condition: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


class Group:
    """The group's state in Redis, per partition."""

    def __init__(self, manager: DataManager) -> None:
        self.client, self.layout = manager.client, manager.layout

    def key(self, partition: str, name: str) -> str:
        return f"{self.layout.prefix(partition)}@group:g:{name}"

    async def alive(self) -> set[str]:
        names: set[str] = set()
        for partition in PARTITIONS:
            names |= {k.decode() for k in await self.client.hkeys(self.key(partition, "alive"))}
        return names

    async def pending(self) -> int:
        total = 0
        for partition in PARTITIONS:
            info = await self.client.xpending(self.layout.stream(partition), "g")
            total += int(info["pending"])
        return total

    async def leftovers(self) -> dict[str, int]:
        out = {}
        for partition in PARTITIONS:
            out[f"{partition} holders"] = await self.client.hlen(self.key(partition, "holders"))
            out[f"{partition} docs"] = await self.client.hlen(self.key(partition, "docs"))
            out[f"{partition} inbox"] = await self.client.zcard(self.key(partition, "inbox"))
        return out


@pytest.mark.parametrize("restart", [False, True], ids=["killed", "killed-and-restarted"])
async def test_three_processes_one_killed_and_a_poison_message(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path, restart: bool
) -> None:
    """``restart``: the killed process comes back at once under its name (a
    pod's), before ``claim_after``: it takes its own pending messages again,
    or the others claimed them first; either way the same checks hold."""
    ns = redis_config.namespace
    await manager.apply(changes(0))  # the partitions exist (ns:@partitions:alpha) before the consumers start
    log = tmp_path / "handled.jsonl"
    names = ["c1", "c2", "c3"]

    def spawn(name: str) -> subprocess.Popen[bytes]:
        cluster = str(int(redis_config.cluster))
        return subprocess.Popen(
            [sys.executable, str(WORKER), redis_config.url, cluster, ns, name, str(log), POISON]
        )

    procs = {name: spawn(name) for name in names}
    group = Group(manager)
    try:
        await until(lambda: _is(group.alive(), set(names)), 30, "three consumers")
        victim = "c2"
        written = [0]

        async def write() -> None:
            for round_ in range(1, ROUNDS + 1):
                await manager.apply(changes(round_))
                written[0] = round_
                await asyncio.sleep(0.02)  # a writer's pace, so that the consumers interleave with it

        writer = asyncio.create_task(write())
        await until(
            lambda: _true(written[0] >= ROUNDS // 3 and _running(events(log), victim)),
            30,
            "the victim inside a handler, mid-stream",
        )
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        killed_at = written[0]
        if restart:
            procs[victim] = spawn(victim)

            async def back() -> bool:
                return sum(1 for e in events(log) if e[:2] == ["ready", victim]) == 2

            await until(back, 30, "the victim back")
        await writer
        assert killed_at < ROUNDS  # the kill was mid-stream

        total = {p: int(await manager.client.get(manager.layout.seq(p))) for p in PARTITIONS}
        poison = {(m["partition"], m["seq"]) for m in await _messages(manager) if m["key"] == POISON}
        dead = f"{ns}:dead"

        async def finished() -> bool:
            done = {(e[2], e[4]) for e in events(log) if e[0] == "done"}
            lettered = {
                (f[b"partition"].decode(), int(f[b"seq"])) for _, f in await manager.client.xrange(dead)
            }
            expected = {(p, s) for p in PARTITIONS for s in range(1, total[p] + 1)}
            return done | lettered >= expected and await group.pending() == 0

        await until(finished, 60, "every message handled or dead-lettered")

        # the survivors found the victim dead and took what it held (claim_after: 1 s)
        async def reaped() -> bool:
            return victim not in await group.alive()

        if not restart:
            await until(reaped, 10, "the victim reaped")
        for name in names:
            if name != victim or restart:
                procs[name].send_signal(signal.SIGTERM)
        for name in names:
            assert procs[name].wait(timeout=30) == (-signal.SIGKILL if name == victim and not restart else 0)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    seen = events(log)
    done = [(e[2], e[4]) for e in seen if e[0] == "done"]
    expected = {(p, s) for p in PARTITIONS for s in range(1, total[p] + 1)} - poison
    assert set(done) == expected
    # handled twice: only what the killed process had handled but not acknowledged
    twice = {m for m in done if done.count(m) > 1}
    by_victim = {(e[2], e[4]) for e in seen if e[1] == victim}
    assert twice <= by_victim
    _in_order(seen, victim)
    letters = [f for _, f in await manager.client.xrange(f"{ns}:dead")]
    assert {(f[b"partition"].decode(), int(f[b"seq"])) for f in letters} == poison
    for fields in letters:
        assert int(fields[b"deliveries"]) >= 3 and fields[b"group"] == b"g"
        reason = fields[b"reason"].decode()
        assert reason == "ValueError: poison poison" or "without an acknowledgement" in reason
    assert await group.pending() == 0
    assert set((await group.leftovers()).values()) == {0}
    assert {e[1] for e in seen if e[0] == "done"} == set(names)  # all three took work


def _running(seen: list[list[Any]], name: str) -> bool:
    """Whether ``name`` is inside a handler (its last event a start)."""
    own = [e for e in seen if e[1] == name]
    return bool(own) and own[-1][0] == "start"


def _in_order(seen: list[list[Any]], victim: str) -> None:
    """Per document: runs never overlap (but the victim's last one, cut by the
    kill), and the seqs handled go up (a seq again only right after itself: a
    retry, or a redelivery after the kill)."""
    state: dict[tuple[str, str], tuple[str, int] | None] = {}
    last: dict[tuple[str, str], int] = {}
    for event, name, partition, key, seq, _ in seen:
        doc = (partition, key)
        if event == "start":
            running = state.get(doc)
            assert running is None or running[0] == victim, f"{doc} seq {seq} started while {running} ran"
            assert seq >= last.get(doc, 0), f"{doc}: seq {seq} after {last[doc]}"
            state[doc], last[doc] = (name, seq), seq
        elif state.get(doc) == (name, seq):  # done, or failed
            state[doc] = None


async def _messages(manager: DataManager) -> list[dict[str, Any]]:
    out = []
    for partition in PARTITIONS:
        for _, fields in await manager.client.xrange(manager.layout.stream(partition)):
            out.append(orjson.loads(fields[b"m"]))
    return out


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _true(value: bool) -> bool:
    return value
