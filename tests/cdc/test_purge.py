"""``cdc purge --table T``: what a removed table left in Redis goes, and only that.

The Redis side is set up as sidecars leave it (documents applied under a
lease's token, a checkpoint, dead letters), on a single server and on a
cluster; the command runs as a user runs it. Checked as a user would: every
key of the namespace before and after, a subscriber's replica, the stream.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdc.config import load_config
from cdc.purge_cmd import TOMBSTONE_TTL, Request, purge_table
from publishers import purge, redis_calls
from publishers.connection import RedisClient
from publishers.layout import Layout
from publishers.leases import Leases
from publishers.manager import DataManager
from publishers.model import Change
from publishers.purge import PAGE, purged_key
from publishers.settings import RedisConfig
from publishers.subscriber import Subscriber
from tests.e2e import cdc, wait_for

GONE = "shop.orders"  # the table removed from the config
KEPT = "shop.customers"  # still registered; shares partition "eu" with GONE
OTHER = "shop.other"  # registered by a config that does not register KEPT (another deployment's)


def write_config(path: Path, redis: RedisConfig, *tables: str, lease_ttl: str = "10s") -> Path:
    entries = {
        GONE: '  - table: shop.orders\n    section: orders\n    partition: "{region}"\n',
        KEPT: "  - table: shop.customers\n    section: customers\n    partition: eu\n",
        OTHER: "  - table: shop.other\n    section: other\n    partition: eu\n",
    }
    path.write_text(
        "source:\n  kind: postgres\n  dsn: postgresql://cdc@127.0.0.1:1/unused\n"
        f"redis:\n  url: {redis.url}\n  cluster: {str(redis.cluster).lower()}\n"
        f"  namespace: {redis.namespace}\nworker:\n  health: null\n  lease_ttl: {lease_ttl}\n"
        "tables:\n" + "".join(entries[t] for t in tables),
        encoding="utf-8",
    )
    return path


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


async def write_rows(
    manager: DataManager, table: str, section: str, rows: dict[str, range], *, owner: str = "sidecar-1"
) -> int:
    """Rows applied as a sidecar applies them (under its lease's token), which
    it then gives back; a checkpoint; returns the token."""
    leases = Leases(manager, owner, ttl=30)
    token = await leases.acquire(table)
    assert token is not None
    changes = [
        Change(table, p, section, str(k), "I", 100 + k, {"id": b"%d" % k, "name": b'"n%d"' % k}, fence=token)
        for p, keys in rows.items()
        for k in keys
    ]
    for start in range(0, len(changes), 2000):
        result = await manager.apply(changes[start : start + 2000])
        assert result.applied == len(changes[start : start + 2000])
    await manager.set_checkpoint(table, 100 + max(max(k) for k in rows.values()), "streaming", fence=token)
    await leases.release(table)
    return token


async def dead_letter(manager: DataManager, table: str) -> None:
    fields = {"table": table, "partition": "eu", "section": "x", "key": "1", "op": "U", "reason": "test"}
    await manager.client.xadd(manager.layout.deadletter(), fields)


async def all_keys(client: RedisClient, namespace: str) -> set[str]:
    return {redis_calls.text(k) async for k in client.scan_iter(match=f"{namespace}:*", count=1000)}


async def stream_messages(client: RedisClient, layout: Layout, partition: str) -> list[dict[str, object]]:
    entries = await client.xrange(layout.stream(partition))
    return [json.loads(fields[b"m"]) for _, fields in entries]


async def setup_two_tables(manager: DataManager) -> None:
    """GONE wrote partitions eu (shared with KEPT's section) and us (its own)."""
    await write_rows(manager, KEPT, "customers", {"eu": range(1, 4)})
    await write_rows(manager, GONE, "orders", {"eu": range(1, 6), "us": range(10, 13)})
    await write_rows(manager, KEPT, "customers", {"eu": range(4, 5)})  # after GONE: eu interleaves
    await dead_letter(manager, GONE)
    await dead_letter(manager, KEPT)


async def test_purge_removes_the_tables_keys_and_keeps_what_others_use(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path
) -> None:
    client, layout, ns = manager.client, manager.layout, redis_config.namespace
    await setup_two_tables(manager)
    early = Subscriber(client, ns, "eu", section="orders")  # follows eu as the purge runs
    await early.start()
    late = Subscriber(client, ns, "us", section="orders")  # loaded before, reads after the purge
    await late.start()
    assert len(early.replica["orders"]) == 5 and len(late.replica["orders"]) == 3
    eu_seq = int(await client.get(layout.seq("eu")))
    before = await all_keys(client, ns)

    config = write_config(tmp_path / "cdc.yaml", redis_config, KEPT)
    done = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE)
    assert done.returncode == 0, done.stderr
    assert f"purged {GONE}: 8 document(s) deleted" in done.stdout

    after = await all_keys(client, ns)
    orders_keys = {k for k in before if ":orders:" in k or k.endswith("@index:orders")}
    gone = {
        *orders_keys,
        layout.partitions("orders"),
        layout.checkpoint(GONE),
        layout.seq("us"),
        layout.stream("us"),
        layout.fence("us"),
    }
    # the shared partition's @seq, @stream, @fence and KEPT's keys stay; GONE's fencing counter
    # too, and the purge's token: for fencing (test_after_a_purge_the_old_owner_is_fenced...)
    assert after == (before - gone) | {purged_key(manager, GONE)}
    assert await client.exists(layout.lease_fence(GONE))
    fence = await client.hgetall(layout.fence("eu"))  # its fields are JSON text; GONE's: the purge's token
    assert fence.keys() == {json.dumps(KEPT).encode(), json.dumps(GONE).encode()}
    assert fence[json.dumps(GONE).encode()] == await client.get(purged_key(manager, GONE))
    assert [letter[1][b"table"] for letter in await client.xrange(layout.deadletter())] == [KEPT.encode()]
    # subscribers of the shared partition are told, one delete per document, in seq
    messages = await stream_messages(client, layout, "eu")
    told = [m for m in messages if m["seq"] > eu_seq]
    assert [(m["op"], m["section"], m["table"]) for m in told] == [("D", "orders", GONE)] * 5
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    assert all(m["version"] >= 101 for m in told)  # never below the document's own @v
    await early.poll(block=0.1)
    assert early.replica.get("orders", {}) == {}
    # the unshared partition's stream went with it: a subscriber reading after is reloaded, empty
    await late.poll(block=0.1)
    assert late.replica.get("orders", {}) == {} and late.reloads == 1

    again = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE)
    assert again.returncode == 0 and "nothing of shop.orders is left" in again.stdout


