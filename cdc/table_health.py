"""A table's state as the outside sees it, and the log lines of its failures.

    starting      not yet described, or taken on and not yet read
    snapshotting  loading the whole table
    streaming     following its changes
    degraded      its last step failed (``error`` says why); it retries
    stopped       not run by this sidecar: given back, another sidecar's, never
                  taken, or the sidecar stops

Every state change moves the ``cdc_table_state{table, state}`` gauge: 1 for
the current state, 0 for the others (Prometheus' way of exporting an enum).
A failure is logged when it is new; the same failure again only every
``REPEAT_LOG`` seconds, so that a table broken for hours (dropped, say) does
not flood the log while it retries every few seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal, get_args

from cdc.errors import CdcError, TableChanged, TransientError
from cdc.metrics import Metrics
from publishers.redaction import redact

log = logging.getLogger("cdc.tracker")

State = Literal["starting", "snapshotting", "streaming", "degraded", "stopped"]
STATES: tuple[State, ...] = get_args(State)
REPEAT_LOG = 300.0  # seconds between two log lines of the same failure


class TableHealth:
    def __init__(self, table: str, metrics: Metrics, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self._gauges = {state: metrics.table_state.labels(table, state) for state in STATES}
        self._clock = clock
        self._state: State = "starting"
        self._gauges["starting"].set(1)
        self.error: str | None = None  # why the table is degraded (None: it is not)
        self.failures = 0  # failed tries in a row
        self._logged: tuple[str, float] | None = None  # the failure last logged, and when

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        if state == self._state:  # every poll sets it: the gauges move only on a change
            return
        self._gauges[self._state].set(0)
        self._state = state
        self._gauges[state].set(1)

    def failed(self, error: BaseException, retry_in: float) -> None:
        """A try failed: the table is degraded until one succeeds."""
        self.state = "degraded"
        self.error = redact(str(error)) or type(error).__name__  # shown in /readyz and the heartbeat
        self.failures += 1
        if not self._due(self.error):
            log.debug("table still degraded", extra={"table": self.table, "error": self.error})
            return
        extra = {"table": self.table, "error": self.error, "retry_in": round(retry_in, 3)}
        if isinstance(error, TableChanged):  # after DDL, expected: not an alert
            log.warning("the table changed under a read: describing it again", extra=extra)
        elif isinstance(error, TransientError):
            log.warning("table degraded, retrying", extra=extra)
        elif isinstance(error, CdcError):
            log.error("table degraded, retrying", extra=extra)
        else:  # a bug: the traceback is what will fix it
            log.error("table degraded by an unexpected error, retrying", extra=extra, exc_info=error)

    def recovered(self) -> None:
        """A try succeeded."""
        if self.error is not None:
            log.info("table recovered", extra={"table": self.table, "failed_tries": self.failures})
        self.error, self.failures, self._logged = None, 0, None

    def _due(self, error: str) -> bool:
        now = self._clock()
        if self._logged is not None and self._logged[0] == error and now - self._logged[1] < REPEAT_LOG:
            return False
        self._logged = (error, now)
        return True
