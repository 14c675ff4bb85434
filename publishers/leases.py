"""Table leases: several sidecars with the same config share the tables safely.

Each table has a lease, ``ns:@lease:{table}`` = owner id with a TTL (``SET NX
PX``), renewed by its owner well before it runs out. Taking a lease also
increments ``ns:@fence:{table}`` and hands the new value to the owner as its
*fencing token* (both keys share the ``{table}`` hash tag, so one script does
both on a cluster too). Every write the owner makes carries the token: the
apply script and the checkpoint write refuse a token below the highest one
they have seen for the table. An owner that was paused past its lease (GC,
SIGSTOP, a slow disk) and wakes up after another sidecar took the table over
therefore cannot write over the new owner's work; it learns that it lost the
lease at its next renewal and stops that table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from publishers import redis_calls
from publishers.manager import DataManager

_ACQUIRE = """
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], ARGV[3])
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
return false
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


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
        # A counter that is gone (Redis restarted empty) restarts from the
        # clock in ms, not from 0: tokens keep growing across a wipe, so a
        # sidecar still holding a pre-wipe token cannot lock the new owner out.
        seed = str(int(time.time() * 1000))
        reply = await self._eval(_ACQUIRE, layout.lease(table), layout.lease_fence(table), extra=(seed,))
        if reply is None:
            self.tokens.pop(table, None)
            return None
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
        layout = self.manager.layout
        pipe = self.manager.client.pipeline(transaction=False)
        for table in tables:
            pipe.eval(_RENEW, 1, layout.lease(table), self.owner, self.ttl_ms)
        replies = await redis_calls.call(pipe.execute(), self.manager.config.url)
        renewed = {table: bool(reply) for table, reply in zip(tables, replies, strict=True)}
        for table, ours in renewed.items():
            if not ours:
                self.tokens.pop(table, None)
        return renewed

    async def release(self, table: str) -> None:
        self.tokens.pop(table, None)
        await self._eval(_RELEASE, self.manager.layout.lease(table))

    async def holder(self, table: str) -> str | None:
        value = await redis_calls.call(
            self.manager.client.get(self.manager.layout.lease(table)), self.manager.config.url
        )
        return None if value is None else (value.decode() if isinstance(value, bytes) else str(value))

    async def _eval(self, script: str, *keys: str, extra: tuple[str, ...] = ()) -> Any:
        command = self.manager.client.eval(script, len(keys), *keys, self.owner, self.ttl_ms, *extra)
        return await redis_calls.call(command, self.manager.config.url)
