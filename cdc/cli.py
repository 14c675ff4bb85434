"""The command line of DESIGN.md §6.

Exit codes: 0 ok, 1 failure while running, 2 bad config or usage, 3 cannot
connect, 4 done but changes are in the dead letter because of it (``run
--once``, ``deadletter replay``). Every CdcError carries its code; click's own usage errors exit 2.
The commands are thin: they load the config and call into ``cdc.commands``.

No secret leaves the process: before anything is read, the secrets of the
environment are remembered, then those of the config file, and everything
written to stderr (and to stdout, but for commands whose output is data) is
redacted of them (``cdc.logs.RedactedStream``, ``publishers.redaction``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from cdc import __version__
from cdc.config import Config, load_config
from cdc.errors import CdcError
from cdc.logs import redact_output, setup_logging
from publishers import redaction
from publishers.redaction import redact

T = TypeVar("T")
log = logging.getLogger("cdc.cli")
# Commands whose stdout is data (change messages, the demo's live view): it is
# printed exactly as it is, never redacted.
DATA_COMMANDS = frozenset({"subscribe", "demo", "consume"})

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# A section as the config's schema writes it ($defs/segment).
SECTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

config_option = click.option(
    "-c",
    "--config",
    "config_path",
    required=True,
    envvar="CDC_CONFIG",
    type=click.Path(dir_okay=False),
    help="The YAML file that registers the tables (default: $CDC_CONFIG, which the image sets).",
)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; map a CdcError to its message on stderr and its exit code."""
    try:
        return asyncio.run(coro)
    except CdcError as exc:
        click.echo(f"error: {redact(str(exc))}", err=True)
        sys.exit(exc.exit_code)


