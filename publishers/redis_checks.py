"""What ``cdc doctor`` and ``cdc validate`` check of the Redis target beyond
reaching it: that it takes writes, that it has the replicas
``redis.durability`` waits for, and that the ACL user may run what the sidecar
sends.

- **A primary.** A replica answers PING and every read, so it passed
  ``validate`` and ``doctor``; then every write fails (``READONLY You can't
  write against a read only replica``). ``INFO replication`` says ``role:master``
  or ``role:slave``; on a cluster every primary of the client's slot map is
  asked (the nodes it writes to).
- **Enough replicas for ``redis.durability``.** Each primary's ``INFO
  replication`` lists its replicas (``slaveN: ...,state=online``); with fewer
  online than ``replicas``, WAIT never counts enough and every apply call
  there fails after the timeout: ``doctor`` says so as an error, ``validate``
  as a warning (a replica may be resyncing for a moment).
- **The ACL.** ``ACL DRYRUN user command args...`` (Redis 7.0 and later) says
  whether the user may run a command with those keys and channels, without
  running it. It is asked for each command the sidecar sends, from Python and
  from its Lua scripts (a script's ``redis.call`` is checked against the
  caller's ACL), with keys and a channel shaped as the namespace's real ones
  (so ``~ns:*`` key patterns and ``&`` channel patterns count). Skipped, with
  the reason, where the server has no ``ACL DRYRUN`` or the user may not run
  it (``ACL`` is an ``@admin`` command; ``+acl|dryrun`` allows just this).
"""

from __future__ import annotations

import re
from typing import Any

from redis.asyncio.cluster import RedisCluster

from publishers import redis_calls
from publishers.cluster_wait import marker_for
from publishers.layout import Layout
from publishers.manager import DataManager
from publishers.model import Finding
from publishers.redaction import for_display
from publishers.settings import Durability

# A partition, section, table and worker as the namespace's keys are shaped;
# the values never matter to an ACL, only the key names do.
_P, _S, _T, _W = "p", "s", "schema.table", "worker"


def sidecar_commands(layout: Layout, cluster: bool, durable: bool = False) -> list[tuple[str, ...]]:
    """Every command the sidecar sends, with keys (and a channel) of ``layout``'s
    namespace; ``durable``: with ``redis.durability`` (a marker write, then WAIT)."""
    doc, index, seq = layout.document(_P, _S, "k"), layout.index(_P, _S), layout.seq(_P)
    stream, fence, checkpoint = layout.stream(_P), layout.fence(_P), layout.checkpoint(_T)
    lease, lease_fence = layout.lease(_T), layout.lease_fence(_T)
    worker, workers, partitions = layout.worker(_W), layout.workers(), layout.partitions(_S)
    publish = "SPUBLISH" if cluster else "PUBLISH"
    commands: list[tuple[str, ...]] = [
        ("EVALSHA", "0" * 40, "1", doc),
        ("SCRIPT", "LOAD", "return 1"),
        # the apply script (lua/apply.lua)
        ("HGETALL", doc),
        ("HSET", doc, "f", "v"),
        ("HDEL", doc, "f"),
        ("HGET", fence, _T),
        ("HSET", fence, _T, "1"),
        ("PEXPIRE", doc, "1000"),
        ("SADD", index, "k"),
        ("SREM", index, "k"),
        ("INCR", seq),
        ("GET", seq),
        ("XADD", stream, "MAXLEN", "~", "10", "1-0", "m", "x"),
        ("XRANGE", stream, "-", "+", "COUNT", "1"),
        (publish, layout.channel(_P, _S), "m"),
        # checkpoints, leases, workers, partitions, the dead letter, the epoch
        ("HSET", checkpoint, "version", "1"),
        ("HGETALL", checkpoint),
        ("SET", lease, _W, "PX", "1000", "NX"),
        ("GET", lease),
        ("DEL", lease),
        ("INCR", lease_fence),
        ("HSET", worker, "state", "x"),
        ("PEXPIRE", worker, "1000"),
        ("ZADD", workers, "1", _W),
        ("ZRANGEBYSCORE", workers, "0", "+inf"),
        ("ZREM", workers, _W),
        ("SADD", partitions, _P),
        ("SMEMBERS", partitions),
        ("XADD", layout.deadletter(), "*", "table", _T),
        ("SET", f"{layout.namespace}:@epoch", "x", "NX"),
        ("TIME",),
        ("MULTI",),  # the heartbeat's DEL, HSET and PEXPIRE are one transaction
        ("EXEC",),
        ("INFO", "replication"),  # at start (a replica is refused); behind sentinels, the failover watch
    ]
    if cluster:
        commands.append(("CLUSTER", "NODES"))  # the failover watch: refused, no failover would be seen
    if durable:
        commands += _durable_commands(layout, cluster, checkpoint)
    return commands