async def test_refused_while_a_live_sidecar_holds_the_table(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path
) -> None:
    client, layout, ns = manager.client, manager.layout, redis_config.namespace
    await setup_two_tables(manager)
    assert await Leases(manager, "sidecar-9", ttl=60).acquire(GONE) is not None
    await manager.heartbeat(
        "sidecar-9", {"heartbeat_at": f"{time.time():.3f}", f"state:{GONE}": "streaming"}, 60
    )
    before = await all_keys(client, ns)
    config = write_config(tmp_path / "cdc.yaml", redis_config, KEPT)

    refused = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE)
    assert refused.returncode == 1
    assert (
        f"refusing to purge {GONE}: sidecar sidecar-9 holds it (state streaming, heartbeat" in refused.stderr
    )
    dry = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE, "--dry-run")
    assert dry.returncode == 1 and "a purge now would be refused" in dry.stdout
    assert await all_keys(client, ns) == before

    # the sidecar died: its lease lingers until its TTL; the purge waits it out
    await client.delete(layout.worker("sidecar-9"))
    await client.pexpire(layout.lease(GONE), 6000)  # longer than the command takes to start
    done = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE)
    assert done.returncode == 0, done.stderr
    assert "which has no heartbeat; waiting up to" in done.stdout
    assert not await client.exists(layout.checkpoint(GONE), layout.lease(GONE), layout.index("us", "orders"))


async def test_dry_run_lists_what_would_go_and_removes_nothing(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path
) -> None:
    await setup_two_tables(manager)
    before = await all_keys(manager.client, redis_config.namespace)
    config = write_config(tmp_path / "cdc.yaml", redis_config, KEPT)
    dry = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert "section orders: 8 document(s) in 2 partition(s), each deleted with a D message" in dry.stdout
    assert any(
        "partition eu: 5 document(s); @seq, @stream kept: also written by customers" in x for x in lines
    )
    assert any("partition us: 3 document(s); @seq, @stream, @fence removed" in x for x in lines)
    assert "1 dead letter(s)" in dry.stdout
    assert await all_keys(manager.client, redis_config.namespace) == before


async def test_a_table_the_config_still_registers_needs_force(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path
) -> None:
    await setup_two_tables(manager)
    config = write_config(tmp_path / "cdc.yaml", redis_config, KEPT, GONE)
    refused = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE)
    assert refused.returncode == 2
    assert "shop.orders is still registered" in refused.stderr and "--force" in refused.stderr
    assert await manager.client.exists(manager.layout.checkpoint(GONE))
    forced = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not await manager.client.exists(
        manager.layout.checkpoint(GONE), manager.layout.index("eu", "orders")
    )


