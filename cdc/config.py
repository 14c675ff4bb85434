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
from collections.abc import Iterator, Mapping
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
class Config:
    source: SourceConfig
    redis: RedisConfig
    worker: WorkerConfig
    tables: tuple[TableConfig, ...]
    path: str = "<config>"

    def table(self, name: str) -> TableConfig:
        for table_config in self.tables:
            if table_config.table.lower() == name.lower():
                return table_config
        known = ", ".join(t.table for t in self.tables)
        raise ConfigError(f"{self.path}: no table {name!r} is registered (registered: {known})")


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
    data, lines = _load_yaml(text, name)
    data = _expand(data, (), lines, name, environ)
    for section in ("redis", "worker"):  # every option commented out: YAML reads null
        if section in data and data[section] is None:
            data[section] = {}
    _validate(data, lines, name)
    try:
        return _build(data, lines, name)
    except _FieldError as exc:  # semantic checks, beyond what the schema says
        raise ConfigError(_locate(name, lines, exc.where, exc.message)) from None


class _FieldError(ValueError):
    """A semantic error at a path of the file, located by parse_config."""

    def __init__(self, where: tuple[str | int, ...], message: str) -> None:
        super().__init__(where, message)
        self.where = where
        self.message = message


# -- YAML with line numbers ------------------------------------------------

Lines = dict[tuple[str | int, ...], int]
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it: ~10x faster


def _load_yaml(text: str, name: str) -> tuple[Any, Lines]:
    try:
        node, data = _parse_yaml(text)
    except yaml.reader.ReaderError as exc:  # a control character: no mark, a position
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ConfigError(
            f"{name}:{line}: malformed YAML: control character U+{code:04X} is not allowed"
        ) from None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else 1
        problem = exc.problem or str(exc)
        if exc.context and exc.context_mark is not None and exc.context_mark.line + 1 != line:
            problem = f"{exc.context} on line {exc.context_mark.line + 1}, {problem}"
        raise ConfigError(f"{name}:{line}: malformed YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}:1: malformed YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{name}:1: (top level): the config must be a mapping with source, redis, worker, tables"
        )
    lines: Lines = {}
    try:
        _record_lines(node, (), lines)
    except _FieldError as exc:
        raise ConfigError(_locate(name, lines, exc.where, exc.message)) from None
    return data, lines


def _parse_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """One parse gives the nodes (with their lines) and the data."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    finally:
        loader.dispose()


def _record_lines(node: yaml.Node | None, path: tuple[str | int, ...], lines: Lines) -> None:
    if node is None:
        return
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, str(key_node.value))
            if child in lines:  # YAML would silently keep the last one
                first = lines[child]
                lines[child] = key_node.start_mark.line + 1
                raise _FieldError(child, f"duplicate key (first given on line {first})")
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
        if environ.get(var, "") != "":
            return environ[var]
        if default is not None:
            return default
        state = "is empty" if var in environ else "is not set"
        raise ConfigError(
            _locate(
                name, lines, path, f"environment variable {var} {state} (and no ${{{var}:-default}} is given)"
            )
        )

    references = {match.start() for match in _ENV.finditer(value)}
    for start in _ENV_START.finditer(value):
        if start.start() not in references:  # e.g. ${VAR:default}, ${VAR, ${1X}
            rest = value[start.start() :]
            bad = rest[: rest.index("}") + 1] if "}" in rest else rest
            raise ConfigError(
                _locate(name, lines, path, f"malformed reference {bad} (write ${{VAR}} or ${{VAR:-default}})")
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


def _ecma_pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` with JSON Schema's (ECMA-262) meaning of a final ``$``: the
    very end of the text. Python's ``$`` also matches before a final newline,
    which would let ``"dbo.Forecasts\\n"`` pass as an identifier."""
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + "\\Z"
    return re.compile(pattern)


def _is_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 500.0 as an integer; a count in this config must be an int.
    return isinstance(instance, int) and not isinstance(instance, bool)