def _durable_commands(layout: Layout, cluster: bool, checkpoint: str) -> list[tuple[str, ...]]:
    """``redis.durability``'s: a marker write, then WAIT (on a cluster also the
    marker in another key's slot: ``cluster_wait.marker_for``)."""
    markers = [layout.wait_marker(_P)] + ([marker_for(layout.namespace, checkpoint)] if cluster else [])
    return [("SET", marker, "1", "PX", "60000") for marker in markers] + [("WAIT", "1", "1000")]


async def primary_problems(manager: DataManager) -> list[str]:
    """Each node the client writes to that is not a primary, in words; empty when all are."""
    return [_not_primary(node, info) for node, info in await _replication(manager) if _role(info) != "master"]


async def durability_problems(manager: DataManager) -> list[str]:
    """Each primary with fewer replicas online than ``redis.durability.replicas``,
    in words: WAIT cannot count them, so every apply call there fails after the
    timeout (the batch retried, its checkpoint held) until it has them."""
    return _short_of_replicas(await _replication(manager), manager.config.durability)


def _short_of_replicas(named: list[tuple[str, dict[str, Any]]], durability: Durability) -> list[str]:
    return [
        f"{node} has {online} replica(s) online and redis.durability.replicas is {durability.replicas}: "
        f"every apply call there fails after {durability.timeout:g} s (its changes wait, nothing is lost) "
        "until enough replicas are online; add replicas or lower redis.durability.replicas"
        for node, info in named
        if _role(info) == "master" and (online := _online_replicas(info)) < durability.replicas
    ]


async def _replication(manager: DataManager) -> list[tuple[str, dict[str, Any]]]:
    """``INFO replication`` of each node the client writes to, by name."""
    client = manager.client
    if isinstance(client, RedisCluster):
        nodes = list(client.get_primaries())
        replies = [
            await redis_calls.call(client.info("replication", target_nodes=n), manager.config.url)
            for n in nodes
        ]
        return [(f"{n.host}:{n.port}", _single(r)) for n, r in zip(nodes, replies, strict=True)]
    reply = await redis_calls.call(client.info("replication"), manager.config.url)
    return [(for_display(manager.config.url), dict(reply))]


def _online_replicas(info: dict[str, Any]) -> int:
    """The replicas ``INFO replication`` lists as online (``slaveN: ...,state=online,...``)."""
    return sum(
        1
        for name, value in info.items()
        if re.fullmatch(r"slave\d+", str(name)) and isinstance(value, dict) and value.get("state") == "online"
    )


def _single(reply: Any) -> dict[str, Any]:
    """A cluster client's reply for one node: the reply, or a {node: reply} of one entry."""
    if isinstance(reply, dict) and len(reply) == 1 and "role" not in reply:
        return dict(next(iter(reply.values())))
    return dict(reply)


def _role(info: dict[str, Any]) -> str:
    return redis_calls.text(info.get("role", "?"))


def _not_primary(node: str, info: dict[str, Any]) -> str:
    source = ""
    if info.get("master_host"):
        source = (
            f" of {redis_calls.text(info['master_host'])}:{redis_calls.text(info.get('master_port', '?'))}"
        )
    return (
        f"{node} is a replica{source} (INFO replication: role:{_role(info)}): it refuses every write "
        "(READONLY); point redis.url at the primary"
    )