async def test_a_section_redis_cannot_attribute_must_be_named(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path
) -> None:
    """GONE and another removed table both wrote partition eu: Redis cannot
    tell which section is GONE's, so the purge asks rather than guesses."""
    await setup_two_tables(manager)
    await write_rows(manager, "shop.refunds", "refunds", {"eu": range(1, 3)})
    config = write_config(tmp_path / "cdc.yaml", redis_config, KEPT)
    asked = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE)
    assert asked.returncode == 2
    assert "several sections: orders, refunds" in asked.stderr and "--section" in asked.stderr
    wrong = await asyncio.to_thread(
        cdc, "purge", "-c", str(config), "--table", GONE, "--section", "customers"
    )
    assert wrong.returncode == 2 and "written by shop.customers, which" in wrong.stderr
    done = await asyncio.to_thread(cdc, "purge", "-c", str(config), "--table", GONE, "--section", "orders")
    assert done.returncode == 0, done.stderr
    assert await manager.client.scard(manager.layout.index("eu", "refunds")) == 2


@pytest.mark.parametrize("redis_config", ["single"], indirect=True)
async def test_a_purge_killed_half_way_is_finished_by_the_next_one(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path
) -> None:
    """SIGKILLed mid-way (its lease left behind, held by nobody alive), the
    next run waits the lease out and finishes; each document is told once."""
    client, layout = manager.client, manager.layout
    rows = 20_000
    await write_rows(manager, GONE, "orders", {"us": range(0, rows)})
    await write_rows(manager, KEPT, "customers", {"us": range(0, 1)})  # keeps us's stream to count in
    path = write_config(tmp_path / "cdc.yaml", redis_config, KEPT, lease_ttl="2s")
    args = [sys.executable, "-m", "cdc.cli", "purge", "-c", str(path), "--table", GONE]
    killed = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def some_deleted() -> bool:
        return 0 < await client.scard(layout.index("us", "orders")) < rows

    try:
        await wait_for(some_deleted, 60, "the purge to delete some documents")
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
    left = await client.scard(layout.index("us", "orders"))
    assert 0 < left < rows and await client.exists(layout.lease(GONE))  # as a killed process leaves them
    assert not await client.exists(layout.checkpoint(GONE))  # gone first: a sidecar would snapshot afresh

    config = load_config(path)
    assert await purge_table(config, Request(GONE)) == 0
    deletes = [m["key"] for m in await stream_messages(client, layout, "us") if m["op"] == "D"]
    assert sorted(deletes) == sorted(str(k) for k in range(rows))  # each document told once
    left_keys = await all_keys(client, redis_config.namespace)
    # killed between an apply call and its DEL, the first run leaves up to a page of tombstones
    # outside the index (as TABLES.md says): they expire within TOMBSTONE_TTL, nothing else stays
    # but what fencing needs, the counter and the purge's token
    tombstones = [k for k in left_keys if k.startswith(layout.document("us", "orders", ""))]
    assert len(tombstones) <= PAGE
    for key in tombstones:
        assert await client.hget(key, "@del") == b"1" and 0 < await client.pttl(key) <= TOMBSTONE_TTL * 1000
    kept = {layout.lease_fence(GONE), purged_key(manager, GONE)}
    assert {k for k in left_keys if (":orders" in k or GONE in k) and k not in tombstones} == kept


