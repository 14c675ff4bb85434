"""The typed configuration, built once from the YAML file and passed down.

``load_config(path)`` reads the file (``cdc.config_yaml``: the data and the
line of every field, bounded), expands ``${VAR}`` / ``${VAR:-default}`` in
string values, validates the result against ``schemas/config.schema.json``
(``cdc.config_schema``; the one source of truth for what the file may hold),
checks what a schema cannot say (``cdc.config_addresses``: the health address,
the Redis URL's database), and builds frozen dataclasses with durations
already in seconds. Every error is a ConfigError naming the file, the line and
the field; a value is quoted cut short, a DSN or Redis URL never.
"""

from __future__ import annotations

import gc
import os
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from cdc.config_addresses import parse_health_address
from cdc.config_redis import build_redis
from cdc.config_schema import NOT_SHOWN, is_secret, validate
from cdc.config_schema import config_schema as config_schema  # re-exported: tests and docs read it here
from cdc.config_yaml import FieldError, Lines, cut, load_yaml, locate, shown
from cdc.durations import parse_duration
from cdc.errors import ConfigError
from cdc.templates import Template
from publishers.redaction import secrets_in
from publishers.settings import RedisConfig as RedisConfig  # re-exported: owned by publishers, built here

Operation = Literal["I", "U", "D"]
DEFAULT_BACKOFF: tuple[tuple[int | None, float], ...] = (
    (5, 0.05),
    (20, 0.2),
    (100, 1.0),
    (None, 5.0),
)
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_ENV_START = re.compile(r"\$\{")
_LISTED = 20  # tables named in "no table X is registered"


@dataclass(frozen=True)
class SourceConfig:
    kind: Literal["mssql", "postgres"]
    dsn: str = field(repr=False)  # may hold a password: never printed
    tracking_schema: str = "cdc_tracking"
    retention: float = 2 * 86400.0
    cleanup_interval: float = 1800.0
    connect_timeout: float = 10.0
    query_timeout: float = 60.0
    notify: bool = True  # postgres: LISTEN for the triggers' wake-ups; false: poll on the backoff alone
    capture: Literal["triggers", "logical"] = "triggers"  # postgres: row triggers, or logical decoding
    # postgres logical capture: whose slots these are (cdc.cleanup_job.deployment_name)
    deployment: str = field(default="", compare=False)


@dataclass(frozen=True)
class WorkerConfig:
    max_batch_size: int = 500
    max_wait: float = 0.1
    queue_capacity: int = 10_000
    health: tuple[str, int] | None = ("127.0.0.1", 9478)
    page_size: int = 5000
    lease_ttl: float = 10.0
    max_row_bytes: int = 1 << 20
    heartbeat: float = 5.0


@dataclass(frozen=True)
class TableConfig:
    table: str  # "schema.name", validated identifiers
    schema: str
    name: str
    section: str
    partition: Template
    key: Template | None  # None: primary-key values joined by ":"
    columns: tuple[str, ...] | None  # None: every column
    operations: frozenset[Operation] = frozenset({"I", "U", "D"})
    backoff: tuple[tuple[int | None, float], ...] = DEFAULT_BACKOFF
    line: int = 0  # where the entry starts in the file, for error messages
    file: str = field(default="<config>", compare=False)
    index: int = field(default=0, compare=False)
    field_lines: tuple[tuple[str, int], ...] = field(default=(), compare=False, repr=False)

    def error(self, field_name: str, message: str) -> ConfigError:
        """A ConfigError about this entry's ``field_name`` found after loading
        (e.g. a template over a column that is not in the primary key)."""
        line = dict(self.field_lines).get(field_name, self.line)
        return ConfigError(f"{self.file}:{line}: tables[{self.index}].{field_name}: {message}")


