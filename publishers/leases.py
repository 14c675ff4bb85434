"""Table leases: several sidecars with the same config share the tables safely.

Each table has a lease, ``ns:@lease:{table}`` = owner id with a TTL (``SET NX
PX``), renewed by its owner well before it runs out. Taking a lease also
increments ``ns:@fence:{table}`` and hands the new value to the owner as its
*fencing token* (both keys share the ``{table}`` hash tag, so one script does
both on a cluster too). Every write the owner makes carries the token: the
apply script and the checkpoint write refuse a token below the highest one
they have seen for the table. An owner that was paused past its lease (GC,
SIGSTOP, a slow disk) and wakes up after another sidecar took the table over
therefore cannot write over the new owner's work (lua/lease_*.lua); it learns that it lost the
lease at its next renewal and stops that table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from publishers import redis_calls, scripts
from publishers.manager import DataManager


class Leases:
    """The leases of one sidecar (``owner``), each lasting ``ttl`` seconds."""

    def __init__(self, manager: DataManager, owner: str, ttl: float) -> None:
        self.manager = manager
        self.owner = owner
        self.ttl_ms = str(max(1, round(ttl * 1000)))
        self.tokens: dict[str, int] = {}  # table -> fencing token of the lease held

    async def acquire(self, table: str) -> int | None:
        """Take the table's lease (or keep ours); its fencing token, or None if
        another sidecar holds it."""
        layout = self.manager.layout
        # The counter's floor, the clock in ms: a counter gone (Redis restarted
        # empty) or taken back by a failover restarts above every token handed
        # out before, so a partition that recorded one cannot refuse the new
        # owner (lease_acquire.lua).
        seed = str(int(time.time() * 1000))
        keys = [layout.lease(table), layout.lease_fence(table)]
        reply = await self._eval(scripts.LEASE_ACQUIRE, keys, extra=(seed,))
        if reply is None:
            self.tokens.pop(table, None)
            return None
        # redis.durability: a failover must not take the counter back, or a
        # later owner could be handed a token that an earlier one holds.
        await self.manager.confirm([keys[1]], "the fencing token")
        self.tokens[table] = int(reply)
        return self.tokens[table]

    async def renew(self, table: str) -> bool:
        """Extend our lease; False when it is no longer ours (expired, taken)."""
        return (await self.renew_all([table]))[table]

    async def renew_all(self, tables: Sequence[str]) -> dict[str, bool]:
        """``renew`` for every table in ``tables``, in one round trip (a
        pipeline: fifty tables cost one exchange with Redis per lease round,
        not fifty)."""
        if not tables:
            return {}
        layout, url = self.manager.layout, self.manager.config.url
        calls = [([layout.lease(table)], [self.owner, self.ttl_ms]) for table in tables]
        replies = await scripts.run_many(self.manager.client, scripts.LEASE_RENEW, calls, url)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise redis_calls.translate(reply, url)
        renewed = {table: bool(reply) for table, reply in zip(tables, replies, strict=True)}
        for table, ours in renewed.items():
            if not ours:
                self.tokens.pop(table, None)
        return renewed

    async def release(self, table: str) -> None:
        self.tokens.pop(table, None)
        await self._eval(scripts.LEASE_RELEASE, [self.manager.layout.lease(table)])

    async def holder(self, table: str) -> str | None:
        value = await redis_calls.call(
            self.manager.client.get(self.manager.layout.lease(table)), self.manager.config.url
        )
        return None if value is None else (value.decode() if isinstance(value, bytes) else str(value))

    async def _eval(self, script: scripts.Script, keys: list[str], extra: tuple[str, ...] = ()) -> Any:
        """Every lease script gets the owner and the TTL, then ``extra``."""
        args = [self.owner, self.ttl_ms, *extra]
        return await scripts.run(self.manager.client, script, keys, args, self.manager.config.url)
