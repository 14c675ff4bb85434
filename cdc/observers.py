"""What the sidecar tells the outside: ``/healthz``, ``/readyz``, ``/metrics``
and the heartbeat's fields. It reads the pipeline and the balancer, never
changes them."""

from __future__ import annotations

import time

from cdc.balancer import Balancer
from cdc.pipeline import Pipeline


class Observer:
    def __init__(self, pipeline: Pipeline, balancer: Balancer) -> None:
        self.pipeline = pipeline
        self.balancer = balancer
        self.metrics = pipeline.metrics
        self.started = time.time()

    def healthz(self) -> tuple[bool, dict[str, object]]:
        degraded = {t.table: t.error for t in self.pipeline.trackers if t.error}
        redis_error = self.pipeline.redis_error
        ok = redis_error is None and not degraded
        return ok, {"redis": redis_error or "ok", "tables": degraded or "ok"}

    def readyz(self) -> tuple[bool, dict[str, object]]:
        waiting = [t.table for t in self.balancer.owned() if not t.caught_up.is_set()]
        healthy, detail = self.healthz()
        return healthy and not waiting, {**detail, "catching_up": waiting}

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
            fields[f"state:{tracker.table}"] = tracker.state
            fields[f"applied:{tracker.table}"] = str(tracker.applied)
        return fields