async def primary_findings(manager: DataManager) -> list[Finding]:
    problems = await primary_problems(manager)
    if not problems:
        return [Finding("ok", "redis role", "primary (role:master): it takes writes")]
    return [Finding("error", "redis role", problem) for problem in problems]


async def durability_findings(manager: DataManager) -> list[Finding]:
    durability = manager.config.durability
    if durability.replicas <= 0:
        return []
    named = await _replication(manager)
    if any(_role(info) != "master" for _, info in named):
        return []  # (a replica as the target: its own error says what to fix first)
    problems = _short_of_replicas(named, durability)
    if not problems:
        ok = f"every primary has {durability.replicas} or more replicas online"
        return [Finding("ok", "redis durability", ok)]
    return [Finding("error", "redis durability", problem) for problem in problems]


async def acl_findings(manager: DataManager) -> list[Finding]:
    """Which of the sidecar's commands the ACL user may not run (``ACL DRYRUN``),
    on each node it writes to (a cluster's ACLs are each node's own)."""
    client = manager.client
    nodes: list[Any] = list(client.get_primaries()) if isinstance(client, RedisCluster) else [None]
    out: list[Finding] = []
    for node in nodes:
        out += await _node_acl(manager, {} if node is None else {"target_nodes": node})
    return out


async def _node_acl(manager: DataManager, target: dict[str, Any]) -> list[Finding]:
    client, url = manager.client, manager.config.url
    where = f" on {target['target_nodes'].host}:{target['target_nodes'].port}" if target else ""
    whoami = await redis_calls.reply_or_error(client.execute_command("ACL", "WHOAMI", **target), url)
    if isinstance(whoami, Exception):
        return [
            Finding("ok", "redis acl", f"not checked{where}: ACL WHOAMI was refused ({_first_line(whoami)})")
        ]
    user = redis_calls.text(whoami)
    commands = sidecar_commands(
        manager.layout, manager.config.cluster, manager.config.durability.replicas > 0
    )
    refused: list[str] = []
    for command in commands:
        ask = client.execute_command("ACL", "DRYRUN", user, *command, **target)
        reply = await redis_calls.reply_or_error(ask, url)
        if isinstance(reply, Exception):
            return [Finding("ok", "redis acl", f"not checked{where}: {_dryrun_refused(reply)}")]
        answer = redis_calls.text(reply)
        if answer != "OK":
            refused.append(f"{_acl_name(command)} ({answer})")
    if not refused:
        checked = f"{len(commands)} checked{where}"
        return [
            Finding("ok", "redis acl", f"user {user} may run every command the sidecar sends ({checked})")
        ]
    namespace = manager.layout.namespace
    names = list(dict.fromkeys(r.split(" ", 1)[0] for r in refused))
    fix = f"ACL SETUSER {user} ~{namespace}:* &{namespace}:* " + " ".join(f"+{n.lower()}" for n in names)
    return [
        Finding(
            "error",
            "redis acl",
            f"user {user} may not run {len(refused)} of the sidecar's commands{where}: {'; '.join(refused)}. "
            f"Allow them on the namespace's keys and channels: {fix} (and the same in the ACL file, if one is used)",
            {"refused": names, "fix": fix},
        )
    ]


def _acl_name(command: tuple[str, ...]) -> str:
    """How an ACL rule names ``command``: ``CLUSTER|NODES`` for a container's
    subcommand (``+cluster|nodes`` allows that one only), else the command."""
    if command[0] in ("CLUSTER", "SCRIPT") and len(command) > 1:
        return f"{command[0]}|{command[1]}"
    return command[0]


def _dryrun_refused(exc: Exception) -> str:
    text = _first_line(exc)
    if "unknown subcommand" in text.lower() or "unknown command" in text.lower():
        return "the server has no ACL DRYRUN (Redis 7.0 or later has)"
    return f"this user may not run ACL DRYRUN ({text}); +acl|dryrun lets doctor check its commands"


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]
