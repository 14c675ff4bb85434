"""``cdc purge --table T``: remove what a table left in Redis (docs/TABLES.md).

The table is normally one the config no longer registers: removing a table
is "take it out of the config, restart the sidecars, ``cdc tracking disable
--table T``, ``cdc purge --table T``". Its section then comes from Redis (the
sections whose partitions the table wrote), or from ``--section``. A table
the config still registers is refused without ``--force``: any sidecar
started with that config would snapshot it again at once.

The purge holds the table's lease while it runs: it refuses (exit 1) while a
live sidecar holds it, naming the sidecar, and no sidecar can start on the
table until it is done; every delete it writes carries its own, newer
fencing token. What goes, and what subscribers see: ``publishers.purge``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import socket
import sys
import time
from dataclasses import dataclass

from cdc.config import Config, TableConfig
from cdc.errors import CdcError, ConfigError
from cdc.templates import Template
from publishers import control, purge, redis_calls
from publishers.errors import LeaseLost
from publishers.leases import Leases
from publishers.manager import DataManager

# As the config's schema writes a table (schemas/config.schema.json, tables[].table).
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
SECTION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
PROGRESS_EVERY = 2.0  # seconds between progress lines
LISTED = 10  # partitions named in the dry run's list before "and N more"
# The purge deletes each tombstone its deletes leave right after them; one that
# a purge killed in between leaves (up to a page) expires this soon instead of
# after redis.tombstone_ttl: nothing will write the table to need it.
TOMBSTONE_TTL = 60.0


def registered(config: Config, name: str) -> TableConfig | None:
    """The config's entry for ``name`` (as ``--table`` matches: any case), or None."""
    return next((t for t in config.tables if t.table.lower() == name.lower()), None)


def unregistered_table(config: Config, name: str) -> TableConfig:
    """A table the config does not (or no longer) register, as a ``TableConfig``
    for the commands that take a table away (``tracking disable``): only its
    name counts. A name that is not ``schema.table`` is a usage error (2)."""
    if not TABLE_NAME.fullmatch(name):
        raise ConfigError(
            f"--table {name[:80]!r}: not a table name as the config writes one (schema.table, letters, "
            "digits and _)"
        )
    schema, table = name.split(".")
    section = table.lower()
    return TableConfig(name, schema, table, section, Template.parse(section), None, None, file=config.path)


@dataclass(frozen=True)
class Request:
    table: str  # as the config writes it, or as given
    section: str | None = None  # --section
    force: bool = False
    dry_run: bool = False


async def purge_table(config: Config, request: Request) -> int:
    """The command: 0 done (or nothing left), 1 refused (a live sidecar holds
    the table) or failed, 2 usage, 3 Redis unreachable."""
    entry = registered(config, request.table)
    if request.section is not None and not SECTION_NAME.fullmatch(request.section):
        raise ConfigError(f"--section {request.section[:80]!r}: not a section name (letters, digits, _ . -)")
    old_section = entry is not None and request.section not in (None, entry.section)
    if entry is not None and not (request.force or request.dry_run or old_section):
        raise ConfigError(
            f"{config.path}:{entry.line}: {entry.table} is still registered: a sidecar started with this "
            "config snapshots it again as soon as the purge is done. Remove it from the config and restart "
            "the sidecars first (docs/TABLES.md), or pass --force to empty its mirror anyway"
        )
    name = entry.table if entry is not None else unregistered_table(config, request.table).table
    redis = dataclasses.replace(config.redis, tombstone_ttl=TOMBSTONE_TTL)
    async with await DataManager.connect(redis) as manager:
        section = await _section(manager, config, name, None if old_section else entry, request.section)
        keep = {
            t.partition.source: t.section for t in config.tables if t is not entry and t.partition.is_literal
        }
        plan = await purge.plan(manager, name, section, keep)
        if old_section:
            return await _old_section(config, manager, plan, request.dry_run)
        refusal = await _refusal(manager, name)
        if request.dry_run:
            _print_plan(config, plan, entry is not None)
            if refusal:
                _say(f"a purge now would be refused: {refusal}")
            return 1 if refusal else 0
        if refusal:
            raise CdcError(f"refusing to purge {refusal}")
        if plan.empty:
            _say(f"nothing of {name} is left in Redis (namespace {config.redis.namespace}): nothing to do")
            return 0
        await _run(config, manager, plan)
    return 0


