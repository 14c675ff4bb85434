"""``cdc status``: per table, what Redis holds (checkpoint, owner, the owner's
view, dead letters) beside the source's version; and the workers' heartbeats.

Redis is what an operator needs in an incident, so it is read first and shown
whatever the source does: a source that cannot be reached leaves its column
``unreachable`` (the reason once, above the tables, and in ``--json``'s
``source.error``), and the command exits 3, as for every command that cannot
connect, after printing everything else. 3 rather than 0: a script that runs
``cdc status`` as a check must not read "all is well" while the source is
down; the output is there either way. Redis unreachable: exit 3, nothing shown
(nothing is known without it).

The text view never cuts a value: on a terminal a long one wraps within its
column (``overflow="fold"``); piped, the console is exactly as wide as the
widest table needs (rich would otherwise assume 80 columns and cut
``shop.customers`` to ``shop.cus…``). ``--json`` has every number as a
number and ``null`` where it is not known (docs/DESIGN.md §6).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from cdc.config import Config
from cdc.errors import ConnectError, TransientError
from cdc.sources import make_source
from publishers import control, deadletters
from publishers.manager import DataManager
from publishers.redaction import mask_passwords

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

# How much of a degraded table's error the table view shows (``--json`` has it whole).
ERROR_SHOWN = 200
# Exit code when the source cannot be reached (cdc.errors.ConnectError's): the Redis side is still shown.
SOURCE_UNREACHABLE = ConnectError.exit_code

# Heartbeat fields (cdc.observers.Observer.heartbeat_fields) that are numbers;
# per-table ``applied:<table>`` too. Any other field stays a string.
WORKER_INTEGERS = frozenset({"queue_depth", "applied", "batches"})
WORKER_FLOATS = frozenset({"started_at", "heartbeat_at", "age"})


@dataclass(frozen=True)
class SourceView:
    """The source's current version, or why it could not be read."""

    kind: str
    version: int | None
    error: str | None  # passwords masked


async def status(config: Config, *, as_json: bool = False) -> int:
    """Print the status; 0, or ``SOURCE_UNREACHABLE`` when the source could
    not be read (everything from Redis printed all the same)."""
    manager = await DataManager.connect(config.redis)  # ConnectError: exit 3, nothing to show
    try:
        source = await source_view(config)
        report = await gather(config, manager, source)
    finally:
        await manager.close()
    if as_json:
        _write(orjson.dumps(report).decode())
    else:
        print_text(report)
    if source.error is None:
        return 0
    sys.stderr.write(
        f"error: source unreachable: {source.error}\n"
        "(shown: what Redis holds; the source's version and lag are unknown)\n"
    )
    sys.stderr.flush()
    return SOURCE_UNREACHABLE


async def source_view(config: Config) -> SourceView:
    """The source's current version; a source that cannot be reached is not an error here."""
    source = make_source(config.source)
    try:
        await source.connect()
        version = await source.current_version()
    except (ConnectError, TransientError) as exc:
        return SourceView(config.source.kind, None, mask_passwords(str(exc)))
    finally:
        await source.close()
    return SourceView(config.source.kind, version, None)


async def gather(config: Config, manager: DataManager, source: SourceView) -> dict[str, Any]:
    """What ``--json`` prints: ``source``, ``tables`` and ``workers``, typed."""
    names = [t.table for t in config.tables]
    owned = await control.ownership(manager, names)
    dead = await deadletters.counts(manager)
    tables = []
    for name in names:
        checkpoint = await manager.get_checkpoint(name)
        version = checkpoint.version if checkpoint else None
        ownership = owned.get(name)
        tables.append(
            {
                "table": name,
                "state": checkpoint.state if checkpoint else "no checkpoint",
                "checkpoint": version,
                "source_version": source.version,
                "lag_versions": lag(version, source.version),
                "updated_at": checkpoint.updated_at if checkpoint else None,
                "snapshot": typed_snapshot(await control.snapshot_progress(manager, name)),
                "owner": ownership.owner if ownership else None,
                "worker_state": ownership.state if ownership else None,
                "error": mask_passwords(ownership.error) if ownership and ownership.error else None,
                "dead_letters": dead.get(name, 0),
            }
        )
    workers = [typed_worker(w) for w in await control.workers(manager)]
    return {
        "source": {"kind": source.kind, "version": source.version, "error": source.error},
        "tables": tables,
        "workers": workers,
    }


def lag(checkpoint: int | None, source_version: int | None) -> int | None:
    if checkpoint is None or source_version is None:
        return None
    return max(0, source_version - checkpoint)


def typed_snapshot(progress: Mapping[str, str] | None) -> dict[str, int | None] | None:
    """A running snapshot's ``{"rows", "total"}`` as numbers (total null: not estimated)."""
    if progress is None:
        return None
    return {"rows": _integer(progress.get("rows")), "total": _integer(progress.get("total"))}


