"""``cdc consume`` as a user runs it: two processes of one group print each
message once between them, each document in seq order; SIGTERM stops them with exit code 0; bad
options exit 2."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cdc.config import RedisConfig
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


def test_consume_refuses_a_bad_group_name(config_path: Path) -> None:
    result = cdc("consume", "-c", str(config_path), "--group", "bad group", "--section", "items")
    assert result.returncode == 2, result.stderr
    assert "group name" in result.stderr
