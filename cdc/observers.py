"""What the sidecar tells the outside: ``/healthz``, ``/readyz``, ``/metrics``
and the heartbeat's fields. It reads the pipeline and the balancer, never
changes what they do (it only tells trackers it does not run that they are
``stopped`` here, for ``cdc_table_state``).

``/healthz`` is liveness: 503 only when restarting the process is what
helps, that is when its own loops are stuck (the batch applier ended, or the
main loop has not tried a lease round for ``STALL_LIMIT``). Redis or the
source away, a table dropped, the retention cleanup failing: a restart fixes
none of them, and under a Kubernetes liveness probe a 503 there would restart
every healthy table with it, again and again. Its body still says what is wrong.

``/readyz`` is readiness, and says everything: 503 while Redis or the source
cannot be reached, while a table it runs is degraded (named, with the
reason), while the source's retention cleanup fails (the change tables grow
without bound meanwhile), or until every table it runs has caught up once.
docs/OPERATIONS.md has both bodies."""

from __future__ import annotations

import logging
import time

from cdc.balancer import Balancer
from cdc.errors import CdcError
from cdc.pipeline import Pipeline
from publishers import deadletters

log = logging.getLogger("cdc.observers")

# Seconds without a lease round tried after which the process counts as stuck:
# a round is tried every lease_ttl / 3, and a Redis outage retries it within
# one such period; 60 s is many times that with the default TTL (10 s).
STALL_LIMIT = 60.0
# Seconds between two readings of what only changes slowly or costs a scan:
# the dead letter per table and the source's retention (SQL Server: one
# catalog query).
SLOW_REFRESH = 30.0
# Counting the dead letter reads the whole stream (XRANGE, 1,000 entries a
# page): 2.3 s of this process's time for 100,000 entries of ~0.5 KB
# (measured on a loaded 2-core machine; Redis itself spends ~1 ms a page).
# So the next count waits at least this many times the last one's duration:
# at most a tenth of a core, however long the dead letter grows.
DEAD_LETTER_COST_FACTOR = 10.0
# A source nothing has talked to for this long (a sidecar that runs no table:
# no reads, no shape checks) is asked its current version, one round trip,
# so that cdc_up{component="source"} stays true there too.
SOURCE_PROBE_AFTER = 20.0


class Observer:
    def __init__(self, pipeline: Pipeline, balancer: Balancer) -> None:
        self.pipeline = pipeline
        self.balancer = balancer
        self.metrics = pipeline.metrics
        self.started = time.time()
        self.retention: float | None = None  # seconds the source keeps changes (None: unknown)
        self._count_dead_letters_at = 0.0  # time.monotonic() when the dead letter may be counted again

    # -- health ----------------------------------------------------------------

    def healthz(self) -> tuple[bool, dict[str, object]]:
        stuck = self._stuck()
        return not stuck, {"live": stuck or "ok", **self._problems()}

    def readyz(self) -> tuple[bool, dict[str, object]]:
        waiting = [t.table for t in self.balancer.owned() if not t.caught_up.is_set()]
        problems = self._problems()
        ok = all(value == "ok" for value in problems.values()) and not waiting and not self._stuck()
        return ok, {**problems, "catching_up": waiting}

    def _problems(self) -> dict[str, object]:
        """Each component's trouble ("ok": none): Redis's and the source's (the
        last call's), the retention cleanup's, and each degraded table's
        (owned: those it runs)."""
        degraded = {t.table: t.health.error for t in self.balancer.owned() if t.health.error}
        return {
            "redis": self.pipeline.redis.error or "ok",
            "source": self.pipeline.reachable_source.error or "ok",
            "cleanup": self.pipeline.cleanup_error or "ok",
            "tables": degraded or "ok",
        }

    def _stuck(self) -> list[str]:
        """What of this process's own loops has stopped (empty: none)."""
        stuck = []
        applier = self.pipeline.worker.task
        if applier is not None and applier.done():
            stuck.append("the batch applier has stopped")
        silent = time.monotonic() - self.balancer.last_round
        if silent > max(STALL_LIMIT, 3 * self.balancer.lease_ttl):
            stuck.append(f"no lease round tried for {silent:.0f} s")
        return stuck

    # -- metrics ---------------------------------------------------------------

    def render_metrics(self) -> bytes:
        self.metrics.queue_depth.set(self.pipeline.worker.depth)
        return self.metrics.render()

    async def refresh_metrics(self) -> None:
        """Gauges that nothing else moves while a table is idle or stuck
        (every second). A table this sidecar does not run is ``stopped`` here,
        with no lag of its own: the sidecar that runs it reports it.
        (A coroutine, so that the scheduler runs it on the event loop.)"""
        self.metrics.queue_depth.set(self.pipeline.worker.depth)
        for tracker in self.balancer.trackers:
            if tracker.table in self.balancer.running:
                tracker.gauges.refresh(self.retention, tracker.info, tracker.position)
            else:
                tracker.gauges.not_running()

    async def refresh_slow_metrics(self) -> None:
        """Every ``SLOW_REFRESH``: the dead letter per table, the source's
        retention, and a probe of a source nothing else talked to lately.
        A failure keeps the last values (and tells ``cdc_up``)."""
        await self._refresh_dead_letters()
        await self._refresh_retention()
        await self._probe_source()

    async def _refresh_dead_letters(self) -> None:
        pipeline = self.pipeline
        began = time.monotonic()
        if not pipeline.has_redis or began < self._count_dead_letters_at:
            return
        try:
            counts = await pipeline.redis.observe(deadletters.counts(pipeline.manager))
        except CdcError as exc:
            log.debug("dead letter not counted", extra={"error": str(exc)})
            return
        took = time.monotonic() - began
        self._count_dead_letters_at = began + DEAD_LETTER_COST_FACTOR * took
        for table in pipeline.config.tables:
            self.metrics.dead_letters.labels(table.table).set(counts.get(table.table, 0))

    async def _refresh_retention(self) -> None:
        try:
            self.retention = await self.pipeline.source.retention()
        except CdcError as exc:
            log.debug("source retention not read", extra={"error": str(exc)})

    async def _probe_source(self) -> None:
        if time.monotonic() - self.pipeline.reachable_source.last_evidence < SOURCE_PROBE_AFTER:
            return
        try:
            await self.pipeline.source.current_version()  # a round trip: it tells cdc_up itself
        except CdcError as exc:
            log.debug("source probe failed", extra={"error": str(exc)})

    # -- heartbeat -------------------------------------------------------------

    def heartbeat_fields(self) -> dict[str, str]:
        worker = self.pipeline.worker
        fields: dict[str, str] = {
            "tables": ",".join(self.balancer.running),
            "started_at": str(int(self.started)),
            "heartbeat_at": f"{time.time():.3f}",
            "queue_depth": str(worker.depth),
            "applied": str(worker.stats.changes),
            "batches": str(worker.stats.batches),
        }
        for tracker in self.balancer.owned():
            fields[f"state:{tracker.table}"] = tracker.health.state
            fields[f"applied:{tracker.table}"] = str(tracker.applied)
            if tracker.health.error is not None:
                fields[f"error:{tracker.table}"] = tracker.health.error
        return fields
