"""What the command line's commands do, as coroutines returning an exit code."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import orjson

from cdc import checks
from cdc.config import Config, TableConfig
from cdc.daemon import Daemon
from cdc.errors import CdcError, ConfigError, ConnectError, TransientError
from cdc.pipeline import Pipeline
from cdc.pipes import stdout_to_devnull
from cdc.snapshot_range import REQUESTED, KeyRange, request_range, run_range
from cdc.sources import make_source
from cdc.sources.base import ChangeSource, Finding
from publishers import control
from publishers.gc_tuning import tune_gc
from publishers.manager import DataManager
from publishers.redaction import mask_passwords

if TYPE_CHECKING:
    from publishers.subscriber import Subscriber


async def run_daemon(config: Config, *, once: bool = False) -> int:
    tune_gc()
    daemon = Daemon(config)
    daemon.install_signal_handlers()
    await daemon.run(once=once)
    if daemon.dead_letter_mark is None:
        return 0
    from cdc.deadletter_cmd import run_summary

    return await run_summary(config, daemon.dead_letter_mark)  # 4 when the run dead-lettered changes


@asynccontextmanager
async def connected(
    config: Config, *, redis: bool = True
) -> AsyncIterator[tuple[ChangeSource, DataManager | None]]:
    """The source (and Redis), connected; closed on the way out."""
    source = make_source(config.source)
    await source.connect()
    manager = None
    try:
        if redis:
            manager = await DataManager.connect(config.redis)
        yield source, manager
    finally:
        await source.close()
        if manager is not None:
            await manager.close()


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- validate ------------------------------------------------------------------


async def validate(config: Config) -> int:
    """The file already parsed; now the connections, the tables, their tracking."""
    from cdc.describer import Describer

    worst = 0
    for secret in config.literal_secrets:
        _print(f"warn  {secret.warning(config.path)}")
    async with connected(config) as (source, manager):
        assert manager is not None
        _print(
            f"ok    {config.path}: {len(config.tables)} table(s), source {config.source.kind}, Redis reachable"
        )
        problems = await control.primary_problems(manager)
        for problem in problems:
            _print(f"error redis.url ({config.path}): {problem}")
        worst = max(worst, checks.REPLICA_EXIT if problems else 0)
        for problem in await control.durability_problems(manager):  # a warning: a replica may be resyncing
            _print(f"warn  redis.durability.replicas ({config.path}): {problem}")
        for table_config in config.tables:
            describer = Describer(table_config, source, config.worker.max_row_bytes)
            try:
                await describer.describe()  # the table, the config's templates and columns, its tracking
                assert describer.info is not None
                await source.read_changes(describer.info, await source.current_version(), limit=1)
            except CdcError as exc:
                worst = max(worst, exc.exit_code)
                _print(f"error {table_config.table} ({config.path}:{table_config.line}): {exc}")
                continue
            info = describer.info
            if info.left_out:
                left_out = ", ".join(info.left_out)
                _print(
                    f"warn  {table_config.table}: left out of the documents (names starting with @ are reserved): {left_out}"
                )
            key = ", ".join(info.primary_key)
            _print(f"ok    {table_config.table}: key ({key}), {len(info.columns)} column(s), tracking on")
    return worst


# -- tracking ------------------------------------------------------------------


async def tracking(
    config: Config,
    action: str,
    *,
    table: str | None = None,
    force: bool = False,
    as_json: bool = False,
    grant_to: str | None = None,
) -> int:
    """Enable, disable or show the change tracking of ``table`` (every table
    when None). ``disable`` first makes sure that no live sidecar streams the
    tables (``_refuse_while_streamed``) unless ``force``. ``enable`` with
    ``grant_to``: then grants that role (SQL Server: database user) what
    ``cdc run`` needs on the tables (docs/POSTGRES.md, docs/SQLSERVER.md)."""
    chosen = _chosen_tables(config, table, action)
    if grant_to is not None and action != "enable":
        raise ConfigError(f"--grant-to is for enable only, not {action}")
    if action == "disable":
        await _refuse_while_streamed(config, [t.table for t in chosen], force=force)
    async with connected(config, redis=False) as (source, _):
        if action == "enable":
            if grant_to is not None:  # a typo in the role: refused before anything is enabled
                await source.check_grantee(grant_to)
            for line in await source.tracking_enable(chosen):
                _print(line)
            if grant_to is not None:
                for line in await source.grant_runtime(chosen, grant_to):
                    _print(line)
        elif action == "disable":
            if table is not None:
                await _tracked_if_unregistered(config, source, chosen[0])
            for line in await source.tracking_disable(chosen):
                _print(line)
        statuses = await source.tracking_status(chosen)
        others = await _other_slots(config, source) if action == "status" and table is None else []
    if as_json:
        _print(orjson.dumps([s.__dict__ for s in statuses]).decode())
    elif action == "status":
        for s in statuses:
            state = "enabled " if s.enabled else "DISABLED"
            _print(
                f"{state} {s.table}  min_valid={s.min_valid_version}  current={s.current_version}  {s.detail}"
            )
    for line in others:  # slots no table of this config uses (logical capture): said, never dropped
        if as_json:
            sys.stderr.write(line + "\n")  # stdout stays the statuses' JSON
        else:
            _print(line)
    return 0 if all(s.enabled for s in statuses) or action == "disable" else 1


async def _other_slots(config: Config, source: ChangeSource) -> list[str]:
    if config.source.kind != "postgres" or config.source.capture != "logical":
        return []
    from cdc.sources.postgres_logical import PostgresLogicalSource

    assert isinstance(source, PostgresLogicalSource)
    return await source.other_slots(config.tables)


def _chosen_tables(config: Config, table: str | None, action: str) -> list[TableConfig]:
    """The tables ``--table`` names (every registered one without it).
    ``disable`` also takes a table the config no longer registers, if the
    source tracks it (``_tracked_if_unregistered``): removing a table takes it
    out of the config first, then its tracking (docs/TABLES.md)."""
    if table is None:
        return list(config.tables)
    if action != "disable":
        return [config.table(table)]
    from cdc.purge_cmd import registered, unregistered_table

    return [registered(config, table) or unregistered_table(config, table)]


async def _tracked_if_unregistered(config: Config, source: ChangeSource, table: TableConfig) -> None:
    """A table the config does not register is taken only if the source
    tracks it: else it is most likely a typo, a usage error (2) naming the
    registered tables."""
    from cdc.purge_cmd import registered

    if registered(config, table.table) is not None:
        return
    if all(s.enabled or s.remains for s in await source.tracking_status([table])):
        return
    try:
        config.table(table.table)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; nor does the source track it: nothing to disable") from None


async def _refuse_while_streamed(config: Config, tables: list[str], *, force: bool) -> None:
    """Disabling the tracking of a table that a live sidecar streams stops the
    table on that sidecar (it cannot read its changes any more): refuse,
    naming who streams it, unless ``force``. A table's lease held by a worker
    without a heartbeat does not count: that worker is gone, and its lease
    runs out by itself.

    Refused: ``CdcError`` (exit 1; the command and the config are right, the
    sidecar's state stops it, as when ``cdc snapshot`` finds a table owned).
    Redis unreachable: ``ConnectError`` (exit 3), as nobody can tell then."""
    names = ", ".join(tables)
    try:
        manager = await DataManager.connect(config.redis)
        try:
            owned = await control.ownership(manager, tables)
        finally:
            await manager.close()
    except (ConnectError, TransientError) as exc:
        why = f"cannot tell whether a sidecar streams {names}: {exc}"
        if not force:
            raise ConnectError(
                f"{why}. Refusing to disable tracking: a sidecar streaming a table whose "
                "tracking is removed under it stops mirroring it. Make Redis reachable, or pass --force."
            ) from None
        _warn(f"{why}; disabling anyway (--force)")
        return
    streamed = {table: o for table, o in owned.items() if o.alive}
    if not streamed:
        return
    if not force:
        raise CdcError(
            "refusing to disable change tracking: "
            + "; ".join(_streamed_by(table, o) for table, o in streamed.items())
            + ". A sidecar stops mirroring a table whose tracking is removed under it. Stop the "
            "sidecar (or remove the table from its config) first, or pass --force."
        )
    for table, o in streamed.items():
        _warn(
            f"{_streamed_by(table, o)}; disabling its tracking anyway (--force): that sidecar "
            "reports the table degraded until tracking is enabled again"
        )


def _streamed_by(table: str, ownership: control.Ownership) -> str:
    seen = [] if ownership.state is None else [f"state {ownership.state}"]
    if ownership.seen_ago is not None:
        seen.append(f"heartbeat {ownership.seen_ago:.1f}s ago")
    return f"{table} is streamed by sidecar {ownership.owner}" + (f" ({', '.join(seen)})" if seen else "")


def _warn(message: str) -> None:
    sys.stderr.write(f"warning: {mask_passwords(message)}\n")
    sys.stderr.flush()


# -- snapshot ------------------------------------------------------------------


async def snapshot(config: Config, table: str | None, key_range: KeyRange | None = None) -> int:
    """Re-snapshot now (only the rows of ``key_range``, when given:
    ``cdc.snapshot_range``). A running sidecar that owns the table is asked to
    do it (so the snapshot never races its own streaming); otherwise it runs here."""
    tables = [config.table(table).table] if table else [t.table for t in config.tables]
    async with connected(config) as (_, manager):
        assert manager is not None
        owners = await control.table_owners(manager, tables)
        asked = [t for t in tables if t in owners]
        for t in asked:
            if key_range is not None:
                await request_range(manager, t, key_range)
            await control.request_snapshot(manager, t)
            _print(f"asked worker {owners[t]} to re-snapshot {t}")
        done_remotely = []
        for t in asked:
            if await _wait_snapshot_done(manager, t, owners[t]):
                done_remotely.append(t)
            else:
                _print(f"worker {owners[t]} is gone; snapshotting {t} here")
    local = [t for t in tables if t not in done_remotely]
    if local:
        await _snapshot_here(config, local, key_range)
    return 0


async def _wait_snapshot_done(manager: DataManager, table: str, owner: str) -> bool:
    """Wait for the owner to pick the request up and finish; False if it died first."""
    while await control.snapshot_requested(manager, table):
        if not await control.worker_alive(manager, owner):
            await control.clear_snapshot_request(manager, table)
            return False
        await asyncio.sleep(0.2)
    while True:
        checkpoint = await manager.get_checkpoint(table)
        if checkpoint is not None and checkpoint.state == "streaming":
            _print(f"snapshot of {table} done at version {checkpoint.version}")
            return True
        await asyncio.sleep(0.2)


async def _snapshot_here(config: Config, tables: list[str], key_range: KeyRange | None = None) -> None:
    """Snapshot in this process, under each table's lease (so that a sidecar
    starting meanwhile waits for it, and cannot be overwritten by it)."""
    from cdc.progress import SnapshotProgressView
    from publishers.leases import Leases

    async with Pipeline(config) as pipeline:
        leases = Leases(pipeline.manager, f"cdc-snapshot-{os.getpid()}", config.worker.lease_ttl)
        try:
            chosen = [pipeline.tracker(table) for table in tables]
            for tracker in chosen:
                token = await leases.acquire(tracker.table)
                if token is None:
                    raise CdcError(
                        f"{tracker.table} is owned by sidecar {await leases.holder(tracker.table)}; retry"
                    )
                await tracker.start(token)
                await tracker.resume()  # its checkpoint: a key range needs one to go on from
            with SnapshotProgressView(chosen) as view:
                for tracker in chosen:
                    if key_range is not None and tracker.position is not None:
                        await run_range(tracker, key_range)
                    else:  # (a table never snapshotted is snapshotted whole)
                        await tracker.snapshot(REQUESTED)
                    view.refresh()
            for tracker in chosen:
                _print(
                    f"snapshot of {tracker.table}: {tracker.progress.rows} rows, version {tracker.applied}"
                )
        finally:
            for table in list(leases.tokens):
                await leases.release(table)


# -- subscribe -----------------------------------------------------------------


async def subscribe(config: Config, partition: str, section: str | None, from_seq: int | None) -> int:
    from cdc.subscribe_args import check_subscription
    from publishers.subscriber import Subscriber

    # the command line checks these too (click's usage errors); this is for callers in Python
    if partition == "":
        raise ConfigError("--partition: a partition value cannot be empty")
    if from_seq is not None and from_seq < 1:
        raise ConfigError(f"--from-seq: {from_seq} is not a seq (seqs start at 1)")
    manager = await DataManager.connect(config.redis)
    try:
        await check_subscription(config, manager, partition, section, from_seq)
        subscriber = Subscriber(manager.client, config.redis.namespace, partition, section, from_seq)
        subscriber.on_reload = _LossNotice(subscriber)
        await subscriber.start()
        tune_gc()  # the loaded replica is frozen out of every collection
        async for entry in subscriber.entries():
            _print_text(entry.text)
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    except BrokenPipeError:  # `cdc subscribe ... | head`: the reader has what it wanted
        stdout_to_devnull()
    finally:
        await manager.close()
    return 0


def _print_text(text: bytes) -> None:
    """A message as the stream holds it, byte for byte: decoding and encoding
    again would change it (a float64 rounds 3.141592653589793238462643383279)."""
    out = getattr(sys.stdout, "buffer", None)  # None: a caller's text stream in place of stdout
    if out is None:
        _print(text.decode("utf-8", "surrogateescape"))
        return
    out.write(text + b"\n")
    out.flush()


class _LossNotice:
    """``cdc subscribe``'s ``on_reload``: says on stderr (stdout stays JSON
    lines) that the messages before ``seq`` are lost to this reader. Only for
    the reloads nothing announced (``Subscriber.reloads``): at an ``R`` message
    nothing is lost (the message itself is printed next)."""

    def __init__(self, subscriber: Subscriber) -> None:
        self.subscriber = subscriber
        self.told = 0

    def __call__(self, seq: int) -> None:
        if self.subscriber.reloads == self.told:
            return
        self.told = self.subscriber.reloads
        sys.stderr.write(
            f"cdc subscribe: reloaded at seq {seq}: the partition's stream no longer holds the messages this "
            "subscriber missed (trimmed, or Redis lost its data); messages go on from there\n"
        )
        sys.stderr.flush()


# -- doctor --------------------------------------------------------------------


async def doctor(config: Config, *, as_json: bool = False) -> int:
    findings: list[Finding] = []
    async with connected(config) as (source, manager):
        assert manager is not None
        findings += checks.secret_findings(config)
        findings += await source.doctor(config.tables)
        findings += await control.doctor(manager)
        findings += await checks.retention_findings(config, manager)
        findings += await _dead_letter_findings(config, manager)
    if as_json:
        _print(orjson.dumps([f.__dict__ for f in findings]).decode())
    else:
        for f in findings:
            _print(f"{f.level:<7} {f.subject}: {f.message}")
        for line in checks.grant_script(findings):
            _print(line)
    return 1 if any(f.level == "error" for f in findings) else 0


async def _dead_letter_findings(config: Config, manager: DataManager) -> list[Finding]:
    from cdc.deadletter_cmd import doctor_findings

    return await doctor_findings(config, manager)
