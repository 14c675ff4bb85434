"""The series of one table that move with time alone, or with who runs it:
``cdc_lag_seconds``, ``cdc_lag_versions``, ``cdc_retention_headroom_seconds``
and ``cdc_backoff_step`` (refreshed every second by the observer, whatever
the tracker is doing: stuck, retrying, waiting), and ``stopped`` with none of
those series while this sidecar does not run the table (given back, taken by
another sidecar, never taken here): only the sidecar that runs a table
reports them, so that they neither freeze nor grow where nobody runs it."""

from __future__ import annotations

import contextlib

from cdc.backoff import EmptyPollBackoff
from cdc.checkpoints import CheckpointKeeper
from cdc.sources.base import ChangeSource, TableInfo
from cdc.table_health import TableHealth


class TableGauges:
    def __init__(
        self,
        checkpoints: CheckpointKeeper,
        health: TableHealth,
        backoff: EmptyPollBackoff,
        source: ChangeSource,
    ) -> None:
        self.table, self.metrics, self.redis = checkpoints.table, checkpoints.metrics, checkpoints.redis
        self.checkpoints, self.health, self.backoff, self.source = checkpoints, health, backoff, source
        self._backoff_step = self.metrics.backoff_step.labels(self.table)  # looked up once: set at every poll
        self.metrics.last_applied.labels(self.table)  # 0 until a change of it is applied
        self._parked = False  # not_running() done: stopped here, its series gone

    def running(self) -> None:
        """The table is taken on here (no await between this and its tracker's run)."""
        self._parked = False
        if self.health.state == "stopped":
            self.health.state = "starting"
        self._backoff_step = self.metrics.backoff_step.labels(self.table)  # not_running() removed it

    def backoff_step(self) -> None:
        self._backoff_step.set(self.backoff.step)

    def refresh(self, retention: float | None, info: TableInfo | None, position: int | None) -> None:
        """``retention``: seconds the source keeps changes (None: unknown);
        ``info`` and ``position``: the table as described, where its next read starts."""
        if self._known_quiet(info, position):
            self.checkpoints.line.fresh_now()
        self.checkpoints.update_lag()
        self.checkpoints.update_headroom(retention)
        self.backoff_step()
        retained = getattr(self.source, "retained_wal", {}).get(self.table)  # logical capture's slots
        if retained is not None:
            self.metrics.slot_retained_wal.labels(self.table).set(retained)

    def _known_quiet(self, info: TableInfo | None, position: int | None) -> bool:
        """Every read applied, Redis answering, and the source knows a read now
        would find nothing (DESIGN.md §2): the mirror is fresh as of now,
        though the tracker waits for the table's notification instead of reading."""
        line = self.checkpoints.line
        return (
            info is not None
            and position is not None
            and position == line.applied
            and line.empty
            and self.health.error is None
            and self.redis.up
            and self.source.quiet_for(info, position) > 0
        )

    def not_running(self) -> None:
        """This sidecar does not run the table: ``stopped``, its series gone."""
        if self._parked and self.health.state == "stopped":
            return  # every second for each such table: once is enough
        self._parked = True
        self.health.state = "stopped"
        self.checkpoints.forget_metrics()
        for gauge in (self.metrics.backoff_step, self.metrics.slot_retained_wal):
            with contextlib.suppress(KeyError):
                gauge.remove(self.table)
