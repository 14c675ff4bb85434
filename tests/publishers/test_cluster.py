"""What only a Redis Cluster shows: a partition's keys share one slot (so one
script call may touch them all), a batch fans out to every master, a script
flushed on one node is re-loaded, and messages go out with SPUBLISH."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import orjson
import pytest
from redis._parsers.helpers import parse_cluster_nodes
from redis.asyncio.cluster import RedisCluster

from cdc.config import RedisConfig
from cdc.devservers import RedisCluster as DevCluster
from cdc.devservers import free_port
from cdc.errors import ConnectError
from publishers import control, scripts
from publishers.errors import RedisUnavailable
from publishers.failover import serving_primaries
from publishers.leases import Leases
from publishers.manager import DataManager
from publishers.model import Change
from tests.e2e import wait_for

pytestmark = pytest.mark.cluster


def change(partition: str, section: str, key: str, version: int, *, delete: bool = False) -> Change:
    values = None if delete else {"Id": orjson.dumps(int(key)), "Name": orjson.dumps(f"n{key}")}
    return Change(f"dbo.{section}", partition, section, key, "D" if delete else "U", version, values)


@pytest.fixture
async def manager(redis_cluster_url: str, namespace: str) -> AsyncIterator[DataManager]:
    config = RedisConfig(url=redis_cluster_url, cluster=True, namespace=namespace)
    manager = await DataManager.connect(config)
    assert isinstance(manager.client, RedisCluster)
    yield manager
    await manager.close()


async def test_a_partitions_keys_share_one_slot(manager: DataManager) -> None:
    partition = "region:{7}"
    changes = [change(partition, s, str(k), 10 + k) for s in ("alpha", "beta") for k in range(5)]
    await manager.apply([*changes, change(partition, "alpha", "2", 99, delete=True)])
    layout = manager.layout
    keys = [layout.seq(partition), layout.stream(partition), layout.channel(partition, "alpha")]
    keys += [layout.index(partition, s) for s in ("alpha", "beta")]
    keys += [layout.document(partition, c.section, c.key) for c in changes]
    slots = {await manager.client.cluster_keyslot(key) for key in keys}
    assert len(slots) == 1


async def test_a_batch_fans_out_to_every_master(manager: DataManager) -> None:
    partitions = [f"p{i}" for i in range(24)]
    client = manager.client
    assert isinstance(client, RedisCluster)
    nodes = {client.get_node_from_key(manager.layout.seq(p)).name for p in partitions}
    assert len(nodes) == 3
    result = await manager.apply([change(p, "alpha", str(k), k + 1) for p in partitions for k in range(3)])
    assert result.published == 72
    assert result.seqs == {p: 3 for p in partitions}
    for partition in partitions:
        assert len(await manager.documents(partition, "alpha")) == 3


async def test_a_script_missing_on_one_node_is_loaded_again(manager: DataManager) -> None:
    client = manager.client
    assert isinstance(client, RedisCluster)
    partitions = [f"q{i}" for i in range(12)]
    await manager.apply([change(p, "alpha", "1", 1) for p in partitions])
    node = client.get_node_from_key(manager.layout.seq(partitions[0]))
    await client.execute_command("SCRIPT FLUSH", target_nodes=node)
    assert await client.execute_command("SCRIPT EXISTS", scripts.APPLY.sha, target_nodes=node) == [0]
    result = await manager.apply([change(p, "alpha", "1", 2, delete=True) for p in partitions])
    assert result.published == 12


async def test_messages_go_out_on_shard_channels(manager: DataManager) -> None:
    client = manager.client
    assert isinstance(client, RedisCluster)
    channels = [manager.layout.channel(p, "alpha") for p in ("s1", "s2", "s3")]
    pubsub = client.pubsub()
    await pubsub.ssubscribe(*channels)
    try:
        await manager.apply([change(p, "alpha", "1", 5) for p in ("s1", "s2", "s3")])
        received = set()
        for _ in range(50):
            message = await pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                received.add(orjson.loads(message["data"])["partition"])
            if received == {"s1", "s2", "s3"}:
                break
        assert received == {"s1", "s2", "s3"}
    finally:
        await pubsub.aclose()


async def test_leases_and_the_worker_registry_work_on_a_cluster(manager: DataManager) -> None:
    """The lease round's pipelines span slots (one lease key per table, the
    registry, the heartbeats): every call of it on a 3-master cluster."""
    tables = [f"s.t{i}" for i in range(12)]  # keys on several masters
    leases = Leases(manager, "w1", ttl=30)
    tokens = [await leases.acquire(t) for t in tables]
    assert all(token is not None for token in tokens)
    assert await leases.renew_all(tables) == dict.fromkeys(tables, True)
    assert await Leases(manager, "w2", ttl=30).renew_all(tables[:3]) == dict.fromkeys(tables[:3], False)
    await control.request_snapshot(manager, tables[5])
    stored = await control.snapshot_request(manager, tables[5])
    assert stored is not None and await control.snapshot_requests(manager, tables) == {tables[5]: stored}
    await control.request_failover_snapshots(manager, tables)
    requests = await control.snapshot_requests(manager, tables)
    assert set(requests) == set(tables) and all(
        r.startswith(control.FAILOVER_REQUEST) for r in requests.values()
    )
    for table in tables:
        await control.clear_snapshot_request(manager, table, requests[table])
    assert await control.snapshot_requests(manager, tables) == {}
    await manager.heartbeat("w1", {"tables": ",".join(tables)}, ttl=30)
    assert await control.keep_alive(manager, "w1", 30)
    assert await control.live_workers(manager) == {"w1"}
    assert [w["id"] for w in await control.workers(manager)] == ["w1"]
    await control.remove_heartbeat(manager, "w1")
    assert await control.live_workers(manager) == set()


async def test_a_batch_of_many_partitions_is_not_refused_by_the_pool(manager: DataManager) -> None:
    """400 one-change partitions, about 133 per node: sent as one call each on
    a connection each, redis-py's cluster client (100 connections per node)
    refused the rest with MaxConnectionsError on every try; the calls are
    pipelined per node on one connection (``cluster_wait.send_waited``)."""
    changes = [change(f"m{k}", "items", "1", 1) for k in range(400)]
    assert (await manager.apply(changes)).published == 400


@pytest.mark.timeout(120)
async def test_a_node_down_is_redis_unavailable_and_the_client_recovers(namespace: str) -> None:
    """A dead node's commands fail as ``RedisUnavailable`` (forget_seen used to
    let redis-py's own error through: its DEL went as a cluster pipeline, which
    closed the whole client on the connection error), and once the node is
    back the same manager works again."""
    cluster = DevCluster().start()
    try:
        config = RedisConfig(url=cluster.nodes[1].url, cluster=True, namespace=namespace)
        async with await DataManager.connect(config) as manager:
            partitions = [f"p{i}" for i in range(24)]
            await manager.apply([change(p, "alpha", "1", 1) for p in partitions])
            cluster.nodes[0].kill()
            with pytest.raises(RedisUnavailable):
                await manager.forget_seen("alpha")
            with pytest.raises(RedisUnavailable):
                await manager.apply([change(p, "alpha", "1", 2) for p in partitions])
            cluster.nodes[0].start()  # empty, its slots kept in nodes.conf

            async def works() -> bool:
                try:
                    await manager.forget_seen("alpha")
                    return (
                        await manager.apply([change(p, "alpha", "1", 3) for p in partitions])
                    ).published > 0
                except RedisUnavailable:
                    return False

            await wait_for(works, 60, "the cluster to serve every slot again")
    finally:
        cluster.cleanup()


def test_a_slot_claimed_twice_belongs_to_the_higher_config_epoch() -> None:
    """What the failover check reads in one node's ``CLUSTER NODES``: the
    killed primary restarted (a) still claims its slots at its old epoch, the
    promoted replica (b) at a new one; a failed primary with no slot left (f)
    and a replica own nothing."""
    view = "\n".join(
        [
            "a 127.0.0.1:1@11 myself,master - 0 0 1 connected 0-5460",
            "b 127.0.0.1:2@12 master - 0 0 7 connected 0-5460",
            "c 127.0.0.1:3@13 master - 0 0 2 connected 5461-10922 10923",
            "d 127.0.0.1:4@14 master - 0 0 3 connected 10924-16383",
            "e 127.0.0.1:5@15 slave d 0 0 3 connected",
            "f 127.0.0.1:6@16 master,fail - 0 0 1 disconnected",
        ]
    )
    assert serving_primaries(parse_cluster_nodes(view)) == (frozenset({"b", "c", "d"}), 7)


async def test_more_cluster_nodes_find_the_cluster_when_the_urls_node_does_not_answer(
    redis_cluster_url: str, namespace: str
) -> None:
    """The url's node died or is being replaced: a sidecar starting meanwhile
    finds the cluster through ``redis.cluster_nodes`` (a stranger's pass: every
    command exited 3 while the rest of the cluster served)."""
    live = urlsplit(redis_cluster_url)
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with pytest.raises(ConnectError):
        gone = await DataManager.connect(RedisConfig(url=dead, cluster=True, namespace=namespace))
        await gone.close()
    seeded = RedisConfig(
        url=dead,
        cluster=True,
        namespace=namespace,
        cluster_nodes=((str(live.hostname), int(live.port or 0)),),
    )
    manager = await DataManager.connect(seeded)
    try:
        await manager.apply([change("p1", "s", "7", 1)])
        assert await manager.client.hget(manager.layout.document("p1", "s", "7"), "@v") == b"1"
    finally:
        await manager.close()
