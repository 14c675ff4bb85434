"""What the sidecar tells the outside: ``/healthz``, ``/readyz``, ``/metrics``
and the heartbeat's fields. It reads the pipeline and the balancer, never
changes them.

``/healthz`` is liveness: 503 only when restarting the process is what
helps, that is when its own loops are stuck (the batch applier ended, or the
main loop has not tried a lease round for ``STALL_LIMIT``). Redis or the
source away, a table dropped: a restart fixes none of them, and under a
Kubernetes liveness probe a 503 there would restart every healthy table with
it, again and again. Its body still says what is wrong.

``/readyz`` is readiness, and says everything: 503 while Redis is failing,
while a table it owns is degraded (named, with the reason), or until every
table it owns has caught up once."""

from __future__ import annotations

import time

from cdc.balancer import Balancer
from cdc.pipeline import Pipeline

# Seconds without a lease round tried after which the process counts as stuck:
# a round is tried every lease_ttl / 3, and a Redis outage retries it within
# one such period; 60 s is many times that with the default TTL (10 s).
STALL_LIMIT = 60.0


class Observer:
    def __init__(self, pipeline: Pipeline, balancer: Balancer) -> None:
        self.pipeline = pipeline
        self.balancer = balancer
        self.metrics = pipeline.metrics
        self.started = time.time()

    def healthz(self) -> tuple[bool, dict[str, object]]:
        stuck = self._stuck()
        return not stuck, {"live": stuck or "ok", **self._problems()}

    def readyz(self) -> tuple[bool, dict[str, object]]:
        waiting = [t.table for t in self.balancer.owned() if not t.caught_up.is_set()]
        problems = self._problems()
        ok = problems["redis"] == "ok" and problems["tables"] == "ok" and not waiting and not self._stuck()
        return ok, {**problems, "catching_up": waiting}

    def _problems(self) -> dict[str, object]:
        """Redis's trouble, and each degraded table's (owned: those it runs)."""
        degraded = {t.table: t.health.error for t in self.balancer.owned() if t.health.error}
        return {"redis": self.pipeline.redis_error or "ok", "tables": degraded or "ok"}

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

    def render_metrics(self) -> bytes:
        self.metrics.queue_depth.set(self.pipeline.worker.depth)
        return self.metrics.render()

    async def refresh_metrics(self) -> None:
        """Gauges that nothing else moves while a table is idle or stuck.
        (A coroutine, so that the scheduler runs it on the event loop.)"""
        self.metrics.queue_depth.set(self.pipeline.worker.depth)
        for tracker in self.balancer.owned():
            tracker.refresh_metrics()

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