@pytest.mark.parametrize("redis_config", ["single"], indirect=True)
async def test_no_sidecar_can_take_the_table_while_the_purge_runs(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sidecar asks for the table after each page the purge deletes: the
    purge is paused inside its run while it asks, so the answer is the lease
    as the purge holds it (polling from outside raced the purge's last page
    and its release, a CI failure of this test)."""
    await write_rows(manager, GONE, "orders", {"us": range(0, 4000)})
    config = load_config(write_config(tmp_path / "cdc.yaml", redis_config, KEPT))
    sidecar = Leases(manager, "sidecar-2", ttl=30)
    answers: list[int | None] = []
    pages: list[int] = []
    delete_page = purge.Deleter._page

    async def page_then_ask(deleter: purge.Deleter, partition: str, keys: list[str]) -> None:
        pages.append(len(keys))
        await delete_page(deleter, partition, keys)
        answers.append(await sidecar.acquire(GONE))

    monkeypatch.setattr(purge.Deleter, "_page", page_then_ask)
    assert await purge_table(config, Request(GONE)) == 0
    assert len(answers) >= 4000 // PAGE and answers == [None] * len(answers)
    # each apply call holds at most a page (SSCAN's replies hold up to 502 of these 4,000 keys):
    # what bounds the tombstones a killed purge leaves, and a script run
    assert sum(pages) == 4000 and max(pages) <= PAGE
    assert await sidecar.acquire(GONE) is not None  # free once it is done


def test_a_table_name_that_is_not_one_is_a_usage_error(tmp_path: Path) -> None:
    """A name that is not schema.table is a usage error, before Redis is asked."""
    config = write_config(tmp_path / "cdc.yaml", RedisConfig(url="redis://127.0.0.1:1/0"), KEPT)
    bad = cdc("purge", "-c", str(config), "--table", "orders; drop")
    assert bad.returncode == 2 and "not a table name" in bad.stderr


async def test_index_members_without_a_live_document_do_not_stall_the_purge(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path
) -> None:
    """A damaged index (a member whose document was DELeted by hand, or is a
    tombstone) is emptied too: the purge ends, and tells only the live ones."""
    client, layout = manager.client, manager.layout
    token = await write_rows(manager, GONE, "orders", {"us": range(1, 4)})
    await write_rows(manager, KEPT, "customers", {"us": range(0, 1)})  # keeps us's stream to read
    deleted = await manager.apply([Change(GONE, "us", "orders", "3", "D", 200, None, fence=token)])
    assert deleted.published == 1  # 3 is a tombstone now (@v, @del), out of the index
    await client.sadd(layout.index("us", "orders"), "3", "9")  # damaged: 3 back in, 9 never had a document
    await client.delete(layout.document("us", "orders", "2"))  # a manual DEL
    assert await client.hget(layout.document("us", "orders", "3"), "@del") == b"1"
    seq = int(await client.get(layout.seq("us")))

    config = load_config(write_config(tmp_path / "cdc.yaml", redis_config, KEPT))
    # main's purge looped forever here (SCARD never fell): a deadline turns that into a failure
    assert await asyncio.wait_for(purge_table(config, Request(GONE)), 20) == 0
    told = [m for m in await stream_messages(client, layout, "us") if int(str(m["seq"])) > seq]
    assert [(m["op"], m["key"]) for m in told] == [("D", "1")]  # the one live document
    left = await all_keys(client, redis_config.namespace)
    assert not [k for k in left if ":orders" in k]


async def test_after_a_purge_the_old_owner_is_fenced_and_a_new_one_gets_a_higher_token(
    manager: DataManager, redis_config: RedisConfig, tmp_path: Path
) -> None:
    """A sidecar that lost GONE (paused past its lease) and wakes after the
    purge cannot write into the partitions another section keeps, even one
    where GONE had no document left; the table added back gets a token above
    every earlier one, so nothing fences it out."""
    client, layout = manager.client, manager.layout
    await write_rows(manager, KEPT, "customers", {"eu": range(1, 3), "ap": range(1, 3)})
    old = await write_rows(manager, GONE, "orders", {"eu": range(1, 4), "ap": range(1, 2), "us": range(1, 2)})
    gone = await manager.apply([Change(GONE, "ap", "orders", "1", "D", 300, None, fence=old)])
    assert gone.published == 1 and await client.scard(layout.index("ap", "orders")) == 0
    field = json.dumps(GONE)

    config = load_config(write_config(tmp_path / "cdc.yaml", redis_config, KEPT))
    assert await purge_table(config, Request(GONE)) == 0
    purge_token = int(await client.hget(layout.fence("eu"), field))
    assert purge_token > old
    assert int(await client.hget(layout.fence("ap"), field)) == purge_token  # no delete there: raised anyway
    assert await client.exists(layout.lease_fence(GONE))  # the counter stays

    for partition in ("eu", "ap"):
        zombie = Change(GONE, partition, "orders", "7", "I", 999, {"id": b"7", "name": b'"z"'}, fence=old)
        result = await manager.apply([zombie])
        assert result.fenced == [zombie] and result.applied == 0
        assert not await client.exists(layout.document(partition, "orders", "7"))

    # run again, from a config that does not register KEPT: GONE's field left in eu and ap
    # must not make customers look like GONE's section (its documents would go)
    elsewhere = load_config(write_config(tmp_path / "other.yaml", redis_config, OTHER))
    assert await purge_table(elsewhere, Request(GONE)) == 0
    assert await client.scard(layout.index("eu", "customers")) == 2

    readded = await Leases(manager, "sidecar-3", ttl=30).acquire(GONE)
    assert readded is not None and readded > purge_token
    back = await manager.apply(
        [Change(GONE, "eu", "orders", "1", "I", 400, {"id": b"1", "name": b'"n"'}, fence=readded)]
    )
    assert back.applied == 1 and not back.fenced
