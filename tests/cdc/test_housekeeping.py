"""The sidecar's housekeeping jobs (heartbeat, metrics, shape checks, the
retention cleanup) on a busy machine: a job whose time came while the event
loop was held up runs late, once, and quietly. Apscheduler's default skipped
a run more than a second late, with a warning: under CPU load a sidecar's
heartbeat could go unwritten past its TTL. A whole sidecar (``Daemon``) on
the in-memory source and a real Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

import pytest
from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_JOB_MISSED, JobEvent

from cdc.config import parse_config
from cdc.daemon import Daemon
from cdc.sources.memory import MemorySource
from tests.e2e import wait_for

TABLE = "mem.items"


async def test_a_job_due_while_the_loop_was_held_up_runs_late_not_skipped(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = MemorySource()
    source.create_table(TABLE, {"id": "int"}, ["id"])
    text = (
        "source:\n  kind: postgres\n  dsn: unused\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        "worker:\n  health: null\n  lease_ttl: 15s\n  heartbeat: 5s\n"
        f"tables:\n  - table: {TABLE}\n    partition: p\n    section: items\n"
    )
    config = parse_config(text, "sidecar.yaml", {})
    await source.tracking_enable(list(config.tables))
    daemon = Daemon(config, source=source, worker_id="w1")
    task = asyncio.create_task(daemon.run(), name="sidecar")
    missed: list[str] = []
    heartbeats: list[float] = []

    def seen(event: JobEvent) -> None:
        if event.code == EVENT_JOB_MISSED:
            missed.append(event.job_id)
        elif (
            daemon.scheduler is not None and daemon.scheduler.get_job(event.job_id).func == daemon._heartbeat
        ):
            heartbeats.append(time.monotonic())

    try:

        async def scheduling() -> bool:
            return daemon.scheduler is not None and daemon.scheduler.running

        await wait_for(scheduling, 10, "the sidecar's scheduler")
        daemon.scheduler.add_listener(seen, EVENT_JOB_EXECUTED | EVENT_JOB_MISSED)  # type: ignore[union-attr]
        caplog.set_level(logging.WARNING, logger="apscheduler")
        (job,) = [job for job in daemon.scheduler.get_jobs() if job.func == daemon._heartbeat]  # type: ignore[union-attr]
        await asyncio.sleep((job.next_run_time - datetime.now(UTC)).total_seconds() - 0.2)
        # the event loop (the sidecar's too) held up past the heartbeat's time, as by a busy CPU;
        # (less than an interval: a later due time would be the one run, on time)
        time.sleep(2.5)
        released = time.monotonic()

        async def beat_since() -> bool:
            return any(at >= released for at in heartbeats)

        await wait_for(beat_since, 5, "a heartbeat once the loop runs again")
        assert missed == [], "a job run late must run, not be skipped"
        assert not [r.getMessage() for r in caplog.records if r.name.startswith("apscheduler")]
        assert not task.done()
    finally:
        daemon.request_stop()
        await asyncio.wait_for(task, 30)
