"""The demo's screen, as a pure function of a ``View``: ``render(view, width,
height)`` returns at most ``height`` lines of at most ``width`` characters.

Top to bottom: the start-up information (config, PostgreSQL, Redis, each
sidecar's health URL), the tables, the partitions, the featured row in its
three places, the latest change messages (they get what the rest leaves),
and the commands to try in another terminal. The footer's commands are never
cut (a cut command cannot be pasted): a command wider than the screen is
wrapped at a space outside quotes with a trailing `` \\``, which a shell
joins back when it is pasted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from cdc.demo.compare import same_value
from cdc.demo.view import Header, MessageView, PartitionView, RowView, SidecarView, TableView, View

ELLIPSIS = "…"
SHOWN_EVENTS = 3  # the latest kills, take-overs and starts
MIN_MESSAGES = 3  # below this, blank separator lines are given up to show more


def render(view: View, width: int, height: int) -> list[str]:
    """The screen for ``view``, cut to ``width`` x ``height``. On a small
    terminal, what costs lines is given up, in this order, until at least
    ``MIN_MESSAGES`` messages fit: blank separators, all but the latest
    event, the titles of the messages and of the footer. The header (top)
    and the footer (bottom) always stay whole."""
    width = max(20, width)
    blocks = [
        [*_title(view), *_header(view.header, width), *_sidecars(view.sidecars)],
        [*_tables(view.tables, width), *_partitions(view.partitions, width)],
        _row(view.header.featured, view.row),
    ]
    for level in range(COMPACT_LEVELS):
        body, footer, room = _assemble(view, blocks, width, height, level)
        if room >= MIN_MESSAGES:
            break
    body = body[: max(0, height - len(footer))]
    return [_cut(line, width) for line in [*body, *footer][:height]]


COMPACT_LEVELS = 4


def _assemble(
    view: View, blocks: list[list[str]], width: int, height: int, level: int
) -> tuple[list[str], list[str], int]:
    """(body, footer, room for messages) at compaction ``level`` (0: none)."""
    events = [f"  {event}" for event in view.events[-(SHOWN_EVENTS if level < 2 else 1) :]]
    footer = footer_lines(view, width, titled=level < 3)
    titled = level < 3
    body: list[str] = []
    for block in blocks:
        body += [*block, ""] if level == 0 else block
    room = max(0, height - len(body) - len(events) - len(footer) - int(titled))
    shown = view.messages[-room:] if room else []
    if titled:
        body.append(f"change messages (the last {len(shown)}, newest at the bottom)")
    body += [message_line(m) for m in shown]
    body += events
    return body, footer, room


# -- blocks --------------------------------------------------------------------


def _title(view: View) -> list[str]:
    keys = "Ctrl-C stops, k kills a sidecar" if view.keys else "Ctrl-C stops"
    return [f"cdc demo  {view.elapsed:5.0f}s  ({keys})  config: {view.header.config_path}"]


def _header(header: Header, width: int) -> list[str]:
    postgres, redis = f"PostgreSQL {header.dsn}", f"Redis {header.redis_url}"
    joined = f"{postgres}  {redis}"
    return [joined] if len(joined) <= width else [postgres, redis]


def _sidecars(sidecars: Sequence[SidecarView]) -> list[str]:
    lines = [_sidecar_line(s) for s in sidecars if s.alive]
    killed = [f"{s.name} (pid {s.pid})" for s in sidecars if not s.alive]
    return [*lines, "killed: " + ", ".join(killed)] if killed else lines


def _sidecar_line(sidecar: SidecarView) -> str:
    ready = {None: "unreachable", 200: "ready", 503: "not ready (503)"}.get(sidecar.ready, str(sidecar.ready))
    owns = "owns " + ", ".join(sidecar.tables) if sidecar.tables else "standby"
    return f"sidecar {sidecar.name} pid {sidecar.pid} {sidecar.health_url} {ready}, {owns}"


TABLE_COLUMNS = ("table", "state", "changes/s", "lag s", "snapshot", "PostgreSQL", "Redis", "replica")
RIGHT_ALIGNED = frozenset({2, 3, 5, 6, 7})  # the numbers


def _tables(tables: Sequence[TableView], width: int) -> list[str]:
    rows = [TABLE_COLUMNS, *(_table_cells(t) for t in tables)]
    wide = _columns(rows, RIGHT_ALIGNED, "  ")
    return wide if max(len(line) for line in wide) <= width else _columns(rows, RIGHT_ALIGNED, " ")


def _table_cells(table: TableView) -> tuple[str, ...]:
    lag = "-" if table.lag_seconds is None else f"{table.lag_seconds:.2f}"
    return (
        table.table,
        table.state,
        f"{table.rate:.1f}",
        lag,
        table.snapshot,
        _count(table.pg_rows),
        _count(table.redis_docs),
        str(table.replica_docs),
    )


def _partitions(partitions: Sequence[PartitionView], width: int) -> list[str]:
    prefix = "partitions: "
    if not partitions:
        return [prefix + "none written yet"]
    lines: list[str] = []
    current: list[str] = []
    for cell in (_partition_cell(p) for p in partitions):
        if current and len(prefix) + len(" | ".join([*current, cell])) > width:
            lines.append(" | ".join(current))
            current = []
        current.append(cell)
    lines.append(" | ".join(current))
    return [(prefix if i == 0 else " " * len(prefix)) + line for i, line in enumerate(lines)]


def _partition_cell(partition: PartitionView) -> str:
    reloads = f", {partition.reloads} reload(s)" if partition.reloads else ""
    return f"{partition.partition} seq {partition.seq} ({partition.docs} docs{reloads})"


def _row(featured: str, row: RowView | None) -> list[str]:
    if row is None:
        return [f"row {featured}: not read yet"]
    columns = list((row.postgres or row.replica or {}).keys())
    lines = [f"row {featured}: {agreement(row)}"]
    lines.append("  PostgreSQL " + _fields(columns, row.postgres, encoded=False))
    redis = row.redis or {}
    extra = [f for f in ("@v",) if f in redis]
    lines.append("  Redis hash " + _fields([*columns, *extra], redis, encoded=True))
    lines.append("  replica    " + _fields(columns, row.replica, encoded=False))
    return lines


def agreement(row: RowView) -> str:
    """Whether the three agree; else which columns differ, and where."""
    if row.postgres is None:
        return "not in PostgreSQL"
    redis = _decoded(row.redis)
    behind = []
    for name, value in row.postgres.items():
        places = [
            p for p, doc in (("Redis", redis), ("replica", row.replica)) if not _holds(doc, name, value)
        ]
        if places:
            behind.append(f"{name} ({' and '.join(places)} behind)")
    if not behind:
        return "all three agree"
    return "a change in flight: " + ", ".join(behind)


def _holds(document: dict[str, Any] | None, name: str, value: Any) -> bool:
    return document is not None and name in document and same_value(value, document[name])


def _decoded(fields: dict[str, str] | None) -> dict[str, Any] | None:
    if fields is None or fields.get("@del") == "1":
        return None
    from publishers import exact_json

    return {k: exact_json.loads(v) for k, v in fields.items() if not k.startswith("@")}


def _fields(columns: Sequence[str], values: dict[str, Any] | None, *, encoded: bool) -> str:
    if values is None:
        return "(none)"
    shown = [f"{c}={values[c] if encoded else value_text(values[c])}" for c in columns if c in values]
    return " ".join(shown)


def footer_lines(view: View, width: int, *, titled: bool = True) -> list[str]:
    """The commands to try, each exactly runnable from where the demo started."""
    header = view.header
    health = next((s.health_url for s in view.sidecars if s.alive), None)
    partition = view.partitions[0].partition if view.partitions else "grid"
    commands = [
        f"{header.cdc} status -c {header.config_path}",
        *([f"curl -s {health}/metrics | grep cdc_"] if health else []),
        f"{header.cdc} subscribe -c {header.config_path} --partition {partition}",
        f'{header.psql} -c "{header.update_sql}"',
    ]
    lines = ["try in another terminal (from here):"] if titled else []
    for command in commands:
        lines += wrap_command(command, width, indent="  ")
    return lines


# -- one line each ---------------------------------------------------------------


def message_line(message: MessageView) -> str:
    """``seq partition section key op patch``, the patch summarised."""
    return (
        f"{message.seq:>6} {message.partition:<9} {message.section:<9} {message.key:<8} "
        f"{message.op} {patch_summary(message.op, message.patch)}"
    )


def patch_summary(op: str, patch: Sequence[dict[str, Any]]) -> str:
    """An insert (the root replaced by a document) ``+ col=value ...``, a
    delete (the root replaced by null) ``-``, an update ``col=value`` per
    replaced column, ``+col=value`` per added one and ``-col`` per removed one;
    a snapshot's marker (``R``: the section's documents were written in bulk)
    says so."""
    if op == "R":
        return "snapshot written: subscribers reload the section"
    if op == "D" or any(p.get("path") == "" and p.get("value") is None for p in patch):
        return "-"
    parts = []
    for operation in patch:
        path, kind = operation.get("path", ""), operation.get("op")
        if path == "":
            document = operation.get("value") or {}
            parts.append("+ " + " ".join(f"{k}={value_text(v)}" for k, v in document.items()))
        elif kind == "remove":
            parts.append(f"-{column_name(path)}")
        else:
            sign = "+" if kind == "add" else ""
            parts.append(f"{sign}{column_name(path)}={value_text(operation.get('value'))}")
    return " ".join(parts)


def column_name(path: str) -> str:
    """The column of an RFC 6901 path ``/a~1b`` (``~1`` is ``/``, ``~0`` is ``~``)."""
    return "/".join(p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:])


def value_text(value: Any) -> str:
    """A value as JSON text (strings quoted), Decimals exactly."""
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def wrap_command(command: str, width: int, *, indent: str = "") -> list[str]:
    """``command`` in lines of at most ``width``, split at spaces outside
    double quotes, each but the last ending `` \\`` (a shell joins them)."""
    words, lines, line = _shell_words(command), [], indent
    for word in words:
        candidate = word if line == indent else f"{line} {word}"
        if line != indent and len(candidate) + 2 > width:
            lines.append(f"{line} \\")
            line = f"{indent}    {word}"
        else:
            line = indent + candidate if line == indent else candidate
    lines.append(line)
    return lines


def _shell_words(command: str) -> list[str]:
    words, current, quoted = [], "", False
    for char in command:
        if char == '"':
            quoted = not quoted
        if char == " " and not quoted:
            if current:
                words.append(current)
            current = ""
        else:
            current += char
    if current:
        words.append(current)
    return words


# -- helpers ---------------------------------------------------------------------


def _columns(rows: Sequence[Sequence[str]], right: frozenset[int], separator: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append(separator.join(cells).rstrip())
    return out


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + ELLIPSIS
