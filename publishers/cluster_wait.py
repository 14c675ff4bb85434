"""``redis.durability`` on a Redis Cluster: WAIT on every node that took writes.

WAIT counts the replicas that have the replication stream up to the last
write of its own connection, on its own node. On a cluster each apply call
goes to the node owning its partition's slot, so a round is sent per node:
that node's ``EVALSHA`` calls, a write of the ``ns:{p}:@wait`` marker (one
of the node's partitions; the calls may all have been stale no-ops, which
write nothing) and ``WAIT``, pipelined on one connection of that node.
Routing the calls through the cluster client and WAITing afterwards on a
connection chosen again would race a failover: a call answered by the old
primary and a WAIT answered by the promoted replica (which may lack the call)
would count the call as safe.

A call refused with ``MOVED``/``ASK`` (the slot moved: a failover) or a node
that does not answer fails the whole round with ``RedisUnavailable`` (the
batch is retried, its checkpoint held) and makes the client read the slot
map again before its next command.

The other writes whose loss matters (the checkpoint, a snapshot page and its
``R`` marker, the partitions sets, the dead letter, a lease's fencing token,
the ``@seen`` sets a snapshot drops) are confirmed after the fact by
``confirm``: on each node serving one of their keys (the single server
behind Sentinel: on it), a marker in one of those keys' slots, then WAIT,
pipelined on one connection. A node's replication stream is ordered, so a
WAIT that covers the marker covers every write the node took before it, on
any connection. The race ``send_waited`` avoids remains here and is narrow:
a write answered by the old primary and its ``confirm`` by the promoted
replica, whose own replicas acknowledged the marker, needs the whole
failover (the cluster's node timeout, 5 s in the tests, and a replica
re-attached) to fit between two consecutive commands of one task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from redis import exceptions as rex
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from publishers import redis_calls
from publishers.connection import RedisClient
from publishers.durability import Acknowledgements
from publishers.errors import RedisUnavailable
from publishers.layout import Layout
from publishers.settings import Durability

Reply = Any
# the slot is served elsewhere (or by nobody): the client's slot map is stale
_MOVED = (rex.AskError, rex.ClusterDownError, rex.TryAgainError)
Command = tuple[Any, ...]
NO_WAIT = Acknowledgements(Durability(), Layout("cdc"))  # send_waited without WAIT


async def send_waited(
    client: RedisCluster,
    commands: Sequence[tuple[Command, str]],
    acks: Acknowledgements,
    url: str,
) -> list[Reply]:
    """``commands``: (the call's command, its WAIT marker key), the command's
    second-after-name argument being its key count and the next its first key.
    Replies (error replies in their slot) in order. ``acks`` off (``NO_WAIT``):
    the same rounds without marker and WAIT, which is how every script call
    on a cluster is sent: one connection per node, not one per call, since
    redis-py's pool refuses the 101st connection to a node (MaxConnectionsError,
    a snapshot page of 1,000 one-row partitions on every try)."""
    await redis_calls.call(client.initialize(), url)
    groups: dict[str, tuple[ClusterNode, list[int]]] = {}
    for index, (command, _marker) in enumerate(commands):
        node = client.get_node_from_key(command[3])
        if node is None:  # no node serves the slot (yet)
            _refresh(client)
            key = command[3]
            shown = key.decode(errors="replace") if isinstance(key, bytes) else key
            raise RedisUnavailable(f"Redis is unavailable: no cluster node serves the slot of {shown!r}")
        groups.setdefault(node.name, (node, []))[1].append(index)
    rounds = [
        _node_round(client, node, [commands[i][0] for i in indexes], commands[indexes[0]][1], acks, url)
        for node, indexes in groups.values()
    ]
    done = await asyncio.gather(*rounds, return_exceptions=True)
    replies: list[Reply] = [None] * len(commands)
    for (_node, indexes), result in zip(groups.values(), done, strict=True):
        if isinstance(result, BaseException):
            raise result
        for index, reply in zip(indexes, result, strict=True):
            replies[index] = reply
    return replies


async def checkpoint_durable(
    client: RedisClient, layout: Layout, table: str, acks: Acknowledgements, url: str
) -> None:
    """After ``table``'s checkpoint was written, with ``redis.durability``:
    ``confirm`` on the node owning it (apart from the documents' nodes on a
    cluster: a failover of that node must not take back a checkpoint a
    source was told of). Too few replicas: ``RedisUnavailable`` (the
    checkpoint is written again later)."""
    what, then = "the checkpoint", "it is written again"
    await confirm(client, [layout.checkpoint(table)], acks, url, what=what, then=then)


async def confirm(
    client: RedisClient,
    keys: Iterable[str],
    acks: Acknowledgements,
    url: str,
    *,
    what: str,
    then: str = "it is retried",
) -> None:
    """With ``redis.durability``, once ``keys`` were written (on any
    connection): a marker in one of their slots and WAIT, on every node
    serving one of them (a single server: once). Too few replicas, or a node
    that fails or moved a slot: ``RedisUnavailable`` naming ``what`` (the
    caller retries the write, which must be idempotent)."""
    keys = list(keys)
    if not (acks.on and keys):
        return
    namespace = acks.layout.namespace
    if not isinstance(client, RedisCluster):
        pipe = client.pipeline(transaction=False)
        for command in acks.marked(marker_for(namespace, keys[0])):
            pipe.execute_command(*command)
        acks.judge(await redis_calls.execute(pipe, url, raise_on_error=False), what, then)
        return
    await redis_calls.call(client.initialize(), url)
    nodes: dict[str, tuple[ClusterNode, str]] = {}
    for key in keys:
        node = client.get_node_from_key(key)
        if node is None:
            _refresh(client)
            raise RedisUnavailable(f"Redis is unavailable: no cluster node serves the slot of {key!r}")
        nodes.setdefault(node.name, (node, key))
    rounds = [
        _node_round(client, node, [], marker_for(namespace, key), acks, url, what=what, then=then)
        for node, key in nodes.values()
    ]
    for result in await asyncio.gather(*rounds, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


async def transaction(client: RedisCluster, key: str, commands: Sequence[Command], url: str) -> Reply:
    """MULTI, ``commands`` (all in ``key``'s slot), EXEC on the node owning
    that slot; EXEC's reply. Not redis-py's cluster transaction pipeline
    (8.1): it runs each queued command at once in a thread of its own with
    ``asyncio.run``, blocking our event loop meanwhile and using the
    client's connections from that other loop (a SIGKILLed primary: the
    sidecar silent for 160 s, "attached to a different loop", unclosed
    sockets)."""
    await redis_calls.call(client.initialize(), url)
    node = client.get_node_from_key(key)
    if node is None:
        _refresh(client)
        raise RedisUnavailable(f"Redis is unavailable: no cluster node serves the slot of {key!r}")
    replies = await _node_round(client, node, [("MULTI",), *commands, ("EXEC",)], "", NO_WAIT, url)
    for reply in replies:
        if isinstance(reply, BaseException):
            raise redis_calls.translate(reply, url)
    return replies[-1]


def marker_for(namespace: str, key: str) -> str:
    """A ``@wait`` marker key in ``key``'s slot: ``ns:@wait:{<key's hash tag,
    or the whole key>}``; for a key whose braces defeat that, a searched tag."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    tag = key[start + 1 : end] if start >= 0 and end > start + 1 else key
    marker = f"{namespace}:@wait:{{{tag}}}"
    if key_slot(marker.encode()) == key_slot(key.encode()):
        return marker
    return f"{namespace}:@wait:{{{_tag_of_slot(key_slot(key.encode()))}}}"


