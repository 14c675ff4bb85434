"""Prometheus metrics of one sidecar, in a registry of its own (so several
daemons can live in one process, as they do in the tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.changes_read = Counter(
            "cdc_changes_read", "Net changes read from the source", ["table"], registry=r
        )
        self.changes_applied = Counter(
            "cdc_changes_applied", "Changes applied to Redis (stale replays included)", ["table"], registry=r
        )
        self.changes_published = Counter(
            "cdc_changes_published", "Changes that changed a document and were published", registry=r
        )
        self.dead_lettered = Counter(
            "cdc_changes_dead_lettered", "Changes sent to the dead letter", ["table"], registry=r
        )
        self.snapshot_rows = Counter("cdc_snapshot_rows", "Rows loaded by snapshots", ["table"], registry=r)
        self.lag_versions = Gauge(
            "cdc_lag_versions", "Source bound minus the applied checkpoint", ["table"], registry=r
        )
        self.lag_seconds = Gauge(
            "cdc_lag_seconds", "Age of the oldest read not yet fully applied", ["table"], registry=r
        )
        self.backoff_step = Gauge(
            "cdc_backoff_step", "Empty-poll backoff step (-1: polling back to back)", ["table"], registry=r
        )
        self.queue_depth = Gauge("cdc_queue_depth", "Changes waiting in the batch queue", registry=r)
        self.batch_size = Histogram(
            "cdc_batch_size",
            "Changes per applied batch",
            buckets=(1, 5, 10, 50, 100, 250, 500, 1000, 2000, 5000),
            registry=r,
        )
        self.apply_latency = Histogram(
            "cdc_apply_latency_seconds",
            "Time to apply one batch, retries included",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.table_state = Gauge(
            "cdc_table_state",
            "1 for the table's current state (starting, snapshotting, streaming, degraded, stopped), 0 for the others",
            ["table", "state"],
            registry=r,
        )
        self.up = Gauge("cdc_up", "1 when the component's connection works", ["component"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