def _load(path: str) -> Config:
    """The config at ``path``, its secrets remembered first (a config error may quote them)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""  # load_config says why it cannot be read
    redaction.remember_secrets(redaction.config_secrets(text, os.environ))
    try:
        config = load_config(path)
    except CdcError as exc:
        click.echo(f"error: {redact(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    redaction.remember(config.source.dsn, config.redis.url)
    redaction.remember_public(_public_names(config))
    return config


# The role and database a DSN names: key=value (libpq, ODBC) and URI forms
_DSN_NAMES = re.compile(r"(?i)(?:^|[\s;])(?:user|uid|user id|dbname|database)\s*=\s*'?([^\s;']+)")
_URI_USER = re.compile(r"://([^:@/\s]+)[:@]")
_URI_DATABASE = re.compile(r"@[^/@\s]*/([\w$-]+)")


def _public_names(config: Config) -> list[str]:
    """Names every reader of the output may see (the tables, their schemas and
    sections, the namespace, the DSN's role and database): shown even where
    they match a piece of a password (``redaction.Secrets.add_public``)."""
    names = [config.redis.namespace]
    for table in config.tables:
        names += [table.table, table.schema, table.name, table.section]
    dsn = config.source.dsn
    names += _DSN_NAMES.findall(dsn) + _URI_USER.findall(dsn) + _URI_DATABASE.findall(dsn)
    return names


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cdc")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="INFO",
    show_default=True,
    help="The least severe level logged.",
)
@click.option("--json-logs/--text-logs", default=None, help="Default: JSON unless stderr is a terminal.")
@click.pass_context
def cli(ctx: click.Context, log_level: str, json_logs: bool | None) -> None:
    """cdc-sync: mirror SQL Server / PostgreSQL tables into Redis, change by change."""
    redaction.remember_environment(os.environ)
    redact_output(stdout=ctx.invoked_subcommand not in DATA_COMMANDS)
    setup_logging(log_level, json_logs)


@cli.command()
@config_option
@click.option(
    "--once", is_flag=True, help="Catch every table up, then exit 0 (4 when changes were dead-lettered)."
)
def run(config_path: str, once: bool) -> None:
    """Run the sidecar."""
    from cdc.commands import run_daemon

    sys.exit(_run(run_daemon(_load(config_path), once=once)))


@cli.command()
@config_option
def validate(config_path: str) -> None:
    """Check the file, the connections, the tables and their tracking."""
    from cdc.commands import validate as do_validate

    sys.exit(_run(do_validate(_load(config_path))))


@cli.command()
@click.argument("action", type=click.Choice(["enable", "disable", "status"]))
@config_option
@click.option("--table", "table", default=None, help="schema.table as in the config; default: every table.")
@click.option(
    "--force",
    is_flag=True,
    help="disable: even while a live sidecar streams the table (it then reports the table degraded), "
    "or when Redis cannot be reached to tell.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--grant-to",
    "grant_to",
    default=None,
    metavar="ROLE",
    help="enable: also grant this role (SQL Server: database user) what `cdc run` needs on the tables; "
    "PostgreSQL: also on the tables created later (docs/POSTGRES.md).",
)
def tracking(
    action: str, config_path: str, table: str | None, force: bool, as_json: bool, grant_to: str | None
) -> None:
    """Set up (enable), remove (disable) or show (status) change tracking on the source.

    disable refuses (exit 1) while a live sidecar streams the table, naming
    it, and (exit 3) when Redis cannot be reached to tell; --force overrides.
    enable --grant-to ROLE grants the sidecar's runtime role what it needs."""
    from cdc.commands import tracking as do_tracking

    if force and action != "disable":
        raise click.UsageError(f"--force is for disable only, not {action}")
    if grant_to is not None and action != "enable":
        raise click.UsageError(f"--grant-to is for enable only, not {action}")
    if grant_to is not None and not grant_to.strip():
        raise click.UsageError("--grant-to: a role name cannot be blank")
    config = _load(config_path)
    sys.exit(_run(do_tracking(config, action, table=table, force=force, as_json=as_json, grant_to=grant_to)))


@cli.command()
@config_option
@click.option("--table", "table", default=None, help="schema.table; default: every table.")
@click.option(
    "--from",
    "start",
    default=None,
    help="Only the rows from this primary key on (inclusive; with --table). Several key columns: values in"
    " key order, separated by commas.",
)
@click.option(
    "--to", "until", default=None, help="Only the rows up to this primary key (inclusive; with --table)."
)
def snapshot(config_path: str, table: str | None, start: str | None, until: str | None) -> None:
    """Re-snapshot a table (or all), or a key range of one table."""
    from cdc.commands import snapshot as do_snapshot
    from cdc.snapshot_range import KeyRange

    if (start is not None or until is not None) and table is None:
        raise click.UsageError("--from and --to need --table: a key range is one table's")
    key_range = None if start is None and until is None else KeyRange(start, until)
    sys.exit(_run(do_snapshot(_load(config_path), table, key_range)))


@cli.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(config_path: str, as_json: bool) -> None:
    """Per table: checkpoint, source version, lag, state, dead letters, the sidecar
    that owns it and that sidecar's view (worker state, error); and the workers'
    heartbeats. The source unreachable: all of that but the source's version,
    then exit 3."""
    from cdc.status_cmd import status as do_status

    sys.exit(_run(do_status(_load(config_path), as_json=as_json)))


def _partition(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value == "":
        raise click.BadParameter("a partition value cannot be empty")
    return value


def _section(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not SECTION.fullmatch(value):
        raise click.BadParameter(
            "a section is letters, digits, _, . and -, not starting with . or - (as in the config)"
        )
    return value


@cli.command()
@config_option
@click.option("--partition", required=True, callback=_partition, help="The partition value to follow.")
@click.option("--section", default=None, callback=_section, help="Only this section's messages.")
@click.option(
    "--from-seq",
    type=click.IntRange(min=1),
    default=None,
    help="Start at the message of this seq, then go on (seqs start at 1; at most the partition's seq + 1;"
    " default: only messages newer than the start).",
)
def subscribe(config_path: str, partition: str, section: str | None, from_seq: int | None) -> None:
    """Print change messages as JSON lines, catching up from the stream. A
    partition or section that has never been written, or a --from-seq past
    the next message, is an error (exit 2), not a silent wait."""
    from cdc.commands import subscribe as do_subscribe

    sys.exit(_run(do_subscribe(_load(config_path), partition, section, from_seq)))


@cli.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor(config_path: str, as_json: bool) -> None:
    """Find what will go wrong: retention, eviction policy, snapshot isolation, permissions."""
    from cdc.commands import doctor as do_doctor

    sys.exit(_run(do_doctor(_load(config_path), as_json=as_json)))


@cli.command()
@config_option
@click.option("--ready", is_flag=True, help="Probe /readyz instead of /healthz.")
@click.option(
    "--timeout", default=4.0, show_default=True, type=click.FloatRange(min=0.1), help="Seconds to wait."
)
def health(config_path: str, ready: bool, timeout: float) -> None:
    """Probe the running sidecar's /healthz (or /readyz) at the config's
    worker.health, a wildcard bind (0.0.0.0, ::) on loopback: exit 0 healthy,
    1 not, 2 when the config cannot say where (the image's HEALTHCHECK)."""
    from cdc.healthcheck_cmd import check

    config = _load(config_path)
    try:
        outcome = check(config, ready=ready, timeout=timeout)
    except CdcError as exc:  # the config cannot say where to probe
        click.echo(f"error: {redact(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    click.echo(outcome.line)
    sys.exit(outcome.exit_code)


@cli.command()
@config_option
@click.option(
    "--table", "table", required=True, help="schema.table: usually one the config no longer registers."
)
@click.option(
    "--section",
    default=None,
    callback=_section,
    help="The table's section, when the config does not register the table and Redis cannot tell.",
)
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option(
    "--force", is_flag=True, help="Purge a table the config still registers (it is snapshotted again)."
)
def purge(config_path: str, table: str, section: str | None, dry_run: bool, force: bool) -> None:
    """Remove what a table left in Redis: its documents (each published as a
    delete), section index, partitions' keys no other section uses, checkpoint,
    lease, fencing counter and dead letters (docs/TABLES.md).

    Refused (exit 1) while a live sidecar holds the table; refused (exit 2)
    for a table the config still registers, unless --force."""
    from cdc.purge_cmd import Request, purge_table

    request = Request(table, section=section, force=force, dry_run=dry_run)
    sys.exit(_run(purge_table(_load(config_path), request)))


@cli.group()
def deadletter() -> None:
    """See, replay and purge the changes that could not be applied (docs/DEADLETTERS.md).

    replay and run --once exit 4 when changes stay in (or went back to) the dead letter."""


def _entry_id(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    from publishers.deadletters import check_id

    try:
        for entry_id in [value] if isinstance(value, str) else value or ():
            check_id(entry_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@deadletter.command("list")
@config_option
@click.option("--table", "table", default=None, help="Only this table's entries (schema.table).")
@click.option("--after", default=None, callback=_entry_id, help="Entries after this id (the next page).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1), help="Entries shown.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def deadletter_list(
    config_path: str, table: str | None, after: str | None, limit: int, as_json: bool
) -> None:
    """List the dead letter's entries, oldest first."""
    from cdc.deadletter_cmd import list_entries

    config = _load(config_path)
    sys.exit(_run(list_entries(config, table=table, after=after, limit=limit, as_json=as_json)))


@deadletter.command("show")
@config_option
@click.argument("entry_id", callback=_entry_id)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def deadletter_show(config_path: str, entry_id: str, as_json: bool) -> None:
    """Show one entry whole (its values too)."""
    from cdc.deadletter_cmd import show

    sys.exit(_run(show(_load(config_path), entry_id, as_json=as_json)))


@deadletter.command("replay")
@config_option
@click.option("--table", "table", default=None, help="schema.table; default: every table.")
@click.option("--id", "ids", multiple=True, callback=_entry_id, help="Only this entry (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def deadletter_replay(config_path: str, table: str | None, ids: tuple[str, ...], as_json: bool) -> None:
    """Read the current rows of the entries' keys from the source and apply them;
    an entry is removed once applied; a row still bad goes back with its reason."""
    from cdc.deadletter_cmd import replay

    sys.exit(_run(replay(_load(config_path), table=table, ids=ids, as_json=as_json)))


@deadletter.command("purge")
@config_option
@click.option("--table", "table", default=None, help="Remove this table's entries.")
@click.option("--id", "ids", multiple=True, callback=_entry_id, help="Remove this entry (repeatable).")
@click.option("--all", "everything", is_flag=True, help="Remove every entry.")
def deadletter_purge(config_path: str, table: str | None, ids: tuple[str, ...], everything: bool) -> None:
    """Remove entries without replaying them: --table T, --id ID or --all."""
    from cdc.deadletter_cmd import purge

    if sum((table is not None, bool(ids), everything)) != 1:
        raise click.UsageError("purge: give exactly one of --table T, --id ID (repeatable) or --all")
    sys.exit(_run(purge(_load(config_path), table=table, ids=ids, everything=everything)))


@cli.command()
@click.option("--dir", "directory", default=".demo", show_default=True, help="Where servers and files live.")
@click.option("--rate", default=20.0, show_default=True, help="Writer transactions per second.")
@click.option("--duration", default=None, type=float, help="Stop after this many seconds.")
@click.option(
    "--sidecars", default=2, show_default=True, type=click.IntRange(1, 8), help="Sidecars sharing the tables."
)
@click.option(
    "--kill-after",
    default=None,
    type=float,
    help="SIGKILL the sidecar streaming demo.forecasts after this many seconds (what the k key does).",
)
def demo(
    directory: str, rate: float, duration: float | None, sidecars: int, kill_after: float | None
) -> None:
    """The product on one screen: local PostgreSQL and Redis, demo tables, sidecars,
    a writer, a subscriber per partition. k kills a sidecar (another takes over);
    Ctrl-C stops everything in order and checks the replicas against PostgreSQL
    (exit 1 if they differ)."""
    from cdc.demo import run_demo

    sys.exit(
        _run(run_demo(directory, rate=rate, duration=duration, sidecars=sidecars, kill_after=kill_after))
    )


def _sections(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for section in value:
        _section(ctx, param, section)
    return value


@cli.command()
@config_option
@click.option("--group", required=True, help="The consumer group: its consumers share the messages.")
@click.option(
    "--section", "sections", multiple=True, callback=_sections, help="A section to consume (repeatable)."
)
@click.option("--partition", "partitions", multiple=True, help="Only this partition (repeatable).")
@click.option("--consumer", default="", help="This consumer's name (default: host-pid-random).")
@click.option(
    "--dead-letter", default=None, help="The dead letter stream (default: NS:@consumers:GROUP:deadletter)."
)
@click.option("--max-in-flight", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--max-deliveries", default=5, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--claim-after", default=30.0, show_default=True, type=click.FloatRange(min=0.1), help="Seconds."
)
@click.option("--start", default="all", show_default=True, type=click.Choice(["all", "new"]))
def consume(config_path: str, group: str, **options: Any) -> None:
    """Handle each change once across the group's consumers; print each (docs/CONSUMERS.md)."""
    from cdc.consume import consume as do_consume

    sys.exit(_run(do_consume(_load(config_path), group, **options)))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