def typed_worker(fields: Mapping[str, str]) -> dict[str, Any]:
    """A heartbeat's fields as JSON values: ``tables`` a list, counts and
    times numbers, null where a field is empty or unreadable; errors with
    passwords masked; others as written."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "tables":
            out[name] = [t for t in value.split(",") if t]
        elif name in WORKER_INTEGERS or name.startswith("applied:"):
            out[name] = _integer(value)
        elif name in WORKER_FLOATS:
            out[name] = _number(value)
        elif name.startswith("error:"):
            out[name] = mask_passwords(value)  # as each table's ``error``
        else:
            out[name] = value
    out.setdefault("tables", [])
    return out


def _integer(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _write(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- the text view ---------------------------------------------------------------


def print_text(report: dict[str, Any]) -> None:
    from rich.text import Text

    tables: list[dict[str, Any]] = report["tables"]
    views: list[RenderableType] = []
    error = report["source"]["error"]
    if error is not None:
        views.append(Text(f"source unreachable: {error}", style="bold red"))  # Text: "[...]" is no markup
    views.append(tables_view(tables))
    if any(row["error"] for row in tables):
        views.append(errors_view(tables))
    views.append(workers_view(report["workers"]))
    console = _console(views)
    for view in views:
        console.print(view)


def _console(views: list[RenderableType]) -> Console:
    """A terminal's console; piped, one as wide as the widest view needs, so
    that nothing is cut (rich assumes 80 columns when it is not a terminal)."""
    from rich.console import Console

    console = Console()
    if console.is_terminal:
        return console
    wide = Console(width=1_000_000)
    needed = max(wide.measure(view).maximum for view in views)
    return Console(width=max(needed, 1))


def short_error(error: str, limit: int = ERROR_SHOWN) -> str:
    """The first line of ``error`` (a driver's later lines repeat the statement
    or point into it), at most ``limit`` characters."""
    first = next((line.strip() for line in error.splitlines() if line.strip()), "")
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def _table(title: str, columns: tuple[str, ...], **options: Any) -> Table:
    """A table whose columns never cut a value (a worker id or a table name
    cut short names nobody): a long one wraps within its column."""
    from rich.table import Table

    table = Table(title=title, **options)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def tables_view(rows: list[dict[str, Any]]) -> Table:
    """One line per table; a degraded one in red (its error in ``errors_view``)."""
    columns = (
        "table", "state", "checkpoint", "source", "lag (versions)", "updated",
        "snapshot", "dead letters", "owner", "worker state",
    )  # fmt: skip
    table = _table("tables", columns)
    for row in rows:
        table.add_row(
            row["table"],
            row["state"],
            _shown(row["checkpoint"]),
            "unreachable" if row["source_version"] is None else str(row["source_version"]),
            _shown(row["lag_versions"]),
            row["updated_at"] or "",
            _progress(row["snapshot"]),
            str(row["dead_letters"]),
            row["owner"] or "none",
            _worker_state(row),
            style="bold red" if row["error"] or row["worker_state"] == "degraded" else None,
        )
    return table


def _worker_state(row: dict[str, Any]) -> str:
    """What the sidecar holding the table says, or why nothing does: ``state``
    is the checkpoint's (``streaming`` stays written after every sidecar
    stopped), so an operator must see here that nobody is running it."""
    if row["owner"] is None:
        return "no sidecar holds it"
    return row["worker_state"] or "no heartbeat (the holder died: its lease runs out)"


def _shown(value: int | None) -> str:
    return "" if value is None else str(value)


def _progress(snapshot: dict[str, int | None] | None) -> str:
    if snapshot is None:
        return ""
    total = snapshot["total"]
    return f"{_shown(snapshot['rows'])}/{'?' if total is None else total}"


def errors_view(rows: list[dict[str, Any]]) -> Table:
    from rich.text import Text

    table = _table(
        "degraded tables (cdc status --json has each error whole)", ("table", "owner", "error"), style="red"
    )
    for row in rows:
        if row["error"]:
            # Text, not a markup string: an error may hold "[...]" (tables[0], a type)
            table.add_row(row["table"], row["owner"] or "", Text(short_error(row["error"])))
    return table


def workers_view(workers: list[dict[str, Any]]) -> Table:
    table = _table("workers", ("worker", "tables", "applied", "queue", "heartbeat age (s)"))
    for worker in workers:
        age = worker.get("age")
        table.add_row(
            worker.get("id", ""),
            ", ".join(worker["tables"]),
            _shown(worker.get("applied")),
            _shown(worker.get("queue_depth")),
            "" if age is None else f"{age:.1f}",
        )
    return table