_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in the stubs
    jsonschema.Draft202012Validator,
    validators={"pattern": _ecma_pattern},
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def _validate(data: Any, lines: Lines, name: str) -> None:
    validator = _Validator(config_schema())
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
    if (
        error.validator == "type"
        and isinstance(error.instance, dict)
        and "string" in str(error.validator_value)
    ):
        return f'{error.message} (quote a value that starts with {{, e.g. "{{Id}}")'
    if error.validator == "oneOf" and error.schema == config_schema()["$defs"]["duration"]:
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
    tables = tuple(_build_table(t, i, lines, name) for i, t in enumerate(data["tables"]))
    _check_unique(tables)
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
        ),
        redis=RedisConfig(
            url=redis.get("url", RedisConfig.url),
            cluster=redis.get("cluster", False),
            namespace=redis.get("namespace", "cdc"),
            stream_max_len=redis.get("stream_max_len", 100_000),
            tombstone_ttl=_duration(redis.get("tombstone_ttl", "7d"), ("redis", "tombstone_ttl")),
        ),
        worker=WorkerConfig(
            max_batch_size=worker.get("max_batch_size", 500),
            max_wait=_duration(worker.get("max_wait", "100ms"), ("worker", "max_wait")),
            queue_capacity=worker.get("queue_capacity", 10_000),
            health=_parse_address(worker.get("health", "127.0.0.1:9478"), ("worker", "health")),
            page_size=worker.get("page_size", 5000),
            lease_ttl=_duration(worker.get("lease_ttl", "10s"), ("worker", "lease_ttl")),
            max_row_bytes=worker.get("max_row_bytes", 1 << 20),
            heartbeat=_duration(worker.get("heartbeat", "5s"), ("worker", "heartbeat")),
        ),
        tables=tables,
        path=name,
    )


def _duration(value: Any, where: tuple[str | int, ...]) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:  # what the schema cannot say: .nan, .inf
        raise _FieldError(where, str(exc)) from None


def _build_table(raw: dict[str, Any], index: int, lines: Lines, file: str) -> TableConfig:
    where: tuple[str | int, ...] = ("tables", index)
    schema, table_name = raw["table"].split(".")
    section = raw.get("section", table_name.lower())
    partition = _template(raw.get("partition", section), (*where, "partition"))
    key = _template(raw["key"], (*where, "key")) if "key" in raw else None
    columns = tuple(raw["columns"]) if "columns" in raw else None
    for i, column in enumerate(columns or ()):
        if column.startswith("@"):
            raise _FieldError((*where, "columns", i), f"{column!r}: names starting with @ are reserved")
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
        field_lines=tuple((str(path[-1]), line) for path, line in lines.items() if path[:-1] == where),
    )


def _template(text: str, where: tuple[str | int, ...]) -> Template:
    try:
        return Template.parse(text)
    except ValueError as exc:
        raise _FieldError(where, str(exc)) from None


def _backoff(
    raw: list[list[Any]] | None, where: tuple[str | int, ...]
) -> tuple[tuple[int | None, float], ...]:
    if raw is None:
        return DEFAULT_BACKOFF
    steps = tuple((limit, _duration(wait, (*where, i, 1))) for i, (limit, wait) in enumerate(raw))
    limits = [limit for limit, _ in steps]
    if limits[-1] is not None:
        raise _FieldError(
            (*where, len(steps) - 1), "the last step must be [null, wait] (what happens beyond)"
        )
    if None in limits[:-1]:
        raise _FieldError((*where, limits.index(None)), "only the last step may be [null, wait]")
    bounded = [limit for limit in limits if limit is not None]
    if bounded != sorted(set(bounded)):
        raise _FieldError(where, "the step limits must increase")
    return steps


def _check_unique(tables: tuple[TableConfig, ...]) -> None:
    seen: dict[str, int] = {}
    sections: dict[str, int] = {}
    for index, table_config in enumerate(tables):
        lowered = table_config.table.lower()
        if lowered in seen:
            first = tables[seen[lowered]]
            raise _FieldError(
                ("tables", index, "table"),
                f"{table_config.table} is registered twice (first as tables[{seen[lowered]}] on line {first.line})",
            )
        seen[lowered] = index
        if table_config.section in sections:
            other = tables[sections[table_config.section]].table
            implicit = "section" not in dict(table_config.field_lines)
            hint = (
                f" (the default section is the table name, lower-cased: set section for {table_config.table})"
            )
            raise _FieldError(
                ("tables", index, "section"),
                f"section {table_config.section!r} is already written by {other}; each section belongs to one table"
                + (hint if implicit else ""),
            )
        sections[table_config.section] = index


def _parse_address(value: str | None, where: tuple[str | int, ...]) -> tuple[str, int] | None:
    if value is None:
        return None
    host, _, port = value.rpartition(":")
    if int(port) > 65535:
        raise _FieldError(where, f"port {int(port)} is out of range (0-65535)")
    return (host or "127.0.0.1", int(port))
