"""The typed configuration, built once from the YAML file and passed down.

``load_config(path)`` reads the file, expands ``${VAR}`` / ``${VAR:-default}``
in string values, validates the result against ``schemas/config.schema.json``
(the one source of truth for what the file may hold), and builds frozen
dataclasses with durations already in seconds. Every error is a ConfigError
naming the file, the line and the field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml

from cdc.durations import parse_duration
from cdc.errors import ConfigError
from cdc.templates import Template

Operation = Literal["I", "U", "D"]
DEFAULT_BACKOFF: tuple[tuple[int | None, float], ...] = (
    (5, 0.05),
    (20, 0.2),
    (100, 1.0),
    (None, 5.0),
)
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class SourceConfig:
    kind: Literal["mssql", "postgres"]
    dsn: str = field(repr=False)  # may hold a password: never printed
    tracking_schema: str = "cdc_tracking"
    retention: float = 2 * 86400.0
    cleanup_interval: float = 1800.0
    connect_timeout: float = 10.0
    query_timeout: float = 60.0


@dataclass(frozen=True)
class RedisConfig:
    url: str = field(default="redis://127.0.0.1:6379/0", repr=False)
    cluster: bool = False
    namespace: str = "cdc"
    stream_max_len: int = 100_000
    tombstone_ttl: float = 7 * 86400.0


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


@dataclass(frozen=True)
class Config:
    source: SourceConfig
    redis: RedisConfig
    worker: WorkerConfig
    tables: tuple[TableConfig, ...]
    path: str = "<config>"

    def table(self, name: str) -> TableConfig:
        for table in self.tables:
            if table.table.lower() == name.lower():
                return table
        known = ", ".join(t.table for t in self.tables)
        raise ConfigError(f"{self.path}: no table {name!r} is registered (registered: {known})")


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    """Read, expand, validate and build the config at ``path``."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the config file: {exc.strerror}") from exc
    return parse_config(text, name, os.environ if environ is None else environ)


def parse_config(text: str, name: str, environ: Mapping[str, str]) -> Config:
    """Build a Config from YAML ``text``; ``name`` is used in messages."""
    data, lines = _load_yaml(text, name)
    data = _expand(data, (), lines, name, environ)
    _validate(data, lines, name)
    try:
        return _build(data, lines, name)
    except ValueError as exc:  # semantic checks raise ValueError(path, message)
        where, message = exc.args if len(exc.args) == 2 else ((), str(exc))
        raise ConfigError(_locate(name, lines, where, message)) from None


# -- YAML with line numbers ------------------------------------------------

Lines = dict[tuple[str | int, ...], int]


def _load_yaml(text: str, name: str) -> tuple[Any, Lines]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name}:1: the config must be a mapping with source, redis, worker, tables")
    lines: Lines = {}
    _record_lines(node, (), lines)
    return data, lines


def _record_lines(node: yaml.Node | None, path: tuple[str | int, ...], lines: Lines) -> None:
    if node is None:
        return
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, str(key_node.value))
            _record_lines(value_node, child, lines)
            lines[child] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_lines(item, (*path, index), lines)


def _locate(name: str, lines: Lines, path: tuple[str | int, ...], message: str) -> str:
    probe = tuple(path)
    while probe and probe not in lines:
        probe = probe[:-1]
    line = lines.get(probe, 1)
    field_name = _dotted(path) or "(top level)"
    return f"{name}:{line}: {field_name}: {message}"


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


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
    def substitute(match: re.Match[str]) -> str:
        var, default = match.group(1), match.group(2)
        if var in environ and environ[var] != "":
            return environ[var]
        if default is not None:
            return default
        raise ConfigError(
            _locate(
                name,
                lines,
                path,
                f"environment variable {var} is not set (and no ${{{var}:-default}} is given)",
            )
        )

    return _ENV.sub(substitute, value)


# -- validation against the schema ----------------------------------------


@cache
def config_schema() -> dict[str, Any]:
    """The config JSON Schema, from the installed package or the source tree."""
    candidates = [
        resources.files("cdc").joinpath("schemas/config.schema.json"),
        Path(__file__).resolve().parent.parent / "schemas" / "config.schema.json",
    ]
    for candidate in candidates:
        if candidate.is_file():
            schema: dict[str, Any] = json.loads(candidate.read_text(encoding="utf-8"))
            return schema
    raise ConfigError("config.schema.json is missing from the installation")


def _validate(data: Any, lines: Lines, name: str) -> None:
    validator = jsonschema.Draft202012Validator(config_schema())
    errors = sorted(
        validator.iter_errors(data), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path)))
    )
    if not errors:
        return
    error = errors[0]
    path = tuple(error.absolute_path)
    message = _schema_message(error)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        unknown = sorted(set(error.instance) - set(_properties(error)))
        if unknown:
            path = (*path, unknown[0])
    raise ConfigError(_locate(name, lines, path, message))


