"""Why a table's tracker owes a snapshot, and which stored request it serves.

A request comes from the tracker itself (no checkpoint, tracking expired,
the table's shape changed), from the balancer (Redis lost its data or failed
over) or from Redis (``cdc snapshot``, or a sidecar that saw a failover: the
checkpoint hash's ``snapshot_requested``, which the balancer forwards every
round until the snapshot that serves it is done).

One request is pending at a time: another asked for before the snapshot
begins is the same snapshot. One asked for while a snapshot runs is another
after it (the running one may have begun before what the request is about: a
failover that lost its first pages), unless it is the stored request that
snapshot serves. A stored request is removed once served, and only if it is
still the one served (``publishers.control.clear_snapshot_request``): one
made meanwhile outlives the snapshot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from publishers import control
from publishers.manager import DataManager


class SnapshotRequests:
    def __init__(self, manager: DataManager, table: str, wake: Callable[[], None]) -> None:
        self.manager, self.table = manager, table
        self.pending: str | None = None  # the reason of the snapshot owed
        self._wake = wake
        self._serving: str | None = None  # the stored request the snapshot under way serves

    def ask(self, reason: str, *, stored: str | None = None) -> bool:
        """Owe a snapshot for ``reason`` (``stored``: the stored request's
        text); whether it asks for one not yet under way."""
        if stored is not None and stored == self._serving:
            return False
        if self.pending is None:
            self.pending = reason
            self._wake()
        return True

    async def serve(self, snapshot: Callable[[str], Awaitable[None]]) -> None:
        """Run ``snapshot(reason)`` for the request pending; failed or
        stopped, the request stays pending."""
        served = await control.snapshot_request(self.manager, self.table)
        reason, self.pending = self.pending, None
        assert reason is not None
        self._serving = served
        try:
            await snapshot(reason)
            if served is not None:  # (none: whatever is stored now came meanwhile)
                await control.clear_snapshot_request(self.manager, self.table, served)
        except BaseException:
            self.pending = self.pending or reason
            raise
        finally:
            self._serving = None
