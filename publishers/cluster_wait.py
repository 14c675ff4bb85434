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

The checkpoint, on whatever node its key's slot lives, is confirmed the
same way (``checkpoint_durable``): a marker in its slot, then WAIT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rex
from redis.asyncio.cluster import ClusterNode, RedisCluster

from publishers import redis_calls
from publishers.connection import RedisClient
from publishers.durability import Acknowledgements
from publishers.errors import RedisUnavailable
from publishers.layout import Layout

Reply = Any
# the slot is served elsewhere (or by nobody): the client's slot map is stale
_MOVED = (rex.AskError, rex.ClusterDownError, rex.TryAgainError)
Command = tuple[Any, ...]


async def send_waited(
    client: RedisCluster,
    commands: Sequence[tuple[Command, str]],
    acks: Acknowledgements,
    url: str,
) -> list[Reply]:
    """``commands``: (the call's command, its WAIT marker key), the command's
    second-after-name argument being its key count and the next its first key.
    Replies (error replies in their slot) in order."""
    await redis_calls.call(client.initialize(), url)
    groups: dict[str, tuple[ClusterNode, list[int]]] = {}
    for index, (command, _marker) in enumerate(commands):
        node = client.get_node_from_key(command[3])
        if node is None:  # no node serves the slot (yet)
            _refresh(client)
            raise RedisUnavailable(f"Redis is unavailable: no cluster node serves the slot of {command[3]!r}")
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
    """After ``table``'s checkpoint was written, on a cluster with
    ``redis.durability``: a marker in its slot, then WAIT, on the node owning
    it (apart from the documents' nodes: a failover of that node must not
    take back a checkpoint a source was told of). Too few replicas:
    ``RedisUnavailable`` (the checkpoint is written again later)."""
    if not (acks.on and isinstance(client, RedisCluster)):
        return  # a single server's next apply round's WAIT covers it
    await redis_calls.call(client.initialize(), url)
    key = layout.checkpoint(table)
    node = client.get_node_from_key(key)
    if node is None:
        _refresh(client)
        raise RedisUnavailable(f"Redis is unavailable: no cluster node serves the slot of {key!r}")
    marker = layout.checkpoint_wait_marker(table)
    await _node_round(client, node, [], marker, acks, url, what="the checkpoint", then="it is written again")


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
    the commands' replies once WAIT counted enough replicas."""
    sent = [*commands, *acks.marked(marker)]
    conn = node.acquire_connection()
    try:
        for command in sent:
            await conn.send_command(*command)
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
    acks.judge(replies[len(commands) :], what, then)
    return replies[: len(commands)]


def _refresh(client: RedisCluster) -> None:
    """Read the slot map again before the client's next command (what redis-py
    itself does on a connection error: its private flag, no public call)."""
    client._initialize = True
