"""Prometheus metrics of one sidecar, in a registry of its own (so several
daemons can live in one process, as they do in the tests). The process and
GC collectors are added to it too: they read the process, not the daemon.

Every name here is a public contract: docs/OPERATIONS.md lists each one,
and deploy/prometheus/alerts.yml and deploy/grafana/cdc-sync.json use only
these (tests/cdc/test_operations_docs.py checks both)."""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)
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
        self.dead_letters = Gauge(
            "cdc_dead_letters",
            "Changes of the table waiting in the dead letter (read from Redis, all sidecars' together)",
            ["table"],
            registry=r,
        )
        self.cleanup_failing = Gauge(
            "cdc_cleanup_failing", "1 while the source's retention cleanup fails, 0 once it ran", registry=r
        )
        self.cleanup_last_success = Gauge(
            "cdc_cleanup_last_success_timestamp_seconds",
            "Unix time of the last retention cleanup that ran (0: none since start)",
            registry=r,
        )
        self.snapshot_rows = Counter("cdc_snapshot_rows", "Rows loaded by snapshots", ["table"], registry=r)
        self.lag_versions = Gauge(
            "cdc_lag_versions", "Source bound minus the applied checkpoint", ["table"], registry=r
        )
        self.lag_seconds = Gauge(
            "cdc_lag_seconds",
            "Seconds since the newest source read whose changes are all applied (grows while nothing can be read"
            " or applied)",
            ["table"],
            registry=r,
        )
        self.last_applied = Gauge(
            "cdc_last_applied_timestamp_seconds",
            "Unix time at which a change of the table was last applied to Redis (0: none since start)",
            ["table"],
            registry=r,
        )
        self.retention_headroom = Gauge(
            "cdc_retention_headroom_seconds",
            "Seconds until the table's checkpoint would fall below the source's minimum valid version"
            " (negative: it may already have; the table re-snapshots)",
            ["table"],
            registry=r,
        )
        self.slot_retained_wal = Gauge(
            "cdc_slot_retained_wal_bytes",
            "Bytes of WAL the table's replication slot keeps (logical capture), as of its latest read",
            ["table"],
            registry=r,
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
        self.up = Gauge(
            "cdc_up",
            "1 while the component (source, redis) answers, 0 while it fails; set by every call, not at start only",
            ["component"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
