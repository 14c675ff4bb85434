"""Dead letters an operator can see, fix and replay: the black-box story
through the command line, on real PostgreSQL and Redis (docs/DEADLETTERS.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from cdc.config import parse_config
from publishers.layout import Layout
from publishers.manager import DataManager
from tests.cdc.test_bad_input import cdc, config_text, sql

ROWS = "create table {s}.odd (id int primary key, d float8, note text)"


def entries(path: Path, *args: str) -> list[dict[str, object]]:
    result = cdc("deadletter", "list", "-c", str(path), "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["entries"]  # type: ignore[no-any-return]


@pytest.mark.timeout(180)
async def test_dead_letters_are_seen_fixed_and_replayed(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    s = pg_schema
    await sql(
        postgres_dsn,
        ROWS.format(s=s),
        f"insert into {s}.odd (id, d, note) select i, i, 'n' from generate_series(1, 6) i",
        f"update {s}.odd set d = 'NaN' where id = 3",  # no JSON number: dead-lettered
        f"update {s}.odd set note = repeat('x', 5000) where id = 4",  # over max_row_bytes
    )
    path = tmp_path / "odd.yaml"
    tables = f"  - table: {s}.odd\n    partition: odd\n    section: odd\n"
    path.write_text(
        config_text(postgres_dsn, redis_url, namespace, s, tables, worker="  max_row_bytes: 2000\n")
    )
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0

    # run --once: done, but with dead letters: exit 4 and a summary on stderr
    first = cdc("run", "--once", "-c", str(path))
    assert first.returncode == 4, first.stdout + first.stderr
    assert f"dead-lettered: {s}.odd: 2 change(s); first: key '3'" in first.stderr
    assert f"cdc deadletter list -c {path}" in first.stderr

    # a second run dead-letters only what it met itself (the summary is the run's)
    await sql(postgres_dsn, f"update {s}.odd set d = 'Infinity' where id = 5")
    second = cdc("run", "--once", "-c", str(path))
    assert second.returncode == 4 and f"{s}.odd: 1 change(s); first: key '5'" in second.stderr
    assert cdc("run", "--once", "-c", str(path)).returncode == 0, "nothing new dead-lettered: 0"

    # list (text and JSON), show, doctor
    listed = entries(path, "--table", f"{s}.odd")
    assert [(e["key"], e["op"]) for e in listed] == [("3", "S"), ("4", "S"), ("5", "U")]
    assert "nan cannot be represented" in str(listed[0]["reason"]).lower()
    assert "over max_row_bytes=2000" in str(listed[1]["reason"])
    text = cdc("deadletter", "list", "-c", str(path))
    assert text.returncode == 0 and str(listed[2]["id"]) in text.stdout and "key='5'" in text.stdout
    assert [e["key"] for e in entries(path, "--limit", "2")] == ["3", "4"]
    assert [e["key"] for e in entries(path, "--after", str(listed[1]["id"]))] == ["5"]
    shown = cdc("deadletter", "show", str(listed[0]["id"]), "-c", str(path), "--json")
    assert json.loads(shown.stdout)["values"] == {"key": {"id": "3"}}
    missing = cdc("deadletter", "show", "1-1", "-c", str(path))
    assert missing.returncode == 1 and "has no entry 1-1" in missing.stderr
    assert cdc("deadletter", "show", "nonsense", "-c", str(path)).returncode == 2
    doctor = json.loads(cdc("doctor", "-c", str(path), "--json").stdout)
    [finding] = [f for f in doctor if f["subject"] == f"{s}.odd" and "dead letter" in f["message"]]
    assert finding["level"] == "warning" and finding["message"].startswith("3 change(s) in the dead letter")

    # fix 3 at the source, delete 5; 4 stays too large: replay applies 3 and 5, 4 goes back
    await sql(postgres_dsn, f"update {s}.odd set d = 3.5 where id = 3", f"delete from {s}.odd where id = 5")
    config = parse_config(path.read_text(), str(path), {})
    client = aioredis.Redis.from_url(redis_url)
    try:
        manager = DataManager(client, config.redis)
        assert (await manager.document("odd", "odd", "5"))["d"] == 5.0  # type: ignore[index]
        replayed = cdc("deadletter", "replay", "-c", str(path))
        assert replayed.returncode == 4, replayed.stdout + replayed.stderr
        assert f"{s}.odd: 2 replayed, 1 back in the dead letter, 0 left" in replayed.stdout
        assert (await manager.document("odd", "odd", "3"))["d"] == 3.5  # type: ignore[index]
        assert await manager.document("odd", "odd", "5") is None, "a row gone at the source is deleted"
        [again] = entries(path)
        assert again["key"] == "4" and "over max_row_bytes=2000" in str(again["reason"])
        assert again["id"] != listed[1]["id"], "it went back as a new entry, with its reason"

        # fixed: replay empties the dead letter
        await sql(postgres_dsn, f"update {s}.odd set note = 'short' where id = 4")
        done = cdc("deadletter", "replay", "-c", str(path), "--table", f"{s}.odd", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["tables"][0]["replayed"] == [again["id"]]
        assert (await manager.document("odd", "odd", "4"))["note"] == "short"  # type: ignore[index]
        assert entries(path) == [] and await client.xlen(Layout(namespace).deadletter()) == 0
        # a replay of a document already newer is a no-op (the apply rule), and the entry goes
        doc_before = await client.hgetall(Layout(namespace).document("odd", "odd", "4"))
        await manager.dead_letter(None, "by hand", table=f"{s}.odd", payload={"key": {"id": "4"}})
        assert cdc("deadletter", "replay", "-c", str(path)).returncode == 0
        doc_after = await client.hgetall(Layout(namespace).document("odd", "odd", "4"))
        assert doc_after[b"note"] == doc_before[b"note"] and entries(path) == []
    finally:
        await client.aclose()


async def test_purge_and_an_entry_whose_key_cannot_be_recovered(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    s = pg_schema
    await sql(postgres_dsn, ROWS.format(s=s))
    path = tmp_path / "odd.yaml"
    tables = f"  - table: {s}.odd\n    partition: odd\n    section: odd\n"
    path.write_text(config_text(postgres_dsn, redis_url, namespace, s, tables))
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    config = parse_config(path.read_text(), str(path), {})
    client = aioredis.Redis.from_url(redis_url)
    try:
        manager = DataManager(client, config.redis)
        await manager.dead_letter(None, "no key at all", table=f"{s}.odd", payload={"something": 1})
        await manager.dead_letter(None, "another table's", table="other.t", payload=None)
        replayed = cdc("deadletter", "replay", "-c", str(path))
        assert replayed.returncode == 4
        assert "its primary key cannot be recovered from the entry" in replayed.stdout
        assert len(entries(path)) == 2, "an entry whose key cannot be told is reported, not dropped"
        usage = cdc("deadletter", "purge", "-c", str(path))
        assert usage.returncode == 2 and "exactly one of --table" in usage.stderr
        assert cdc("deadletter", "purge", "-c", str(path), "--table", "nosuch.t").returncode == 2
        purged = cdc("deadletter", "purge", "-c", str(path), "--table", "other.t")
        assert purged.returncode == 0 and "removed 1 entry" in purged.stdout
        assert [e["table"] for e in entries(path)] == [f"{s}.odd"]
        assert "removed 1 entry" in cdc("deadletter", "purge", "-c", str(path), "--all").stdout
        assert entries(path) == []
    finally:
        await client.aclose()