async def _old_section(config: Config, manager: DataManager, plan: purge.Plan, dry_run: bool) -> int:
    """A section the (still registered) table wrote before its config gave it
    another one: its documents and partitions go, nothing of the table's own
    (checkpoint, lease, dead letters, its fields in the partitions' fences).
    No sidecar writes that section any more, so no lease is needed: the
    deletes go unfenced (token 0)."""
    plan.checkpoint, plan.lease, plan.dead_letters = {}, False, 0
    if dry_run:
        _print_plan(config, plan, True)
        return 0

    async def no_lease() -> None:
        return None

    assert plan.section is not None
    deleter = purge.Deleter(manager, plan.table, plan.section, 0, no_lease, keep_fence=True)
    deleted = await _delete_partitions(deleter, plan)
    _say(
        f"purged section {plan.section} of {plan.table}: {deleted} document(s) deleted (each published as a "
        f"delete), {len(plan.partitions)} partition(s)"
    )
    return 0


async def _section(
    manager: DataManager, config: Config, name: str, entry: TableConfig | None, given: str | None
) -> str | None:
    """The section whose documents go: the config's; ``--section``, checked;
    else the one Redis shows the table wrote (None: it wrote none)."""
    if entry is not None:
        if given is not None and given != entry.section:
            raise ConfigError(
                f"--section {given}: {config.path} registers {name} with section {entry.section}"
            )
        return entry.section
    others = {t.section: t.table for t in config.tables}
    if given is not None:
        if given in others:
            raise ConfigError(
                f"--section {given} is written by {others[given]}, which {config.path} registers"
            )
        writers = await purge.writers_of(manager, given)
        if writers and name not in writers:
            raise ConfigError(
                f"--section {given} was written by {', '.join(sorted(writers))}, not by {name}: nothing purged"
            )
        return given
    found = await purge.candidate_sections(manager, name, skip=others)
    if len(found) > 1:
        raise ConfigError(
            f"{name} wrote (or shares partitions with) several sections: {', '.join(found)}. "
            "Name its own with --section (the section the old config gave it); nothing purged"
        )
    return found[0] if found else None


async def _refusal(manager: DataManager, name: str) -> str | None:
    """Why the table cannot be purged now (a live sidecar holds it), or None."""
    owned = (await control.ownership(manager, [name])).get(name)
    if owned is None or not owned.alive:
        return None
    seen = [] if owned.state is None else [f"state {owned.state}"]
    if owned.seen_ago is not None:
        seen.append(f"heartbeat {owned.seen_ago:.1f}s ago")
    detail = f" ({', '.join(seen)})" if seen else ""
    return (
        f"{name}: sidecar {owned.owner} holds it{detail}. Remove the table from that sidecar's config and "
        "restart it (or stop it), then run cdc purge again"
    )


async def _run(config: Config, manager: DataManager, plan: purge.Plan) -> None:
    """Under the table's lease: the checkpoint first (a sidecar that gets the
    table after an interrupted purge snapshots it from scratch instead of
    streaming on over half its documents), then each partition, then the
    table's remaining keys; the lease last."""
    owner = purge.purge_owner(socket.gethostname(), os.getpid())
    leases = Leases(manager, owner, config.worker.lease_ttl)
    token = await _take_lease(manager, leases, plan.table, config.worker.lease_ttl)
    try:
        await redis_calls.call(
            manager.client.delete(manager.layout.checkpoint(plan.table)), manager.config.url
        )
        deleted = await _documents(manager, leases, plan, token, config.worker.lease_ttl)
        dead = await purge.drop_table_keys(manager, plan.table, token)
    finally:
        await leases.release(plan.table)
    shared = sum(1 for p in plan.partitions if p.shared_with)
    _say(
        f"purged {plan.table}: {deleted} document(s) deleted (each published as a delete), "
        f"{len(plan.partitions)} partition(s) of section {plan.section or '-'} "
        f"({shared} shared with other sections kept their @seq and @stream), checkpoint, lease, "
        f"{dead} dead letter(s); its fencing counter stays"
    )


