"""Every Lua script cdc-sync runs, and the one way they are run.

Each script is a file of ``publishers/lua`` (package data, so it ships in the
wheel), read once at import with its SHA-1. A script is sent as ``EVALSHA``
(only its name travels, not its text: ``apply.lua`` is large and runs for
every chunk); when the server does not know it (``NOSCRIPT``: restarted,
failed over, ``SCRIPT FLUSH``), it is loaded and the refused calls are sent
once more. On a cluster the load goes to the node that owns the first key's
slot, the node that refused: redis-py's cluster client routes ``EVALSHA`` by
that key, and script caches are per node.

Errors go through ``publishers.redis_calls``: ``run`` raises its mapped
errors; ``run_many`` leaves the errors a script answered with in their slot
(the apply path bisects content errors) and raises the others.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster

from publishers import cluster_wait, redis_calls
from publishers.connection import RedisClient
from publishers.errors import CdcError

C = TypeVar("C")
Reply = Any  # a decoded Redis reply, or the exception a slot holds
Call = tuple[Sequence[Any], Sequence[Any]]  # (KEYS, ARGV) of one script call


@dataclass(frozen=True)
class Script:
    """One Lua file: its name (the file's stem), text and SHA-1."""

    name: str
    text: bytes
    sha: str


def _read(name: str) -> Script:
    """``publishers/lua/<name>.lua`` through importlib.resources, so that it
    reads the same from a source tree, an installed wheel or a zip."""
    text = resources.files("publishers").joinpath("lua", f"{name}.lua").read_bytes()
    return Script(name, text, hashlib.sha1(text).hexdigest())  # Redis names scripts by SHA-1


APPLY = _read("apply")
FENCED_CHECKPOINT = _read("fenced_checkpoint")
STALE_KEYS = _read("stale_keys")
LOAD_PARTITION = _read("load_partition")
REGISTER_WORKER = _read("register_worker")
LIVE_WORKERS = _read("live_workers")
LEASE_ACQUIRE = _read("lease_acquire")
LEASE_RENEW = _read("lease_renew")
LEASE_RELEASE = _read("lease_release")
BULK_LOAD = _read("bulk_load")
BULK_MARKER = _read("bulk_marker")
FENCE_RAISE = _read("fence_raise")
FIELD_CLEAR = _read("field_clear")
CONSUME_CREATE = _read("consume_create")  # consumer groups: publishers/consumer_group.py
CONSUME_TAKE = _read("consume_take")
CONSUME_ACK = _read("consume_ack")
CONSUME_RETRY = _read("consume_retry")
CONSUME_BEAT = _read("consume_beat")

REGISTRY: dict[str, Script] = {
    script.name: script
    for script in (
        APPLY,
        FENCED_CHECKPOINT,
        STALE_KEYS,
        LOAD_PARTITION,
        REGISTER_WORKER,
        LIVE_WORKERS,
        LEASE_ACQUIRE,
        LEASE_RENEW,
        LEASE_RELEASE,
        BULK_LOAD,
        BULK_MARKER,
        FENCE_RAISE,
        FIELD_CLEAR,
        CONSUME_CREATE,
        CONSUME_TAKE,
        CONSUME_ACK,
        CONSUME_RETRY,
        CONSUME_BEAT,
    )
}


async def run(
    client: RedisClient, script: Script, keys: Sequence[Any], args: Sequence[Any], url: str = ""
) -> Any:
    """One call of ``script``: its reply; its errors mapped (``FENCED`` is
    ``LeaseLost``, ``CDCLAYOUT`` a ``CdcError``...)."""
    reply = (await run_many(client, script, [(keys, args)], url))[0]
    if isinstance(reply, BaseException):
        raise redis_calls.translate(reply, url)
    return reply


async def run_many(
    client: RedisClient,
    script: Script,
    calls: Sequence[C],
    url: str = "",
    *,
    send: Callable[[list[C]], Awaitable[list[Reply]]] | None = None,
    keys_of: Callable[[C], Sequence[Any]] | None = None,
) -> list[Reply]:
    """Every call in one round trip, their replies in order; an error a call
    answered with stays in its slot, other failures raise.

    ``send`` (default: ``send_calls``) sends the calls and returns the replies
    or error replies; the calls it was refused with ``NOSCRIPT`` are sent once
    more after loading the script where they were refused (``keys_of`` gives
    a call's KEYS; by default a call is a ``(KEYS, ARGV)`` pair)."""
    sender = send or (lambda batch: send_calls(client, script, batch, url))  # type: ignore[arg-type]
    replies = await sender(list(calls))
    again = [i for i, reply in enumerate(replies) if redis_calls.is_noscript(reply)]
    if again:
        keys = keys_of or _keys
        await load(client, script, url, [keys(calls[i]) for i in again])
        for i, reply in zip(again, await sender([calls[i] for i in again]), strict=True):
            replies[i] = reply
    return replies


def _keys(call: Any) -> Sequence[Any]:
    keys: Sequence[Any] = call[0]
    return keys


async def send_calls(client: RedisClient, script: Script, calls: list[Call], url: str = "") -> list[Reply]:
    """``EVALSHA`` per call, in one round trip: a pipeline on a single server;
    on a cluster (whose pipelines refuse ``EVALSHA``) a pipeline per node on
    one of its connections, each call routed by its first key (a slot that
    moved: ``RedisUnavailable``, retried). Error replies come back in their slot."""
    if isinstance(client, RedisCluster):  # one connection per node (cluster_wait.send_waited)
        commands = [(("EVALSHA", script.sha, len(keys), *keys, *args), "") for keys, args in calls]
        return await cluster_wait.send_waited(client, commands, cluster_wait.NO_WAIT, url)
    if len(calls) == 1:
        return await gathered([_reply(client, script, keys, args, url) for keys, args in calls])
    pipe = client.pipeline(transaction=False)
    for keys, args in calls:
        pipe.evalsha(script.sha, len(keys), *keys, *args)
    replies: list[Reply] = await redis_calls.call(pipe.execute(raise_on_error=False), url)
    return replies  # a slot holds only error replies: a lost link raises from execute


async def _reply(
    client: RedisClient, script: Script, keys: Sequence[Any], args: Sequence[Any], url: str
) -> Reply:
    """One EVALSHA's reply or error reply. The command is made here, not by the
    caller: gather's task may be cancelled before it starts, and a command made
    outside would then be left never awaited (a RuntimeWarning at collection)."""
    return await redis_calls.reply_or_error(client.evalsha(script.sha, len(keys), *keys, *args), url)


async def gathered(replies: Sequence[Awaitable[Reply]]) -> list[Reply]:
    """Await concurrent ``reply_or_error`` calls; the first mapped failure
    (one that is not an error reply) is raised once all have finished."""
    done = await asyncio.gather(*replies, return_exceptions=True)
    for reply in done:
        if isinstance(reply, BaseException) and not redis_calls.is_error_reply(reply):
            raise reply  # already mapped by reply_or_error (or not a Redis error at all)
    return list(done)


async def load(
    client: RedisClient, script: Script, url: str = "", keys: Sequence[Sequence[Any]] = ()
) -> None:
    """``SCRIPT LOAD``: on a cluster, on the nodes owning the slots of
    ``keys``' first keys (those that answered ``NOSCRIPT``), or on every
    primary when no keys are given; on a single server, there."""
    if isinstance(client, RedisCluster) and keys:
        found = (client.get_node_from_key(call_keys[0]) for call_keys in keys)
        nodes = {node.name: node for node in found if node is not None}  # None: slot uncovered
        for node in nodes.values():
            command = client.execute_command("SCRIPT LOAD", script.text, target_nodes=node)
            _check(script, await redis_calls.call(command, url))
        return
    _check(script, await redis_calls.call(client.script_load(script.text), url))


def _check(script: Script, sha: Any) -> None:
    """The server must name the script as we do, or EVALSHA would never find it."""
    sha = sha.decode() if isinstance(sha, bytes) else str(sha)
    if sha != script.sha:
        raise CdcError(f"Redis named {script.name}.lua {sha}, expected {script.sha}")
