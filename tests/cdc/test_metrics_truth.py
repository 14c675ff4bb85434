"""/metrics, /readyz and /healthz tell what is true: the source or Redis
away is ``cdc_up`` 0 and a lag that grows, and back is 1 and a lag back
down; a table given to another sidecar is ``stopped`` here, with no lag of
its own; the dead letter is counted per table; a failing retention cleanup
makes the sidecar not ready, and still alive.

Each case reads the metrics as Prometheus would: ``GET /metrics`` of a running
sidecar (or its rendering), parsed with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdc.config import Config, parse_config
from cdc.daemon import Daemon
from cdc.devservers import PostgresServer, RedisServer, free_port
from cdc.errors import RedisUnavailable, SchemaError
from cdc.metrics import Metrics
from cdc.reachability import APPLY, ObservedSource, redis_component, source_component
from cdc.sources.memory import MemorySource
from cdc.sources.postgres import PostgresSource
from publishers.layout import Layout
from publishers.manager import DataManager
from tests.chaos import get, wait_health
from tests.e2e import create_tables, enable_tracking, make_config, wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(port: int) -> Samples:
    """GET /metrics, as Prometheus does (nothing while the sidecar does not serve yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return parse(response.read().decode())
    except OSError:
        return {}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


class Running:
    """A sidecar in this process, with its health server on a free port."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        assert config.worker.health is not None
        self.port = config.worker.health[1]
        self.daemon = Daemon(config, **kwargs)
        self.task = asyncio.create_task(self.daemon.run())

    async def metric(self, name: str, **labels: str) -> float | None:
        if self.task.done():
            raise AssertionError(f"the sidecar stopped: {self.task.exception()!r}")
        return value(await asyncio.to_thread(scrape, self.port), name, **labels)

    async def wait_metric(self, what: str, timeout: float, name: str, check: Any, **labels: str) -> float:
        """Wait until the series ``name{labels}`` passes ``check``; its value."""
        seen: list[float | None] = [None]

        async def passes() -> bool:
            seen[0] = await self.metric(name, **labels)
            return seen[0] is not None and bool(check(seen[0]))

        try:
            await wait_for(passes, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc} (last {name}{labels}: {seen[0]})") from None
        assert seen[0] is not None
        return seen[0]

    async def stop(self) -> None:
        self.daemon.request_stop()
        await asyncio.wait_for(self.task, 60)


# -- the source --------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_postgres_down_is_up_0_and_a_growing_lag_then_back(namespace: str, redis_url: str) -> None:
    """PostgreSQL (a server of the test's own) crashes while the tables are
    idle: cdc_up{source} goes to 0 and the lag grows, second by second (it
    said 1 and 0 before: issue 15); /readyz names the source. Once the server
    is back: 1, and the lag is back to about the poll interval."""
    # durable commits: with the dev servers' synchronous_commit off, a crash
    # loses acknowledged commits (the tracking set-up itself, here)
    server = PostgresServer(settings=("synchronous_commit=on",)).start()
    running: Running | None = None
    try:
        async with await psycopg.AsyncConnection.connect(server.dsn, autocommit=True) as conn:
            await conn.execute("create schema truth")
        config = make_config(
            "truth", server.dsn, redis_url, namespace, health=f"127.0.0.1:{free_port()}", lease_ttl="2s"
        )
        await create_tables(server.dsn, "truth")
        await enable_tracking(config)
        running = Running(config)
        items = "truth.items"
        await running.wait_metric("the source up", 30, "cdc_up", lambda v: v == 1, component="source")
        await running.wait_metric("an idle table's lag", 30, "cdc_lag_seconds", lambda v: v < 2, table=items)

        server.stop("immediate")
        await running.wait_metric("the source down", 15, "cdc_up", lambda v: v == 0, component="source")
        lag = await running.wait_metric(
            "the lag to grow", 15, "cdc_lag_seconds", lambda v: v > 3, table=items
        )
        await running.wait_metric("it to grow on", 15, "cdc_lag_seconds", lambda v: v >= lag + 2, table=items)
        body = await wait_health(running.port, 503, 10, contains="PostgreSQL")
        assert body["source"] != "ok", body

        server.start()
        await running.wait_metric("the source up again", 60, "cdc_up", lambda v: v == 1, component="source")
        await running.wait_metric("the lag back down", 60, "cdc_lag_seconds", lambda v: v < 2, table=items)
        async with await psycopg.AsyncConnection.connect(server.dsn, autocommit=True) as conn:
            await conn.execute("insert into truth.items (id, name, price) values (1, 'a', 1.5)")
        await running.wait_metric(
            "the change applied", 30, "cdc_last_applied_timestamp_seconds", lambda v: v > 0, table=items
        )
        await wait_health(running.port, 200, 30)
    finally:
        if running is not None:
            await running.stop()
        server.cleanup()


# -- Redis ----------------------------------------------------------------------------


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own that it may kill and start again (AOF: its data stays)."""
    server = RedisServer(appendonly=True, extra=("--appendfsync", "always")).start()
    yield server
    server.cleanup()


@pytest.mark.timeout(180)
async def test_redis_down_under_an_idle_sidecar_is_up_0_then_back(
    postgres_dsn: str, pg_schema: str, namespace: str, own_redis: RedisServer
) -> None:
    """Nothing to apply, and Redis goes away: an idle sidecar still finds out
    (its lease rounds and checkpoints fail): cdc_up{redis} 0, /readyz says
    why, /healthz stays 200, the lag grows. Back: 1, lag down."""
    config = make_config(
        pg_schema, postgres_dsn, own_redis.url, namespace, health=f"127.0.0.1:{free_port()}", lease_ttl="2s"
    )
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    running = Running(config)
    items = f"{pg_schema}.items"
    try:
        await running.wait_metric("Redis up", 30, "cdc_up", lambda v: v == 1, component="redis")
        await running.wait_metric("an idle table's lag", 30, "cdc_lag_seconds", lambda v: v < 2, table=items)

        own_redis.kill()
        await running.wait_metric("Redis down", 15, "cdc_up", lambda v: v == 0, component="redis")
        body = await wait_health(running.port, 503, 10, contains="Redis")
        assert body["redis"] != "ok", body
        status, live = await asyncio.to_thread(get, running.port, "/healthz")
        assert status == 200 and live["redis"] != "ok", live
        lag = await running.wait_metric(
            "the lag to grow", 15, "cdc_lag_seconds", lambda v: v > 3, table=items
        )
        await running.wait_metric("it to grow on", 15, "cdc_lag_seconds", lambda v: v >= lag + 2, table=items)
        assert await running.metric("cdc_up", component="source") == 1  # the source is fine

        own_redis.start()
        await running.wait_metric("Redis up again", 30, "cdc_up", lambda v: v == 1, component="redis")
        await running.wait_metric("the lag back down", 60, "cdc_lag_seconds", lambda v: v < 2, table=items)
        await running.wait_metric(
            "the table streaming again",
            30,
            "cdc_table_state",
            lambda v: v == 1,
            table=items,
            state="streaming",
        )
        await wait_health(running.port, 200, 30)
    finally:
        await running.stop()


# -- what is reported where (an in-memory source: seconds) ---------------------------------

TABLES = ["mem.a", "mem.b"]


def memory_config(redis_url: str, namespace: str, *, health: bool = False) -> Config:
    tables = "".join(
        f"  - table: {t}\n    partition: p\n    section: {t.split('.')[1]}\n    backoff: [[null, 10ms]]\n"
        for t in TABLES
    )
    address = f"127.0.0.1:{free_port()}" if health else "null"
    text = (
        f"source:\n  kind: postgres\n  dsn: unused\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: {address}\n  lease_ttl: 0.6s\n  heartbeat: 1s\n"
        f"tables:\n{tables}"
    )
    return parse_config(text, "<test>", {})


@pytest.fixture
def memory() -> MemorySource:
    source = MemorySource()
    for table in TABLES:
        source.create_table(table, {"id": "int", "n": "int"}, ["id"])
    return source


@pytest.fixture
async def manager(redis_url: str, namespace: str) -> AsyncIterator[DataManager]:
    async with await DataManager.connect(memory_config(redis_url, namespace).redis) as connected:
        yield connected


def rendered(daemon: Daemon) -> Samples:
    return parse(daemon.observer.render_metrics().decode())


async def test_a_table_given_to_another_sidecar_is_stopped_here_with_no_lag(
    redis_url: str, namespace: str, memory: MemorySource
) -> None:
    """One sidecar runs both tables; a second starts and takes one of them
    (fair share). The first reports it ``stopped`` and no longer exports its
    lag (which would otherwise freeze, or grow, where nobody runs it); the
    second reports it streaming, with its lag."""
    await memory.tracking_enable(memory_config(redis_url, namespace).tables)
    first = Daemon(memory_config(redis_url, namespace), source=memory, worker_id="first")
    first_task = asyncio.create_task(first.run())
    second: Daemon | None = None
    second_task: asyncio.Task[None] | None = None
    try:

        async def first_streams_both() -> bool:
            s = rendered(first)
            return all(value(s, "cdc_table_state", table=t, state="streaming") == 1 for t in TABLES)

        await wait_for(first_streams_both, 15, "the first sidecar to stream both tables")
        second = Daemon(memory_config(redis_url, namespace), source=memory, worker_id="second")
        second_task = asyncio.create_task(second.run())

        def given(daemon: Daemon) -> list[str]:
            return sorted(daemon.balancer.running)

        async def spread() -> bool:
            assert second is not None
            return len(given(first)) == 1 and len(given(second)) == 1

        await wait_for(spread, 15, "the tables to spread, one each")
        (kept,), (moved,) = given(first), given(second)

        async def reported() -> bool:
            assert second is not None
            here, there = rendered(first), rendered(second)
            return (
                value(here, "cdc_table_state", table=moved, state="stopped") == 1
                and value(here, "cdc_table_state", table=moved, state="streaming") == 0
                and value(here, "cdc_lag_seconds", table=moved) is None
                and value(here, "cdc_lag_seconds", table=kept) is not None
                and value(there, "cdc_table_state", table=moved, state="streaming") == 1
                and value(there, "cdc_table_state", table=kept, state="stopped") == 1
                and value(there, "cdc_lag_seconds", table=moved) is not None
                and value(there, "cdc_lag_seconds", table=kept) is None
            )

        await wait_for(reported, 15, "each sidecar to report the table it runs, and only that one")
    finally:
        first.request_stop()
        if second is not None:
            second.request_stop()
        await asyncio.gather(first_task, *([second_task] if second_task else []), return_exceptions=True)


async def test_the_source_unavailable_then_back_on_an_in_memory_source(
    redis_url: str, namespace: str, memory: MemorySource
) -> None:
    """The same truth in milliseconds: every call fails, cdc_up{source} 0 and
    the tables' lag grows; calls answer again: 1, lag small."""
    config = memory_config(redis_url, namespace)
    await memory.tracking_enable(config.tables)
    daemon = Daemon(config, source=memory, worker_id="solo")
    task = asyncio.create_task(daemon.run())
    try:

        async def series(name: str, check: Any, **labels: str) -> bool:
            found = value(rendered(daemon), name, **labels)
            return found is not None and bool(check(found))

        await wait_for(lambda: series("cdc_lag_seconds", lambda v: v < 1, table="mem.a"), 15, "a small lag")
        assert value(rendered(daemon), "cdc_up", component="source") == 1
        memory.available = False
        await wait_for(lambda: series("cdc_up", lambda v: v == 0, component="source"), 15, "the source down")
        await wait_for(
            lambda: series("cdc_lag_seconds", lambda v: v > 2, table="mem.a"), 15, "the lag to grow"
        )
        assert daemon.readyz()[1]["source"] != "ok"
        memory.available = True
        await wait_for(lambda: series("cdc_up", lambda v: v == 1, component="source"), 15, "the source up")
        await wait_for(lambda: series("cdc_lag_seconds", lambda v: v < 1, table="mem.a"), 15, "the lag back")
    finally:
        daemon.request_stop()
        await task


async def test_dead_letters_are_counted_per_table_of_the_config(
    redis_url: str, namespace: str, memory: MemorySource, manager: DataManager
) -> None:
    """What the dead letter holds, per table (every table of the config, 0
    when it has none); tables another config writes are not reported here."""
    config = memory_config(redis_url, namespace)
    key = Layout(namespace).deadletter()
    for i in range(3):
        await manager.client.xadd(key, {"table": "mem.a", "key": str(i), "reason": "test"})
    await manager.client.xadd(key, {"table": "other.t", "key": "x", "reason": "test"})
    daemon = Daemon(config, source=memory, manager=manager, worker_id="counter")
    await daemon.pipeline.connect()
    await daemon.observer.refresh_slow_metrics()
    samples = rendered(daemon)
    assert value(samples, "cdc_dead_letters", table="mem.a") == 3
    assert value(samples, "cdc_dead_letters", table="mem.b") == 0
    assert value(samples, "cdc_dead_letters", table="other.t") is None
    await manager.client.xadd(key, {"table": "mem.b", "key": "1", "reason": "test"})

    async def counted_again() -> bool:  # (the next count waits ten times the last one's duration)
        await daemon.observer.refresh_slow_metrics()
        return value(rendered(daemon), "cdc_dead_letters", table="mem.b") == 1

    await wait_for(counted_again, 5, "the new entry to be counted")


async def test_a_failing_cleanup_is_not_ready_but_alive(
    redis_url: str, namespace: str, memory: MemorySource
) -> None:
    """/readyz 503 naming the cleanup's error while it fails (the change
    tables grow without bound meanwhile); /healthz 200 (a restart would not
    help) with the same field; ready again once the cleanup runs."""
    config = memory_config(redis_url, namespace, health=True)
    await memory.tracking_enable(config.tables)
    running = Running(config, source=memory, worker_id="cleaner")
    try:
        await wait_health(running.port, 200, 15)
        reason = "PostgreSQL: cleanup: permission denied for table items_changes"
        running.daemon.pipeline.cleanup_error = reason
        body = await wait_health(running.port, 503, 5, contains="permission denied")
        assert body["cleanup"] == reason and body["ok"] is False
        status, live = await asyncio.to_thread(get, running.port, "/healthz")
        assert (status, live["cleanup"]) == (200, reason)
        running.daemon.pipeline.cleanup_error = None
        body = await wait_health(running.port, 200, 5)
        assert body["cleanup"] == "ok"
    finally:
        await running.stop()


# -- the rules of evidence ------------------------------------------------------------------


async def test_calls_that_reach_the_source_move_cdc_up_and_refusals_count_as_answers() -> None:
    metrics = Metrics()
    memory = MemorySource()
    source = ObservedSource(memory, source_component(metrics))

    def up() -> float | None:
        return value(parse(metrics.render().decode()), "cdc_up", component="source")

    assert up() == 0  # nothing answered yet
    await source.connect()
    assert up() == 1
    memory.available = False
    with pytest.raises(Exception, match="unavailable"):
        await source.current_version()
    assert up() == 0 and source.component.error is not None
    memory.available = True
    with pytest.raises(SchemaError):  # no such table: the source answered
        await source.describe(memory_config("redis://x", "n").tables[0])
    assert up() == 1 and source.component.error is None


def test_a_failing_applier_holds_redis_down_while_other_calls_pass() -> None:
    """Redis out of memory refuses the applier's writes while lease renewals
    pass: cdc_up{redis} stays 0 (and /readyz says why) until an apply succeeds,
    instead of flipping at every lease round."""
    metrics = Metrics()
    redis = redis_component(metrics)

    def up() -> float | None:
        return value(parse(metrics.render().decode()), "cdc_up", component="redis")

    redis.answered()
    assert up() == 1
    redis.failed(RedisUnavailable("OOM command not allowed when used memory > 'maxmemory'"), APPLY)
    redis.answered()  # a lease round passes
    assert up() == 0 and redis.error is not None and "maxmemory" in redis.error
    redis.answered(APPLY)
    assert up() == 1 and redis.error is None


async def test_a_read_the_source_answers_without_a_round_trip_is_no_evidence(
    postgres_dsn: str, pg_schema: str, redis_url: str, namespace: str
) -> None:
    """PostgreSQL answers a read known to find nothing without sending it
    (DESIGN.md §2): that read must not say the source is up."""
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace)
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    raw = PostgresSource(config.source)
    component = source_component(Metrics())
    source = ObservedSource(raw, component)
    await source.connect()
    try:
        info = await source.describe(config.tables[0])
        await source.wait_for_changes(0.01)  # listening from now on
        since = await source.current_version()
        async with asyncio.timeout(10):
            while True:  # until a read is answered without being sent
                skipped = raw.reads_skipped
                since = (await source.read_changes(info, since, limit=100)).next_version
                if raw.reads_skipped > skipped:
                    break
                await asyncio.sleep(0.01)
        component.failed(RuntimeError("as if a call had just failed"))
        await source.read_changes(info, since, limit=100)
        assert raw.reads_skipped > skipped + 1 and component.up is False  # skipped, and no evidence
        await source.fingerprints(config.tables)  # a round trip
        assert component.up is True
    finally:
        await source.close()


def test_process_and_gc_collectors_render_in_two_sidecars_of_one_process() -> None:
    """The process, platform and GC collectors are in each sidecar's own
    registry: two in one process (the tests run many) render both."""
    first, second = Metrics(), Metrics()
    for metrics in (first, second):
        samples = parse(metrics.render().decode())
        names = {name for name, _ in samples}
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
        assert "python_gc_objects_collected_total" in names


async def test_the_lag_counts_from_a_stored_checkpoint_until_a_read_is_applied(
    redis_url: str, namespace: str, memory: MemorySource, manager: DataManager
) -> None:
    """A sidecar taking a table over from a checkpoint written an hour ago
    reports an hour of lag until its first read is applied, not 0."""
    config = memory_config(redis_url, namespace)
    await memory.tracking_enable(config.tables)
    version = await memory.current_version()
    await manager.set_checkpoint("mem.a", version, "streaming", now=datetime.now(UTC) - timedelta(hours=1))
    daemon = Daemon(config, source=memory, manager=manager, worker_id="late")
    await daemon.pipeline.open(strict=False)
    tracker = daemon.pipeline.tracker("mem.a")
    await tracker.start()
    await tracker.resume()
    tracker.gauges.refresh(None, tracker.info, tracker.position)
    lag = value(rendered(daemon), "cdc_lag_seconds", table="mem.a")
    assert lag is not None and 3590 < lag < 3700
    await tracker.poll()
    await daemon.pipeline.worker.drain()
    await tracker.checkpoints.complete(block=True)
    lag = value(rendered(daemon), "cdc_lag_seconds", table="mem.a")
    assert lag is not None and lag < 5
    await daemon.pipeline.worker.stop()
