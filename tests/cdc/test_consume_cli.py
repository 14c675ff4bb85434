"""``cdc consume`` as a user runs it: two processes of one group print each
message once between them, each document in seq order; SIGTERM stops them with exit code 0; bad
options exit 2."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cdc.config import RedisConfig
from cdc.consume import dead_letter_name
from publishers.manager import DataManager
from publishers.model import Change
from tests.e2e import cdc, config_text, wait_for


@pytest.fixture
def config_path(tmp_path: Path, redis_url: str, namespace: str, postgres_dsn: str) -> Path:
    path = tmp_path / "tables.yaml"
    path.write_text(config_text("public", postgres_dsn, redis_url, namespace), encoding="utf-8")
    return path


async def test_two_consume_processes_print_each_message_once(
    config_path: Path, redis_url: str, namespace: str
) -> None:
    manager = await DataManager.connect(RedisConfig(url=redis_url, namespace=namespace))

    async def write(round_: int) -> None:  # 20 documents, one change each, in partition "p1"
        await manager.apply(
            [
                Change("dbo.t", "p1", "items", f"k{i}", "U", round_ * 100 + i, {"n": orjson.dumps(round_)})  # type: ignore[arg-type]
                for i in range(20)
            ]
        )

    await write(0)  # the partition exists before the consumers look for it
    out = [config_path.with_name(f"out{i}.jsonl") for i in range(2)]
    procs = []
    for i in range(2):
        with out[i].open("wb") as stdout:  # the child has its own copy
            command = [
                sys.executable,
                "-m",
                "cdc.cli",
                "consume",
                "-c",
                str(config_path),
                "--group",
                "printer",
            ]
            procs.append(
                subprocess.Popen(
                    [*command, "--section", "items", "--consumer", f"p{i}"],
                    stdout=stdout,
                    stderr=subprocess.DEVNULL,
                )
            )
    alive = f"{manager.layout.prefix('p1')}@group:printer:alive"

    async def both_reading() -> bool:
        return set(await manager.client.hkeys(alive)) == {b"p0", b"p1"}

    try:
        await wait_for(both_reading, 30, "both consumers reading")
        for round_ in (1, 2):
            await write(round_)

        async def printed() -> bool:
            return sum(len(path.read_bytes().splitlines()) for path in out) >= 60

        await wait_for(printed, 30, "60 messages printed")
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(timeout=30) for proc in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await manager.close()
    messages = [orjson.loads(line) for path in out for line in path.read_bytes().splitlines()]
    assert sorted(m["seq"] for m in messages) == list(range(1, 61))
    for path in out:  # what each process printed of a document, it printed in seq order
        printed = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        for key in {m["key"] for m in printed}:
            seqs = [m["seq"] for m in printed if m["key"] == key]
            assert seqs == sorted(seqs)


async def test_consume_stops_when_its_stdout_is_closed_leaving_the_message_pending(
    config_path: Path, redis_url: str, namespace: str
) -> None:
    """``cdc consume | head -n 2``: once the reader is gone, the messages it
    cannot print stay pending (not dead-lettered, no delivery counted as a
    failure) and it exits 0, as after SIGTERM."""
    manager = await DataManager.connect(RedisConfig(url=redis_url, namespace=namespace))
    changes = [
        [Change("dbo.t", "p1", "items", f"k{i}", "U", r * 100 + i, {"n": orjson.dumps(r)}) for i in range(20)]  # type: ignore[arg-type]
        for r in range(2)
    ]
    await manager.apply(changes[0])
    command = [sys.executable, "-m", "cdc.cli", "--text-logs", "consume", "-c", str(config_path)]
    proc = subprocess.Popen(
        [*command, "--group", "head", "--section", "items"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = [proc.stdout.readline() for _ in range(2)]
        proc.stdout.close()  # as head -n 2 exits
        await manager.apply(changes[1])  # messages it cannot print
        assert proc.wait(timeout=30) == 0
        stderr = proc.stderr.read().decode()
        stream = manager.layout.stream("p1")
        pending = await manager.client.xpending_range(stream, "head", "-", "+", 100)
        dead = await manager.client.xlen(dead_letter_name(namespace, "head"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        await manager.close()
    assert [orjson.loads(line)["seq"] for line in first] == [1, 2]
    assert "Traceback" not in stderr and "stdout is closed" in stderr
    assert dead == 0
    assert pending, "what it could not print stays pending"
    assert all(p["times_delivered"] == 1 for p in pending), pending
    assert min(int(p["message_id"].split(b"-")[0]) for p in pending) > 2  # the two read were acknowledged


async def test_consume_reports_a_vanished_stream_once_and_goes_on(
    config_path: Path, redis_url: str, namespace: str
) -> None:
    """The partition's stream deleted under ``cdc consume`` (Redis restarted
    empty): one report on stderr, no exit; the messages written after are printed."""
    manager = await DataManager.connect(RedisConfig(url=redis_url, namespace=namespace))
    write = [Change("dbo.t", "p1", "items", "k", "U", v, {"n": orjson.dumps(v)}) for v in (1, 2)]  # type: ignore[arg-type]
    await manager.apply(write[:1])
    out = config_path.with_name("out.jsonl")
    command = [sys.executable, "-m", "cdc.cli", "--text-logs", "consume", "-c", str(config_path)]
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [*command, "--group", "g", "--section", "items"], stdout=stdout, stderr=subprocess.PIPE
        )
    try:

        async def printed(n: int) -> bool:
            return len(out.read_bytes().splitlines()) >= n

        await wait_for(lambda: printed(1), 30, "the first message printed")
        await manager.client.delete(manager.layout.stream("p1"))
        await asyncio.sleep(2)  # two `block`s without the stream (the sidecar re-snapshotting)
        assert proc.poll() is None, "it went on"
        await manager.apply(write[1:])
        await wait_for(lambda: printed(2), 30, "the message written after printed")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        await manager.close()
    assert stderr.count("lost messages in partition p1 (all)") == 1, stderr
    assert [orjson.loads(line)["seq"] for line in out.read_bytes().splitlines()] == [1, 2]


def test_consume_refuses_a_bad_group_name(config_path: Path) -> None:
    result = cdc("consume", "-c", str(config_path), "--group", "bad group", "--section", "items")
    assert result.returncode == 2, result.stderr
    assert "group name" in result.stderr


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--section", "prodcts", "did you mean 'products'?"),
        ("--partition", "shopp", "did you mean 'shop'?"),
    ],
)
async def test_consume_refuses_a_section_or_partition_never_written(
    config_path: Path, redis_url: str, namespace: str, option: str, value: str, said: str
) -> None:
    """A typo is exit 2 with a "did you mean", as for ``cdc subscribe``, and
    nothing is written to Redis (no stream, no group, no liveness key)."""
    manager = await DataManager.connect(RedisConfig(url=redis_url, namespace=namespace))
    try:
        await manager.apply([Change("dbo.t", "shop", "products", "k", "U", 1, {"n": b"1"})])  # type: ignore[arg-type]
        before = sorted(await manager.client.keys(f"{namespace}*"))
        result = cdc("consume", "-c", str(config_path), "--group", "g1", option, value)
        after = sorted(await manager.client.keys(f"{namespace}*"))
    finally:
        await manager.close()
    assert result.returncode == 2, result.stderr
    assert said in result.stderr and value in result.stderr
    assert after == before
