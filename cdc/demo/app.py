"""``cdc demo`` from start to stop: servers, tables, sidecars, writer, the
screen, and the orderly stop that ends with the replica checked against
PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from cdc.config import Config, load_config
from cdc.demo import database, leftovers, writer
from cdc.demo.compare import TableComparison, compare_table
from cdc.demo.database import TABLES, Reader
from cdc.demo.leftovers import PidFile, stop_leftovers
from cdc.demo.sidecars import Sidecars
from cdc.demo.terminal import Lines, Screen, say
from cdc.demo.view import Header, TableView
from cdc.demo.watch import Watcher
from cdc.devservers import PostgresServer, RedisServer, free_port, postgres_bindir
from cdc.sources import make_source
from publishers.redaction import mask_passwords

REDRAW_EVERY = 0.25  # seconds
DRAIN_TIMEOUT = 30.0  # seconds the sidecars get to apply the writer's last changes
CATCH_UP_TIMEOUT = 10.0  # seconds the subscribers get to read their partitions' last messages
KILL_KEY = "k"
QUIT_KEY = "q"
START_POLL = 0.05  # seconds between looks for a starting server's pid


async def run_demo(
    directory: str,
    *,
    rate: float = 20.0,
    duration: float | None = None,
    sidecars: int = 2,
    kill_after: float | None = None,
) -> int:
    """Run the demo; 0 when the replica equals PostgreSQL at the end, 1 otherwise."""
    root = await asyncio.to_thread(_prepare, directory)
    await asyncio.to_thread(stop_leftovers, root, say)
    pids = PidFile(root)  # what this run starts, for the next one should this one be SIGKILLed
    pids.record(leftovers.DEMO, os.getpid())
    # Own sessions: Ctrl-C must reach the demo alone, which stops the servers last.
    pg = PostgresServer(directory=root / "pg", port=free_port(), own_session=True)
    redis = RedisServer(directory=root / "redis", port=free_port(), own_session=True)
    say(f"starting PostgreSQL on 127.0.0.1:{pg.port} and Redis on 127.0.0.1:{redis.port} (files in {root})")
    try:
        await _start_recorded(pids, leftovers.POSTGRES, pg.start, lambda: pg.proc, lambda: pg.data)
        await _start_recorded(pids, leftovers.REDIS, redis.start, lambda: redis.proc)
        demo = Demo(root, pg, redis, rate=rate, sidecars=sidecars, pids=pids)
        return await demo.run(duration, kill_after)
    finally:
        await asyncio.to_thread(redis.stop)
        await asyncio.to_thread(pg.stop)
        pids.remove()
        say("PostgreSQL and Redis stopped")


async def _start_recorded(
    pids: PidFile,
    role: str,
    start: Callable[[], object],
    proc: Callable[[], subprocess.Popen[bytes] | None],
    data: Callable[[], Path] | None = None,
) -> None:
    """``start()`` a server (in a thread: it waits until the server accepts)
    and record its pid as soon as it has one, not once it is ready: a demo
    killed while PostgreSQL starts up leaves it running too."""
    starting = asyncio.ensure_future(asyncio.to_thread(start))
    recorded = False
    while not recorded:
        await asyncio.wait({starting}, timeout=START_POLL)
        running = proc()
        if running is not None:
            pids.record(role, running.pid, data() if data else None)
            recorded = True
        elif starting.done():
            break
    await starting


class Demo:
    def __init__(
        self,
        root: Path,
        pg: PostgresServer,
        redis: RedisServer,
        *,
        rate: float,
        sidecars: int,
        pids: PidFile,
    ) -> None:
        self.root, self.pg, self.redis, self.rate, self.count = root, pg, redis, rate, sidecars
        self.config_path = root / "tables.yaml"
        self.sidecars = Sidecars(self.config_path, root, started=pids.record)
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()  # a second Ctrl-C: stop without waiting for the drain
        self.kills = 0
        self.replaced = 0

    async def run(self, duration: float | None, kill_after: float | None) -> int:
        config = await self._prepare()
        self._signals()
        for _ in range(self.count):
            self.sidecars.start_one()
        reader = await Reader.connect(self.pg.dsn)
        watcher = Watcher(config, self._header(), self.sidecars, reader)
        display = Screen(self.root / "demo.log") if sys.stdout.isatty() else Lines()
        writing = asyncio.create_task(writer.write(self.pg.dsn, self.rate, self.stop))
        try:
            await watcher.start()
            display.open(lambda key: self._key(key, watcher))
            try:
                await self._watch(watcher, display, duration, kill_after)
            finally:
                display.close()
            say(
                f"logs: {_shown_path(self.root)}/sidecar-*.log"
                + (", demo.log" if display.interactive else "")
            )
            return await self._finish(watcher, reader, writing)
        finally:
            self.stop.set()
            writing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writing
            await watcher.close()
            await self.sidecars.stop_all()
            await reader.close()

    async def _prepare(self) -> Config:
        database.write_config(self.config_path, self.pg.dsn, self.redis.url, free_port())
        config = load_config(self.config_path)
        say(f"config written to {self.config_path}")
        await database.create_tables(self.pg.dsn)
        source = make_source(config.source)
        await source.connect()
        try:
            for line in await source.tracking_enable(config.tables):
                say(line)
        finally:
            await source.close()
        return config

    def _signals(self) -> None:
        """Ctrl-C and SIGTERM: the orderly stop (a second one: without waiting
        for the drain). SIGHUP (the terminal closed): stop without waiting.
        The servers and sidecars are in sessions of their own, so without
        these the demo would die alone and leave them running."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._interrupted)
        loop.add_signal_handler(signal.SIGHUP, self._hung_up)

    def _interrupted(self) -> None:
        if self.stop.is_set():
            self.hurry.set()
        self.stop.set()

    def _hung_up(self) -> None:
        self.hurry.set()
        self.stop.set()

    def _header(self) -> Header:
        psql = "psql" if shutil.which("psql") else str(postgres_bindir() / "psql")
        return Header(
            config_path=_shown_path(self.config_path),
            dsn=mask_passwords(self.pg.dsn),
            redis_url=mask_passwords(self.redis.url),
            cdc=_cdc_command(),
            psql=f'{psql} "{mask_passwords(self.pg.dsn)}"',
            featured=database.FEATURED,
            update_sql=database.UPDATE_SQL,
        )

    # -- while it runs ---------------------------------------------------------------

    async def _watch(
        self, watcher: Watcher, display: Screen | Lines, duration: float | None, kill_after: float | None
    ) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            elapsed = time.monotonic() - started
            if duration is not None and elapsed >= duration:
                break
            if kill_after is not None and elapsed >= kill_after and self.kills == 0:
                self._kill_owner(watcher)
            await watcher.follow_new_partitions()
            view = await watcher.view(keys=display.interactive)
            self._replace_killed(watcher, view.tables)
            display.show(view)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), REDRAW_EVERY)
        self.stop.set()

    def _key(self, key: str, watcher: Watcher) -> None:
        if key.lower() == KILL_KEY:
            self._kill_owner(watcher)
        elif key.lower() == QUIT_KEY:
            self.stop.set()

    def _kill_owner(self, watcher: Watcher) -> None:
        """SIGKILL the sidecar that streams demo.forecasts (the busiest table):
        another takes it over once the lease runs out, from the checkpoint."""
        table = TABLES[0].table
        owner = watcher.owner_of(table)
        victim = next((s for s in self.sidecars.live() if s.name == owner), None) or next(
            iter(self.sidecars.live()), None
        )
        if victim is None:
            return
        victim.kill()
        watcher.killed_at[victim.name] = time.monotonic()
        self.kills += 1
        watcher.event(
            f"SIGKILL to sidecar {victim.name} (owner of {table}); its lease lasts {database.LEASE_TTL}"
        )

    def _replace_killed(self, watcher: Watcher, tables: list[TableView]) -> None:
        """Once every table is streamed again, start a sidecar in place of the
        killed one (the tables are shared again); at once if none is left."""
        if self.replaced >= self.kills:
            return
        live = self.sidecars.live()
        streamed = all(t.state == "streaming" for t in tables)
        if live and not streamed:
            return
        self.replaced += 1
        sidecar = self.sidecars.start_one()
        for_what = "to share the tables again" if live else "to take the tables once the leases run out"
        watcher.event(f"started sidecar {sidecar.name} {for_what}")

    # -- the stop --------------------------------------------------------------------

    async def _finish(self, watcher: Watcher, reader: Reader, writing: asyncio.Task[None]) -> int:
        """Writer, then the sidecars' drain, then the subscribers: then compare."""
        await writing
        say("stopping: the writer stopped; waiting for the sidecars to apply its last changes")
        drained = await self._wait(lambda: self._equal(watcher, reader), DRAIN_TIMEOUT)
        if not drained:
            say(f"the replicas still differ after {DRAIN_TIMEOUT:.0f}s: stopping the sidecars anyway")
        codes = await self.sidecars.stop_all()
        say("sidecars stopped: " + ", ".join(f"{n} exit {c}" for n, c in codes.items()))
        if not await self._wait(watcher.caught_up, CATCH_UP_TIMEOUT):
            say(f"a subscriber has not read its partition's last message after {CATCH_UP_TIMEOUT:.0f}s")
        comparisons = await compare_all(watcher, reader)
        reloads = sum(s.reloads for s in watcher.subscribers.values())
        say(f"subscribers: {len(watcher.subscribers)} partitions followed, {reloads} reload(s)")
        if self.kills:
            say(f"{self.kills} sidecar(s) killed during the run (SIGKILL): the others took their tables over")
        for comparison in comparisons:
            say(comparison.line())
        return 0 if all(c.same for c in comparisons) else 1

    async def _equal(self, watcher: Watcher, reader: Reader) -> bool:
        return all(c.same for c in await compare_all(watcher, reader))

    async def _wait(self, check: Callable[[], Awaitable[bool]], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.hurry.is_set():
            if await check():
                return True
            await asyncio.sleep(0.2)
        return False


async def compare_all(watcher: Watcher, reader: Reader) -> list[TableComparison]:
    replicas = watcher.replicas()
    return [compare_table(t.table, t.section, await reader.rows(t), replicas) for t in TABLES]


def _prepare(directory: str) -> Path:
    root = Path(directory).resolve()
    for sub in ("pg", "redis"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


def _shown_path(path: Path) -> str:
    """``path`` as the user types it from here: relative when below the current directory."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def _cdc_command() -> str:
    """The ``cdc`` beside this Python (``.venv/bin/cdc`` from the repo root)."""
    script = Path(sys.executable).parent / "cdc"
    if script.exists():
        return _shown_path(script)
    return f"{_shown_path(Path(sys.executable))} -m cdc.cli"