@dataclass(frozen=True)
class LiteralSecret:
    """A field whose password is written in the file itself, not brought in by
    a ``${VAR}`` reference: where it is, never what it is."""

    field: str  # "source.dsn", "redis.url" or "redis.sentinel.url"
    line: int

    def warning(self, path: str) -> str:
        return (
            f"{path}:{self.line}: {self.field} holds a password written in the file (not from an environment "
            f"variable): whoever can read the file or its history can read it. Write the value as ${{VAR}} "
            "(e.g. ${CDC_SOURCE_DSN}, ${CDC_REDIS_URL}) and set the variable in the sidecar's environment"
        )


@dataclass(frozen=True)
class Config:
    source: SourceConfig
    redis: RedisConfig
    worker: WorkerConfig
    tables: tuple[TableConfig, ...]
    path: str = "<config>"
    # fields holding a password written in the file (cdc validate and cdc doctor warn)
    literal_secrets: tuple[LiteralSecret, ...] = field(default=(), compare=False)

    def table(self, name: str) -> TableConfig:
        for table_config in self.tables:
            if table_config.table.lower() == name.lower():
                return table_config
        known = ", ".join(t.table for t in self.tables[:_LISTED])
        more = f" and {len(self.tables) - _LISTED} more" if len(self.tables) > _LISTED else ""
        raise ConfigError(f"{self.path}: no table {shown(name)} is registered (registered: {known}{more})")


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    """Read, expand, validate and build the config at ``path``."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the config file: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{name}:{line}: (encoding): the config file must be UTF-8: {exc.reason}") from None
    return parse_config(text, name, os.environ if environ is None else environ)


def parse_config(text: str, name: str, environ: Mapping[str, str]) -> Config:
    """Build a Config from YAML ``text``; ``name`` is used in messages."""
    with _collector_paused():
        return _parse_config(text, name, environ)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Loading allocates a few objects per value and makes no reference cycle
    (a recursive alias is refused first): the cyclic collector, which walks
    every live object now and then, took a third of a 20,000-table load."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parse_config(text: str, name: str, environ: Mapping[str, str]) -> Config:
    data, lines = load_yaml(text, name)
    literal = _literal_secrets(data, lines)  # before expansion: what the file itself says
    data = _expand(data, (), lines, name, environ)
    for section in ("redis", "worker"):  # every option commented out: YAML reads null
        if section in data and data[section] is None:
            data[section] = {}
    validate(data, lines, name)
    try:
        return replace(_build(data, lines, name), literal_secrets=literal)
    except FieldError as exc:  # semantic checks, beyond what the schema says
        raise ConfigError(locate(name, lines, exc.where, exc.message)) from None


# -- secrets written in the file ---------------------------------------------

_SECRET_FIELDS: tuple[tuple[str, ...], ...] = (
    ("source", "dsn"),
    ("redis", "url"),
    ("redis", "sentinel", "url"),
)


def _literal_secrets(data: Any, lines: Lines) -> tuple[LiteralSecret, ...]:
    """The secret fields that hold a password in the file's own text. Each
    ``${VAR}`` is taken out first (what the environment brings is not in the
    file), a ``${VAR:-default}``'s default kept (that is in the file); a
    password found by syntax in what is left (``publishers.redaction.secrets_in``:
    ``user:pw@``, ``password=``, ``PWD=``...) was written there."""
    found = []
    for path in _SECRET_FIELDS:
        value = _at(data, path)
        if not isinstance(value, str):
            continue
        written = _ENV.sub(lambda match: match.group(2) or "", value)
        if secrets_in(written):
            found.append(LiteralSecret(".".join(path), lines.get(path, 0)))
    return tuple(found)


def _at(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


# -- ${VAR} expansion ------------------------------------------------------


def _expand(
    value: Any, path: tuple[str | int, ...], lines: Lines, name: str, environ: Mapping[str, str]
) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v, (*path, str(k)), lines, name, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, (*path, i), lines, name, environ) for i, v in enumerate(value)]
    if isinstance(value, str):
        return _expand_string(value, path, lines, name, environ)
    return value


def _expand_string(
    value: str, path: tuple[str | int, ...], lines: Lines, name: str, environ: Mapping[str, str]
) -> str:
    if "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        var, default = match.group(1), match.group(2)
        if environ.get(var, "") != "":
            return environ[var]
        if default is not None:
            return default
        state = "is empty" if var in environ else "is not set"
        raise ConfigError(
            locate(
                name, lines, path, f"environment variable {var} {state} (and no ${{{var}:-default}} is given)"
            )
        )

    references = {match.start() for match in _ENV.finditer(value)}
    for start in _ENV_START.finditer(value):
        if start.start() not in references:  # e.g. ${VAR:default}, ${VAR, ${1X}
            rest = value[start.start() :]
            bad = rest[: rest.index("}") + 1] if "}" in rest else rest
            hint = "write ${VAR} or ${VAR:-default}"
            message = (  # a piece of a DSN may be its password
                f"malformed reference ({hint}; {NOT_SHOWN})"
                if is_secret(path)
                else f"malformed reference {cut(bad)} ({hint})"
            )
            raise ConfigError(locate(name, lines, path, message))
    return _ENV.sub(substitute, value)


# -- building the typed config --------------------------------------------


def _build(data: dict[str, Any], lines: Lines, name: str) -> Config:
    source = data["source"]
    redis = data.get("redis") or {}
    worker = data.get("worker") or {}
    entry_lines = _entry_lines(lines)
    tables = tuple(_build_table(t, i, lines, entry_lines[i], name) for i, t in enumerate(data["tables"]))
    _check_unique(tables)
    _check_dsn(source["dsn"])
    if source.get("capture", "triggers") != "triggers" and source["kind"] != "postgres":
        raise FieldError(("source", "capture"), "logical capture is for postgres only: remove the key")
    redis_config = build_redis(redis, _duration)
    return Config(
        source=SourceConfig(
            kind=source["kind"],
            dsn=source["dsn"],
            tracking_schema=source.get("tracking_schema", "cdc_tracking"),
            retention=_duration(source.get("retention", "2d"), ("source", "retention")),
            cleanup_interval=_duration(source.get("cleanup_interval", "30m"), ("source", "cleanup_interval")),
            connect_timeout=_duration(source.get("connect_timeout", "10s"), ("source", "connect_timeout")),
            query_timeout=_duration(source.get("query_timeout", "60s"), ("source", "query_timeout")),
            notify=source.get("notify", True),
            capture=source.get("capture", "triggers"),
            deployment=_deployment(redis_config),
        ),
        redis=redis_config,
        worker=WorkerConfig(
            max_batch_size=worker.get("max_batch_size", 500),
            max_wait=_duration(worker.get("max_wait", "100ms"), ("worker", "max_wait")),
            queue_capacity=worker.get("queue_capacity", 10_000),
            health=_health(worker.get("health", "127.0.0.1:9478")),
            page_size=worker.get("page_size", 5000),
            lease_ttl=_duration(worker.get("lease_ttl", "10s"), ("worker", "lease_ttl")),
            max_row_bytes=worker.get("max_row_bytes", 1 << 20),
            heartbeat=_duration(worker.get("heartbeat", "5s"), ("worker", "heartbeat")),
        ),
        tables=tables,
        path=name,
    )


def _deployment(redis: RedisConfig) -> str:
    """``cdc.cleanup_job.deployment_name`` of the file's redis section (logical
    capture names its slots after it)."""
    from cdc.cleanup_job import deployment_name  # it imports this module

    return deployment_name(redis)


def _duration(value: Any, where: tuple[str | int, ...]) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:  # what the schema cannot say: .nan, .inf
        raise FieldError(where, str(exc)) from None


def _entry_lines(lines: Lines) -> dict[int, tuple[tuple[str, int], ...]]:
    """Index of a table entry -> (field, line) of each of its fields: one pass
    over the lines (a pass per entry made 20,000 tables take minutes)."""
    out: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for path, line in lines.items():
        if len(path) == 3 and path[0] == "tables" and isinstance(path[1], int) and isinstance(path[2], str):
            out[path[1]].append((path[2], line))
    return defaultdict(tuple, {index: tuple(fields) for index, fields in out.items()})


def _build_table(
    raw: dict[str, Any], index: int, lines: Lines, field_lines: tuple[tuple[str, int], ...], file: str
) -> TableConfig:
    where: tuple[str | int, ...] = ("tables", index)
    schema, table_name = raw["table"].split(".")
    section = raw.get("section", table_name.lower())
    partition = _template(raw.get("partition", section), (*where, "partition"))
    key = _template(raw["key"], (*where, "key")) if "key" in raw else None
    columns = tuple(raw["columns"]) if "columns" in raw else None
    for i, column in enumerate(columns or ()):
        if column.startswith("@"):
            raise FieldError((*where, "columns", i), f"{column!r}: names starting with @ are reserved")
    return TableConfig(
        table=raw["table"],
        schema=schema,
        name=table_name,
        section=section,
        partition=partition,
        key=key,
        columns=columns,
        operations=frozenset(raw.get("operations", ("I", "U", "D"))),
        backoff=_backoff(raw.get("backoff"), (*where, "backoff")),
        line=lines.get(where, 0),
        file=file,
        index=index,
        field_lines=field_lines,
    )


def _template(text: str, where: tuple[str | int, ...]) -> Template:
    try:
        return Template.parse(text)
    except ValueError as exc:
        raise FieldError(where, str(exc)) from None


def _backoff(
    raw: list[list[Any]] | None, where: tuple[str | int, ...]
) -> tuple[tuple[int | None, float], ...]:
    if raw is None:
        return DEFAULT_BACKOFF
    steps = tuple((limit, _duration(wait, (*where, i, 1))) for i, (limit, wait) in enumerate(raw))
    limits = [limit for limit, _ in steps]
    if limits[-1] is not None:
        raise FieldError((*where, len(steps) - 1), "the last step must be [null, wait] (what happens beyond)")
    if None in limits[:-1]:
        raise FieldError((*where, limits.index(None)), "only the last step may be [null, wait]")
    bounded = [limit for limit in limits if limit is not None]
    if bounded != sorted(set(bounded)):
        raise FieldError(where, "the step limits must increase")
    return steps


def _check_dsn(dsn: str) -> None:
    """Blank is no DSN: libpq would read it as "all defaults" and try a local
    socket, failing with exit 3 about a server nobody configured."""
    if not dsn.strip():
        raise FieldError(
            ("source", "dsn"),
            "the value is blank (only spaces): set it to the connection string, e.g. ${CDC_SOURCE_DSN}",
        )


def _check_unique(tables: tuple[TableConfig, ...]) -> None:
    seen: dict[str, int] = {}
    sections: dict[str, int] = {}
    for index, table_config in enumerate(tables):
        lowered = table_config.table.lower()
        if lowered in seen:
            first = tables[seen[lowered]]
            raise FieldError(
                ("tables", index, "table"),
                f"{cut(table_config.table)} is registered twice (first as tables[{seen[lowered]}] on line {first.line})",
            )
        seen[lowered] = index
        if table_config.section in sections:
            other = tables[sections[table_config.section]].table
            implicit = "section" not in dict(table_config.field_lines)
            hint = f" (the default section is the table name, lower-cased: set section for {cut(table_config.table)})"
            raise FieldError(
                ("tables", index, "section"),
                f"section {table_config.section!r} is already written by {cut(other)}; each section belongs to one table"
                + (hint if implicit else ""),
            )
        sections[table_config.section] = index


def _health(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    try:
        return parse_health_address(value)
    except ValueError as exc:
        raise FieldError(("worker", "health"), str(exc)) from None