async def _documents(manager: DataManager, leases: Leases, plan: purge.Plan, token: int, ttl: float) -> int:
    if plan.section is None or not plan.partitions:
        return 0
    renewed = time.monotonic()

    async def keep_lease() -> None:
        nonlocal renewed
        if time.monotonic() - renewed < ttl / 3:
            return
        if not await leases.renew(plan.table):
            raise LeaseLost(f"{plan.table}: the purge lost the table's lease (stalled past it): run it again")
        renewed = time.monotonic()

    stored = plan.checkpoint.get("version", "")
    version = int(stored) if stored.isdecimal() else 0
    deleter = purge.Deleter(manager, plan.table, plan.section, token, keep_lease, version)
    return await _delete_partitions(deleter, plan)


async def _delete_partitions(deleter: purge.Deleter, plan: purge.Plan) -> int:
    progress = _Progress(plan, deleter)
    for done, part in enumerate(plan.partitions):
        progress.partitions_done = done
        await deleter.partition(part, progress.show)
    progress.finish()
    return deleter.deleted


async def _take_lease(manager: DataManager, leases: Leases, name: str, ttl: float) -> int:
    """The table's lease for the purge. Held by a process without a heartbeat
    (a sidecar that died, whose lease runs out by itself): wait for it, up to
    its TTL; held by a live sidecar: refused (exit 1)."""
    token = await leases.acquire(name)
    if token is not None:
        return token
    refusal = await _refusal(manager, name)
    if refusal:
        raise CdcError(f"refusing to purge {refusal}")
    holder = await leases.holder(name)
    wait_ms = await redis_calls.call(manager.client.pttl(manager.layout.lease(name)), manager.config.url)
    _say(
        f"{name}: its lease is held by {holder}, which has no heartbeat; waiting up to {max(0, wait_ms) / 1000:.1f}s for it to run out"
    )
    deadline = time.monotonic() + max(0, wait_ms) / 1000 + 1.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        token = await leases.acquire(name)
        if token is not None:
            return token
    raise CdcError(
        f"refusing to purge {name}: its lease is still held by {holder} (a cdc snapshot or cdc purge "
        "running, or a sidecar that renews it without a heartbeat). Stop it, then run cdc purge again"
    )


class _Progress:
    """A line every ``PROGRESS_EVERY`` seconds while documents go, and the last one."""

    def __init__(self, plan: purge.Plan, deleter: purge.Deleter) -> None:
        self.plan, self.deleter = plan, deleter
        self.partitions_done = 0
        self.last = time.monotonic()

    def show(self) -> None:
        if time.monotonic() - self.last < PROGRESS_EVERY:
            return
        self.last = time.monotonic()
        _say(
            f"{self.plan.table}: {self.deleter.deleted}/{self.plan.documents} document(s) deleted, "
            f"{self.partitions_done}/{len(self.plan.partitions)} partition(s) done"
        )

    def finish(self) -> None:
        self.last, self.partitions_done = 0.0, len(self.plan.partitions)
        self.show()


def _print_plan(config: Config, plan: purge.Plan, is_registered: bool) -> None:
    """``--dry-run``: what a purge would remove now."""
    where = "registered in" if is_registered else "not registered in"
    _say(
        f"dry run: purging {plan.table} (namespace {config.redis.namespace}; {where} {config.path}) would remove:"
    )
    if plan.empty:
        _say("  nothing: no key of the table is left")
    if plan.section is not None and plan.partitions:
        _say(
            f"  section {plan.section}: {plan.documents} document(s) in {len(plan.partitions)} partition(s), each deleted with a D message"
        )
        for part in plan.partitions[:LISTED]:
            kept = (
                f"; @seq, @stream kept: also written by {', '.join(part.shared_with)}"
                if part.shared_with
                else "; @seq, @stream, @fence removed"
            )
            _say(f"    partition {part.partition}: {part.documents} document(s){kept}")
        if len(plan.partitions) > LISTED:
            _say(f"    and {len(plan.partitions) - LISTED} more partition(s)")
    if plan.checkpoint:
        _say(
            f"  checkpoint {config.redis.namespace}:@checkpoint:{plan.table} (version {plan.checkpoint.get('version', '?')}, {plan.checkpoint.get('state', '?')})"
        )
    if plan.lease:
        _say("  the table's lease")
    if plan.dead_letters:
        _say(f"  {plan.dead_letters} dead letter(s)")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