def _schema_message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = ", ".join(sorted(_properties(error)))
        unknown = ", ".join(sorted(set(error.instance) - set(_properties(error))))
        return f"unknown key {unknown} (allowed: {allowed})"
    if error.validator == "pattern":
        return f"{error.instance!r} is not valid here (must match {error.validator_value})"
    if error.validator == "oneOf" and isinstance(error.instance, (str, int, float)):
        return f"expected a duration such as 50ms, 5s or 7d, got {error.instance!r}"
    return error.message


def _properties(error: jsonschema.ValidationError) -> list[str]:
    schema = error.schema
    return list(schema.get("properties", {})) if isinstance(schema, dict) else []


# -- building the typed config --------------------------------------------


def _build(data: dict[str, Any], lines: Lines, name: str) -> Config:
    source = data["source"]
    redis = data.get("redis") or {}
    worker = data.get("worker") or {}
    tables = tuple(_build_table(t, i, lines) for i, t in enumerate(data["tables"]))
    _check_unique(tables)
    return Config(
        source=SourceConfig(
            kind=source["kind"],
            dsn=source["dsn"],
            tracking_schema=source.get("tracking_schema", "cdc_tracking"),
            retention=parse_duration(source.get("retention", "2d")),
            cleanup_interval=parse_duration(source.get("cleanup_interval", "30m")),
            connect_timeout=parse_duration(source.get("connect_timeout", "10s")),
            query_timeout=parse_duration(source.get("query_timeout", "60s")),
        ),
        redis=RedisConfig(
            url=redis.get("url", RedisConfig.url),
            cluster=redis.get("cluster", False),
            namespace=redis.get("namespace", "cdc"),
            stream_max_len=redis.get("stream_max_len", 100_000),
            tombstone_ttl=parse_duration(redis.get("tombstone_ttl", "7d")),
        ),
        worker=WorkerConfig(
            max_batch_size=worker.get("max_batch_size", 500),
            max_wait=parse_duration(worker.get("max_wait", "100ms")),
            queue_capacity=worker.get("queue_capacity", 10_000),
            health=_parse_address(worker.get("health", "127.0.0.1:9478")),
            page_size=worker.get("page_size", 5000),
            lease_ttl=parse_duration(worker.get("lease_ttl", "10s")),
            max_row_bytes=worker.get("max_row_bytes", 1 << 20),
            heartbeat=parse_duration(worker.get("heartbeat", "5s")),
        ),
        tables=tables,
        path=name,
    )


def _build_table(raw: dict[str, Any], index: int, lines: Lines) -> TableConfig:
    where: tuple[str | int, ...] = ("tables", index)
    schema, table_name = raw["table"].split(".")
    section = raw.get("section", table_name.lower())
    partition = _template(raw.get("partition", section), (*where, "partition"))
    key = _template(raw["key"], (*where, "key")) if "key" in raw else None
    columns = tuple(raw["columns"]) if "columns" in raw else None
    for i, column in enumerate(columns or ()):
        if column.startswith("@"):
            raise ValueError((*where, "columns", i), f"{column!r}: names starting with @ are reserved")
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
    )


def _template(text: str, where: tuple[str | int, ...]) -> Template:
    try:
        return Template.parse(text)
    except ValueError as exc:
        raise ValueError(where, str(exc)) from None


def _backoff(
    raw: list[list[Any]] | None, where: tuple[str | int, ...]
) -> tuple[tuple[int | None, float], ...]:
    if raw is None:
        return DEFAULT_BACKOFF
    steps = tuple((limit, parse_duration(wait)) for limit, wait in raw)
    limits = [limit for limit, _ in steps]
    if limits[-1] is not None:
        raise ValueError((*where, len(steps) - 1), "the last step must be [null, wait] (what happens beyond)")
    if None in limits[:-1]:
        raise ValueError((*where, limits.index(None)), "only the last step may be [null, wait]")
    bounded = [limit for limit in limits if limit is not None]
    if bounded != sorted(set(bounded)):
        raise ValueError(where, "the step limits must increase")
    return steps


def _check_unique(tables: tuple[TableConfig, ...]) -> None:
    seen: dict[str, int] = {}
    sections: dict[str, int] = {}
    for index, table in enumerate(tables):
        lowered = table.table.lower()
        if lowered in seen:
            raise ValueError(("tables", index, "table"), f"{table.table} is registered twice")
        seen[lowered] = index
        if table.section in sections:
            other = tables[sections[table.section]].table
            raise ValueError(
                ("tables", index, "section"),
                f"section {table.section!r} is already written by {other}; each section belongs to one table",
            )
        sections[table.section] = index


def _parse_address(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, _, port = value.rpartition(":")
    return (host or "127.0.0.1", int(port))