@lru_cache(maxsize=1024)
def _tag_of_slot(slot: int) -> str:
    """The first decimal number whose CRC16 names ``slot`` (~16,000 tries, a few ms)."""
    number = 0
    while key_slot(str(number).encode()) != slot:
        number += 1
    return str(number)


async def _node_round(
    client: RedisCluster,
    node: ClusterNode,
    commands: list[Command],
    marker: str,
    acks: Acknowledgements,
    url: str,
    *,
    what: str = "the apply calls",
    then: str = "the batch is retried",
) -> list[Reply]:
    """The commands, the marker and WAIT pipelined on one connection of ``node``;
    the commands' replies once WAIT counted enough replicas. Without
    ``redis.durability``: the commands alone, still on one connection (one
    per node a round, however many calls: see ``send_waited``)."""
    sent = [*commands, *acks.marked(marker)] if acks.on else list(commands)
    try:
        conn = node.acquire_connection()
    except rex.ConnectionError as exc:  # MaxConnectionsError: rounds of other tasks hold the pool
        raise redis_calls.translate(exc, url) from None
    try:
        await conn.send_packed_command(conn.pack_commands(sent))
        replies: list[Reply] = []
        for _ in sent:
            try:
                replies.append(await conn.read_response())
            except rex.ResponseError as exc:
                replies.append(exc)
    except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
        await conn.disconnect()
        _refresh(client)
        raise redis_calls.translate(exc, url) from None
    except BaseException:
        await conn.disconnect()  # cancelled half-way: the replies left would go to the next user
        raise
    finally:
        node.release(conn)
    moved = [reply for reply in replies if isinstance(reply, _MOVED)]
    if any(isinstance(reply, BaseException) for reply in replies[len(commands) :]):
        _refresh(client)  # e.g. WAIT refused by a node that is a replica now
    if moved:
        _refresh(client)
        raise RedisUnavailable(f"Redis is unavailable: cluster node {node.name}: {moved[0]}")
    if acks.on:
        acks.judge(replies[len(commands) :], what, then)
    return replies[: len(commands)]


def _refresh(client: RedisCluster) -> None:
    """Read the slot map again before the client's next command (what redis-py
    itself does on a connection error: its private flag, no public call)."""
    client._initialize = True
