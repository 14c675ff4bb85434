"""The config file as a user meets it: what loads, what it loads into, and what
each mistake is told as (``<file>:<line>: <field>: <message>``, exact lines)."""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cdc.config import (
    DEFAULT_BACKOFF,
    Config,
    RedisConfig,
    SourceConfig,
    TableConfig,
    WorkerConfig,
    config_schema,
    load_config,
)
from cdc.durations import format_duration, parse_duration
from cdc.errors import ConfigError
from cdc.templates import Template

ROOT = Path(__file__).resolve().parents[2]  # tests/cdc/ -> the checkout
DSN = (
    "Driver={ODBC Driver 18 for SQL Server};Server=sql01.corp.internal,1433;Database=Planning;"
    "UID=cdc_reader;PWD=v9#Lq!2x;Encrypt=yes"
)
ENV = {"CDC_SOURCE_DSN": DSN}
MESSAGE = re.compile(r"(?P<file>.+?):(?P<line>[0-9]+): (?P<field>[^:]+): (?P<message>.+)", re.S)

# Four lines: the first table entry starts on line 5.
HEAD = """\
source:
  kind: mssql
  dsn: ${CDC_SOURCE_DSN}
tables:
"""


class Failure(NamedTuple):
    line: int
    field: str
    message: str


Load = Callable[..., Config]
Fail = Callable[..., Failure]


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return tmp_path / "tables.yaml"


@pytest.fixture
def load(config_path: Path) -> Load:
    def load(text: str, env: dict[str, str] | None = None) -> Config:
        config_path.write_text(textwrap.dedent(text), encoding="utf-8")
        return load_config(config_path, ENV if env is None else env)

    return load


@pytest.fixture
def fail(config_path: Path, load: Load) -> Fail:
    """Load ``text``, expect a ConfigError, and split its message."""

    def fail(text: str, env: dict[str, str] | None = None) -> Failure:
        with pytest.raises(ConfigError) as info:
            load(text, env)
        assert info.value.exit_code == 2
        match = MESSAGE.fullmatch(str(info.value))
        assert match, f"not <file>:<line>: <field>: <message>: {info.value}"
        assert match["file"] == str(config_path)
        return Failure(int(match["line"]), match["field"], match["message"])

    return fail


def table(entry: str) -> str:
    """HEAD plus one table entry given as YAML lines (the entry starts on line 5)."""
    return HEAD + textwrap.indent(textwrap.dedent(entry), "  ")


# -- what a valid file loads into ------------------------------------------

DESIGN_EXAMPLE = """\
source:
  kind: mssql
  dsn: ${CDC_SOURCE_DSN}
redis:
  url: ${CDC_REDIS_URL:-redis://127.0.0.1:6379/0}
  cluster: false
  namespace: cdc
  stream_max_len: 100000
  tombstone_ttl: 7d
worker:
  max_batch_size: 500
  max_wait: 100ms
  queue_capacity: 10000
  health: 127.0.0.1:9478
tables:
  - table: dbo.Forecasts
    columns: [Id, Price, ValidFrom, ValidTo, Status]
    operations: [I, U, D]
    partition: app1
    section: forecasts
    key: "{Id}"
    backoff: [[5, 50ms], [20, 200ms], [100, 1s], [null, 5s]]
"""


def test_the_design_example_loads_into_the_typed_config(load: Load, config_path: Path) -> None:
    config = load(DESIGN_EXAMPLE)

    assert config.path == str(config_path)
    assert config.source == SourceConfig(kind="mssql", dsn=DSN)
    assert config.redis == RedisConfig(
        url="redis://127.0.0.1:6379/0", cluster=False, namespace="cdc", stream_max_len=100_000
    )
    assert config.redis.tombstone_ttl == 7 * 86400.0
    assert config.worker.max_wait == 0.1
    assert config.worker.health == ("127.0.0.1", 9478)
    (forecasts,) = config.tables
    assert forecasts == TableConfig(
        table="dbo.Forecasts",
        schema="dbo",
        name="Forecasts",
        section="forecasts",
        partition=Template.parse("app1"),
        key=Template.parse("{Id}"),
        columns=("Id", "Price", "ValidFrom", "ValidTo", "Status"),
        operations=frozenset({"I", "U", "D"}),
        backoff=((5, 0.05), (20, 0.2), (100, 1.0), (None, 5.0)),
        line=16,
    )
    assert forecasts.partition.is_literal
    assert forecasts.key is not None and forecasts.key.columns == ("Id",)
    assert config.table("DBO.forecasts") is forecasts


def test_a_minimal_file_gets_every_default(load: Load) -> None:
    config = load(table("- table: sales.OrderLines\n"))

    assert config.source == SourceConfig(
        kind="mssql",
        dsn=DSN,
        tracking_schema="cdc_tracking",
        retention=2 * 86400.0,
        cleanup_interval=1800.0,
        connect_timeout=10.0,
        query_timeout=60.0,
    )
    assert config.redis == RedisConfig()
    assert config.redis.url == "redis://127.0.0.1:6379/0"
    assert config.worker == WorkerConfig()
    assert config.worker.max_wait == 0.1 and config.worker.health == ("127.0.0.1", 9478)
    (lines,) = config.tables
    assert (lines.schema, lines.name, lines.section) == ("sales", "OrderLines", "orderlines")
    assert lines.partition == Template.parse("orderlines")  # default: the section
    assert lines.key is None  # default: the primary-key values joined by ":"
    assert lines.columns is None  # default: every column
    assert lines.operations == frozenset({"I", "U", "D"})
    assert lines.backoff == DEFAULT_BACKOFF
    assert lines.line == 5


def test_a_section_with_every_option_commented_out_is_empty(load: Load) -> None:
    text = "redis:\n  # url: redis://cache.internal:6379/0\nworker:\n" + table("- table: dbo.Forecasts\n")
    config = load(text)
    assert (config.redis, config.worker) == (RedisConfig(), WorkerConfig())


def test_the_schema_defaults_are_the_typed_defaults(load: Load) -> None:
    """docs/CONFIG.md shows the schema's defaults: the loader must apply the same ones."""
    config = load(table("- table: dbo.Forecasts\n"))
    schema = config_schema()
    for section in ("source", "redis", "worker"):
        loaded = getattr(config, section)
        for key, prop in schema["properties"][section]["properties"].items():
            if "default" not in prop:
                continue
            expected: Any = prop["default"]
            if prop.get("$ref") == "#/$defs/duration":
                expected = parse_duration(expected)
            elif key == "health":
                host, port = expected.split(":")
                expected = (host, int(port))
            elif isinstance(expected, list):  # a list in YAML, a tuple loaded
                expected = tuple(expected)
            assert getattr(loaded, key) == expected, f"{section}.{key}"
    entry = schema["properties"]["tables"]["items"]["properties"]
    assert config.tables[0].operations == frozenset(entry["operations"]["default"])


def test_the_dsn_is_never_printed(load: Load) -> None:
    config = load(DESIGN_EXAMPLE, {**ENV, "CDC_REDIS_URL": "rediss://cdc:Zr8-kk2p@cache.internal:6380/0"})
    assert config.redis.url == "rediss://cdc:Zr8-kk2p@cache.internal:6380/0"
    assert "v9#Lq!2x" not in repr(config) and "Zr8-kk2p" not in repr(config)


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ("50ms", 0.05),
        ("700ms", 0.7),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1.5h", 5400.0),
        ("7d", 604800.0),
        ("0.5", 0.5),  # a plain number is seconds
        ("3", 3.0),
        ("0", 0.0),
        ('"5 s"', 5.0),
    ],
)
def test_durations_are_seconds(load: Load, written: str, seconds: float) -> None:
    # max_wait takes 0 to 1m, tombstone_ttl 1s to 3650d
    if seconds <= 1:
        loaded = load(f"worker:\n  max_wait: {written}\n" + table("- table: dbo.Forecasts\n")).worker.max_wait
    else:
        text = f"redis:\n  tombstone_ttl: {written}\n" + table("- table: dbo.Forecasts\n")
        loaded = load(text).redis.tombstone_ttl
    assert loaded == seconds
    assert isinstance(loaded, float)


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from([1, 1000, 60_000, 3_600_000, 86_400_000]))
def test_format_duration_reads_back_exactly(count: int, unit_ms: int) -> None:
    seconds = count * unit_ms / 1000
    assert parse_duration(format_duration(seconds)) == seconds


def test_other_options_take_their_values(load: Load) -> None:
    config = load(
        """\
        source:
          kind: postgres
          dsn: postgresql://cdc@pg01.corp.internal:5432/planning
          tracking_schema: cdc_ct
          retention: 14d
          cleanup_interval: 0
        redis:
          url: rediss://cdc@cache.internal:6380/0
          cluster: true
          namespace: planning.prod
          stream_max_len: 250000
        worker:
          max_batch_size: 2000
          queue_capacity: 50000
          health: null
          page_size: 1000
          max_row_bytes: 65536
        tables:
          - table: public.order_lines
            partition: "{region_id}"
            key: "{order_id}:{line_no}"
            operations: [I, U]
            backoff: [[10, 1s], [null, 30s]]
        """
    )
    assert config.source.kind == "postgres"
    assert (config.source.tracking_schema, config.source.retention) == ("cdc_ct", 14 * 86400.0)
    assert config.source.cleanup_interval == 0.0
    assert config.redis == RedisConfig(
        url="rediss://cdc@cache.internal:6380/0",
        cluster=True,
        namespace="planning.prod",
        stream_max_len=250_000,
    )
    assert config.worker.health is None
    assert (config.worker.max_batch_size, config.worker.queue_capacity, config.worker.page_size) == (
        2000,
        50_000,
        1000,
    )
    (lines,) = config.tables
    assert lines.partition.columns == ("region_id",)
    assert lines.key is not None and lines.key.render({"order_id": 7, "line_no": 2}) == "7:2"
    assert lines.operations == frozenset({"I", "U"})
    assert lines.backoff == ((10, 1.0), (None, 30.0))


@pytest.mark.parametrize(
    ("written", "address"),
    [("0.0.0.0:9478", ("0.0.0.0", 9478)), ("localhost:0", ("localhost", 0)), (":9100", ("127.0.0.1", 9100))],
)
def test_health_address(load: Load, written: str, address: tuple[str, int]) -> None:
    config = load(f"worker:\n  health: {written!r}\n" + table("- table: dbo.Forecasts\n"))
    assert config.worker.health == address


def test_config_table_names_the_registered_tables(load: Load) -> None:
    config = load(table("- table: dbo.Forecasts\n- table: dbo.Regions\n"))
    with pytest.raises(
        ConfigError, match=r"no table 'dbo.Prices' is registered \(registered: dbo.Forecasts, dbo.Regions\)"
    ):
        config.table("dbo.Prices")


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere\.yaml: cannot read the config file: No such file"):
        load_config(tmp_path / "nowhere.yaml", ENV)


# -- ${VAR} expansion --------------------------------------------------------


def test_variables_and_defaults_are_expanded(load: Load) -> None:
    text = table(
        """\
        - table: ${CDC_SCHEMA:-dbo}.Forecasts
          section: forecasts-${CDC_ENV}
          partition: ${CDC_TENANT:-app1}
        """
    )
    text = text.replace("tables:", "redis:\n  url: ${CDC_REDIS_URL:-redis://127.0.0.1:6379/0}\ntables:")
    config = load(text, {**ENV, "CDC_ENV": "prod", "CDC_TENANT": ""})
    assert config.source.dsn == DSN  # braces and semicolons of the value are kept as they are
    assert config.redis.url == "redis://127.0.0.1:6379/0"  # unset: the default
    (forecasts,) = config.tables
    assert forecasts.table == "dbo.Forecasts"
    assert forecasts.section == "forecasts-prod"
    assert forecasts.partition == Template.parse("app1")  # empty counts as unset

    config = load(text, {**ENV, "CDC_ENV": "test", "CDC_SCHEMA": "planning", "CDC_TENANT": "app2"})
    assert (config.tables[0].table, config.tables[0].partition.source) == ("planning.Forecasts", "app2")


def test_a_value_from_the_environment_cannot_change_the_structure(load: Load) -> None:
    hostile = "x\nredis: {url: 'redis://attacker.example:6379/0'}\ntables: []\nworker: {health: '0.0.0.0:80'}"
    config = load(HEAD + "  - table: dbo.Forecasts\n", {"CDC_SOURCE_DSN": hostile})
    assert config.source.dsn == hostile
    assert config.redis.url == "redis://127.0.0.1:6379/0"
    assert config.worker.health == ("127.0.0.1", 9478)
    assert [t.table for t in config.tables] == ["dbo.Forecasts"]


def test_an_expanded_value_is_not_expanded_again(load: Load) -> None:
    config = load(HEAD + "  - table: dbo.Forecasts\n", {"CDC_SOURCE_DSN": "host=db password=${HOME}"})
    assert config.source.dsn == "host=db password=${HOME}"


def test_a_list_from_the_environment_is_one_string(fail: Fail) -> None:
    text = table(
        """\
        - table: dbo.Forecasts
          columns:
            - Id
            - ${CDC_EXTRA_COLUMNS}
        """
    )
    failure = fail(text, {**ENV, "CDC_EXTRA_COLUMNS": "Price, Status"})
    assert failure == Failure(
        8, "tables[0].columns[1]", "'Price, Status' is not valid here (must match ^[A-Za-z_][A-Za-z0-9_]*$)"
    )


def test_an_expanded_value_is_a_string_not_a_number(fail: Fail) -> None:
    failure = fail(
        "worker:\n  max_batch_size: ${CDC_BATCH}\n" + table("- table: dbo.Forecasts\n"),
        {**ENV, "CDC_BATCH": "1000"},
    )
    assert failure == Failure(2, "worker.max_batch_size", "'1000' is not of type 'integer'")


def test_a_missing_variable_names_file_line_and_field(fail: Fail) -> None:
    failure = fail(DESIGN_EXAMPLE, {})
    assert failure == Failure(
        3,
        "source.dsn",
        "environment variable CDC_SOURCE_DSN is not set (and no ${CDC_SOURCE_DSN:-default} is given)",
    )


def test_a_missing_variable_in_a_list_names_the_item(fail: Fail) -> None:
    text = table(
        """\
        - table: dbo.Forecasts
          columns:
            - Id
            - ${CDC_PRICE_COLUMN}
        """
    )
    assert fail(text) == Failure(
        8,
        "tables[0].columns[1]",
        "environment variable CDC_PRICE_COLUMN is not set (and no ${CDC_PRICE_COLUMN:-default} is given)",
    )


def test_an_empty_variable_without_default_is_an_error(fail: Fail) -> None:
    assert fail(DESIGN_EXAMPLE, {"CDC_SOURCE_DSN": ""}) == Failure(
        3,
        "source.dsn",
        "environment variable CDC_SOURCE_DSN is empty (and no ${CDC_SOURCE_DSN:-default} is given)",
    )


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ("${CDC_REDIS_URL:redis://127.0.0.1:6379/0}", "${CDC_REDIS_URL:redis://127.0.0.1:6379/0}"),
        ("${CDC_REDIS_URL", "${CDC_REDIS_URL"),
        ("redis://${1HOST}:6379/0", "${1HOST}"),
        ("${CDC_REDIS_URL:=redis://127.0.0.1}", "${CDC_REDIS_URL:=redis://127.0.0.1}"),
    ],
)
def test_a_malformed_reference_is_an_error(fail: Fail, written: str, shown: str) -> None:
    failure = fail(f"redis:\n  namespace: {written!r}\n" + table("- table: dbo.Forecasts\n"))
    assert failure == Failure(
        2, "redis.namespace", f"malformed reference {shown} (write ${{VAR}} or ${{VAR:-default}})"
    )
    # in a field that may hold a password, no piece of the value is shown
    failure = fail(f"redis:\n  url: {written!r}\n" + table("- table: dbo.Forecasts\n"))
    assert failure == Failure(
        2,
        "redis.url",
        "malformed reference (write ${VAR} or ${VAR:-default}; the value is not shown: it may hold a password)",
    )


# -- malformed YAML ----------------------------------------------------------

# The problem as PyYAML's pure-Python parser, then as libyaml (used when PyYAML
# was built with it), words it; both report the same line.
MALFORMED = {
    "indentation": (
        "source:\n  kind: mssql\n   dsn: ${CDC_SOURCE_DSN}\ntables:\n  - table: dbo.Forecasts\n",
        3,
        ("mapping values are not allowed here", "mapping values are not allowed in this context"),
    ),
    "tab": (
        "source:\n  kind: mssql\n\tdsn: ${CDC_SOURCE_DSN}\ntables:\n  - table: dbo.Forecasts\n",
        3,
        (
            "found character '\\t' that cannot start any token",
            "while scanning a plain scalar on line 2, found a tab character that violates indentation",
        ),
    ),
    "unclosed-list": (
        HEAD + "  - table: dbo.Forecasts\n    columns: [Id, Price\n    section: forecasts\n",
        7,
        (
            "while parsing a flow sequence on line 6, expected ',' or ']', but got ':'",
            "while parsing a flow sequence on line 6, did not find expected ',' or ']'",
        ),
    ),
    "unclosed-quote": (
        'source:\n  kind: mssql\n  dsn: "${CDC_SOURCE_DSN}\ntables:\n  - table: dbo.Forecasts\n',
        6,
        ("while scanning a quoted scalar on line 3, found unexpected end of stream",),
    ),
    "unquoted-template": (
        HEAD + "  - table: dbo.Forecasts\n    key: {Id}:{Line}\n",
        6,
        (
            "while parsing a block mapping on line 5, expected <block end>, but found '<scalar>'",
            "while parsing a block mapping on line 5, did not find expected key",
        ),
    ),
    "two-documents": (
        HEAD + "  - table: dbo.Forecasts\n---\nsource: {kind: postgres}\n",
        6,
        ("expected a single document in the stream on line 1, but found another document",),
    ),
    "control-char": (
        HEAD + "  - table: dbo.Forecasts\n    section: fore\x07casts\n",
        6,
        ("control character U+0007 is not allowed",),
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_yaml_names_the_line(fail: Fail, case: str) -> None:
    text, line, messages = MALFORMED[case]
    failure = fail(text)
    assert (failure.line, failure.field) == (line, "malformed YAML")
    assert failure.message in messages


def test_a_file_that_is_not_utf8_names_the_line(config_path: Path) -> None:
    config_path.write_bytes(HEAD.encode() + b"  - table: dbo.Forecasts\n    section: pr\xe9visions\n")
    with pytest.raises(ConfigError) as info:
        load_config(config_path, ENV)
    assert (
        str(info.value)
        == f"{config_path}:6: (encoding): the config file must be UTF-8: invalid continuation byte"
    )


@pytest.mark.parametrize("text", ["", "# all commented out\n", "- table: dbo.Forecasts\n", "tables\n"])
def test_the_file_must_be_a_mapping(fail: Fail, text: str) -> None:
    assert fail(text) == Failure(
        1, "(top level)", "the config must be a mapping with source, redis, worker, tables"
    )


def test_a_key_given_twice_is_an_error(fail: Fail) -> None:
    text = table(
        """\
        - table: dbo.Forecasts
          section: forecasts
          partition: app1
          section: forecasts_v2
        """
    )
    assert fail(text) == Failure(8, "tables[0].section", "duplicate key (first given on line 6)")


def test_a_section_given_twice_is_an_error(fail: Fail) -> None:
    text = DESIGN_EXAMPLE + "worker:\n  max_batch_size: 1000\n"
    assert fail(text) == Failure(23, "worker", "duplicate key (first given on line 10)")


def test_an_unquoted_template_gets_a_hint(fail: Fail) -> None:
    assert fail(table("- table: dbo.Forecasts\n  key: {Id}\n")) == Failure(
        6,
        "tables[0].key",
        "{'Id': None} is not of type 'string' (quote a value that starts with {, e.g. \"{Id}\")",
    )


# -- unknown keys --------------------------------------------------------------


def test_an_unknown_top_level_key(fail: Fail) -> None:
    text = DESIGN_EXAMPLE.replace("worker:", "workers:")
    assert fail(text) == Failure(
        10, "workers", "unknown key workers (allowed: redis, source, tables, worker)"
    )


def test_an_unknown_key_in_redis(fail: Fail) -> None:
    text = DESIGN_EXAMPLE.replace("  stream_max_len: 100000", "  stream_maxlen: 100000")
    assert fail(text) == Failure(
        8,
        "redis.stream_maxlen",
        "unknown key stream_maxlen (allowed: cluster, cluster_nodes, durability, namespace, sentinel, stream_max_len,"
        " tombstone_ttl, url)",
    )


def test_an_unknown_key_in_a_table_entry(fail: Fail) -> None:
    text = table(
        """\
        - table: dbo.Regions
        - table: dbo.Forecasts
          section: forecasts
          partition_key: "{RegionId}"
        """
    )
    assert fail(text) == Failure(
        8,
        "tables[1].partition_key",
        "unknown key partition_key (allowed: backoff, columns, key, operations, partition, section, table)",
    )


def test_missing_required_keys(fail: Fail) -> None:
    assert fail("source:\n  kind: mssql\n  dsn: ${CDC_SOURCE_DSN}\n") == Failure(
        1, "(top level)", "'tables' is a required property"
    )
    assert fail(table("- section: forecasts\n")) == Failure(5, "tables[0]", "'table' is a required property")
    assert fail("source:\n  kind: mssql\ntables:\n  - table: dbo.Forecasts\n") == Failure(
        1, "source", "'dsn' is a required property"
    )


# -- wrong types and values ------------------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "field", "message"),
    [
        ('max_batch_size: "500"', "worker.max_batch_size", "'500' is not of type 'integer'"),
        ("max_batch_size: 500.0", "worker.max_batch_size", "500.0 is not of type 'integer'"),
        ("max_batch_size: true", "worker.max_batch_size", "True is not of type 'integer'"),
        ("max_batch_size: 0", "worker.max_batch_size", "0 is less than the minimum of 1"),
        ("max_batch_size: 10000", "worker.max_batch_size", "10000 is greater than the maximum of 5000"),
        ("queue_capacity: 1e4", "worker.queue_capacity", "'1e4' is not of type 'integer'"),
        ("page_size: [1000]", "worker.page_size", "[1000] is not of type 'integer'"),
        ("health: 9478", "worker.health", "9478 is not of type 'string', 'null'"),
        (
            "health: localhost",
            "worker.health",
            "expected host:port, [IPv6]:port or :port (on 127.0.0.1), got 'localhost'",
        ),
        ("health: '127.0.0.1:70000'", "worker.health", "port 70000 is out of range (0-65535)"),
    ],
)
def test_wrong_types_in_worker(fail: Fail, snippet: str, field: str, message: str) -> None:
    assert fail(f"worker:\n  {snippet}\n" + table("- table: dbo.Forecasts\n")) == Failure(2, field, message)


@pytest.mark.parametrize(
    ("snippet", "field", "message"),
    [
        ("cluster: 'true'", "redis.cluster", "'true' is not of type 'boolean'"),
        (
            "url: http://cache.internal:6379",
            "redis.url",
            "expected a URL starting with redis://, rediss:// or unix:// "
            "(the value is not shown: it may hold a password)",
        ),
        ("stream_max_len: -1", "redis.stream_max_len", "-1 is less than the minimum of 1"),
        (
            "namespace: ''",
            "redis.namespace",
            "'' is not valid here (must match ^[A-Za-z0-9_][A-Za-z0-9_.-]*$)",
        ),
    ],
)
def test_wrong_types_in_redis(fail: Fail, snippet: str, field: str, message: str) -> None:
    assert fail(f"redis:\n  {snippet}\n" + table("- table: dbo.Forecasts\n")) == Failure(2, field, message)


def test_wrong_types_in_source_and_tables(fail: Fail) -> None:
    assert fail("source:\n  kind: oracle\n  dsn: x\ntables:\n  - table: dbo.Forecasts\n") == Failure(
        2, "source.kind", "'oracle' is not one of ['mssql', 'postgres']"
    )
    assert fail("source:\n  kind: mssql\n  dsn: ${CDC_SOURCE_DSN}\ntables: dbo.Forecasts\n") == Failure(
        4, "tables", "'dbo.Forecasts' is not of type 'array'"
    )
    assert fail("source:\n  kind: mssql\n  dsn: ${CDC_SOURCE_DSN}\ntables: []\n") == Failure(
        4, "tables", "[] should be non-empty"
    )
    assert fail(table("- table: dbo.Forecasts\n  columns: Id\n")) == Failure(
        6, "tables[0].columns", "'Id' is not of type 'array'"
    )
    assert fail(table("- table: dbo.Forecasts\n  columns: [Id, Price, Id]\n")) == Failure(
        6, "tables[0].columns", "['Id', 'Price', 'Id'] has non-unique elements"
    )
    assert fail(table("- table: dbo.Forecasts\n  operations: [I, U, X]\n")) == Failure(
        6, "tables[0].operations[2]", "'X' is not one of ['I', 'U', 'D']"
    )
    assert fail(table("- table: dbo.Forecasts\n  operations: []\n")) == Failure(
        6, "tables[0].operations", "[] should be non-empty"
    )


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("5 minutes", "expected a duration such as 50ms, 5s or 7d, got '5 minutes'"),
        ("1w", "expected a duration such as 50ms, 5s or 7d, got '1w'"),
        ("-1s", "expected a duration such as 50ms, 5s or 7d, got '-1s'"),
        ("-5", "expected a duration such as 50ms, 5s or 7d, got -5"),
        ("1e3s", "expected a duration such as 50ms, 5s or 7d, got '1e3s'"),
        (".5s", "expected a duration such as 50ms, 5s or 7d, got '.5s'"),
        ("true", "expected a duration such as 50ms, 5s or 7d, got True"),
        ("[100ms]", "expected a duration such as 50ms, 5s or 7d, got ['100ms']"),
        (".nan", "a duration must be a finite number of seconds, got nan"),
        (".inf", "a duration must be a finite number of seconds, got inf"),
    ],
)
def test_bad_durations(fail: Fail, written: str, message: str) -> None:
    assert fail(
        f"worker:\n  max_batch_size: 500\n  max_wait: {written}\n" + table("- table: dbo.Forecasts\n")
    ) == Failure(3, "worker.max_wait", message)


def test_a_bad_duration_in_source(fail: Fail) -> None:
    text = "source:\n  kind: postgres\n  dsn: ${CDC_SOURCE_DSN}\n  retention: 2 days\ntables:\n  - table: public.forecasts\n"
    assert fail(text) == Failure(
        4, "source.retention", "expected a duration such as 50ms, 5s or 7d, got '2 days'"
    )


# -- identifiers: validated, never pasted into SQL -----------------------------------

INJECTIONS = [
    "dbo.Forecasts; DROP TABLE dbo.Forecasts",
    "dbo.Forecasts--",
    "dbo.Forecasts /* x */",
    "dbo.[Forecasts]",
    '"dbo"."Forecasts"',
    "dbo.Forecasts'",
    "dbo.Forecasts\n",
    "dbo.Fore casts",
    "[dbo].Forecasts",
    "dbo.Forecasts.Extra",
    "Forecasts",
    "dbo.1Forecasts",
    "@dbo.Forecasts",
]


@pytest.mark.parametrize("name", INJECTIONS)
def test_table_names_are_identifiers(fail: Fail, name: str) -> None:
    failure = fail(table(f"- table: dbo.Regions\n- table: {json.dumps(name)}\n"))
    assert failure == Failure(
        6,
        "tables[1].table",
        f"{name!r} is not valid here (must match ^[A-Za-z_][A-Za-z0-9_]*\\.[A-Za-z_][A-Za-z0-9_]*$)",
    )


@pytest.mark.parametrize(
    "column",
    [
        "Price]; DROP TABLE dbo.Forecasts --",
        'Price"',
        "Price'",
        "Price--",
        "Price/*",
        "Pri ce",
        "Price;",
        "1Price",
        "@v",
        "Price\n",
        "",
    ],
)
def test_column_names_are_identifiers(fail: Fail, column: str) -> None:
    text = table(
        f"""\
        - table: dbo.Forecasts
          columns:
            - Id
            - {json.dumps(column)}
        """
    )
    assert fail(text) == Failure(
        8, "tables[0].columns[1]", f"{column!r} is not valid here (must match ^[A-Za-z_][A-Za-z0-9_]*$)"
    )


@pytest.mark.parametrize(
    "section",
    [
        "forecasts;",
        "fore/*casts",
        "fore casts",
        "app:forecasts",
        "{forecasts}",
        "@index",
        ".hidden",
        "forecasts\n",
    ],
)
def test_sections_are_key_segments(fail: Fail, section: str) -> None:
    text = table(f"- table: dbo.Forecasts\n  section: {json.dumps(section)}\n")
    assert fail(text) == Failure(
        6, "tables[0].section", f"{section!r} is not valid here (must match ^[A-Za-z0-9_][A-Za-z0-9_.-]*$)"
    )


def test_a_section_is_at_most_200_characters(fail: Fail) -> None:
    failure = fail(table(f"- table: dbo.Forecasts\n  section: {'f' * 201}\n"))
    assert (failure.line, failure.field) == (6, "tables[0].section")
    assert failure.message.endswith("is too long")


def test_the_tracking_schema_is_an_identifier(fail: Fail) -> None:
    text = "source:\n  kind: postgres\n  dsn: ${CDC_SOURCE_DSN}\n  tracking_schema: 'cdc; DROP SCHEMA public CASCADE; --'\ntables:\n  - table: public.forecasts\n"
    assert fail(text) == Failure(
        4,
        "source.tracking_schema",
        "'cdc; DROP SCHEMA public CASCADE; --' is not valid here (must match ^[A-Za-z_][A-Za-z0-9_]*$)",
    )


def test_an_identifier_from_the_environment_is_validated_too(fail: Fail) -> None:
    env = {**ENV, "CDC_TABLE": "dbo.Forecasts; EXEC xp_cmdshell 'whoami'"}
    failure = fail(table("- table: ${CDC_TABLE}\n"), env)
    assert (failure.line, failure.field) == (5, "tables[0].table")
    assert failure.message.startswith("\"dbo.Forecasts; EXEC xp_cmdshell 'whoami'\" is not valid here")


# -- templates -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{RegionId", "template '{RegionId': unbalanced braces"),
        ("RegionId}", "template 'RegionId}': unbalanced braces"),
        ("{{RegionId}", "template '{{RegionId}': unbalanced braces"),
        ("{RegionId}}", "template '{RegionId}}': unbalanced braces"),
        ("eu-}{RegionId}", "template 'eu-}{RegionId}': unbalanced braces"),
        ("{Region Id}", "template '{Region Id}': {Region Id} is not a column name"),
        ("{RegionId;DROP}", "template '{RegionId;DROP}': {RegionId;DROP} is not a column name"),
        ("{1Region}", "template '{1Region}': {1Region} is not a column name"),
        ("{}", "template '{}': {} is not a column name"),
        ("{@v}", "template '{@v}': {@v} is not a column name"),
    ],
)
def test_bad_templates_name_the_field(fail: Fail, template: str, message: str) -> None:
    text = table(f"- table: dbo.Forecasts\n  section: forecasts\n  partition: {json.dumps(template)}\n")
    assert fail(text) == Failure(7, "tables[0].partition", message)


def test_a_bad_key_template_names_the_field(fail: Fail) -> None:
    text = table('- table: sales.OrderLines\n  key: "{OrderId}:{Line No}"\n')
    assert fail(text) == Failure(
        6, "tables[0].key", "template '{OrderId}:{Line No}': {Line No} is not a column name"
    )


def test_a_template_over_a_non_key_column_is_told_with_its_line(load: Load, config_path: Path) -> None:
    """Templates are checked once the table's primary key is known; the error
    still names the file, the line and the field."""
    config = load(
        table(
            """\
            - table: dbo.Regions
            - table: dbo.Forecasts
              section: forecasts
              partition: "{Status}"
            """
        )
    )
    forecasts = config.tables[1]
    with pytest.raises(ValueError) as info:
        forecasts.partition.check_columns(("Id",))
    error = forecasts.error("partition", str(info.value))
    assert str(error) == (
        f"{config_path}:8: tables[1].partition: template '{{Status}}' uses 'Status', "
        "which is not a primary-key column (primary key: Id)"
    )
    assert str(forecasts.error("key", "x")) == f"{config_path}:6: tables[1].key: x"  # not written: the entry


# -- names starting with @ are reserved -------------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "field", "pattern"),
    [
        ("partition: '@checkpoint'", "tables[0].partition", "^[^@]"),
        ("key: '@v'", "tables[0].key", "^[^@]"),
        ("section: '@index'", "tables[0].section", "^[A-Za-z0-9_][A-Za-z0-9_.-]*$"),
        ("columns: ['@del']", "tables[0].columns[0]", "^[A-Za-z_][A-Za-z0-9_]*$"),
    ],
)
def test_names_starting_with_at_are_reserved(fail: Fail, snippet: str, field: str, pattern: str) -> None:
    failure = fail(table(f"- table: dbo.Forecasts\n  {snippet}\n"))
    assert failure.line == 6 and failure.field == field
    assert failure.message.endswith(f"is not valid here (must match {pattern})")
    assert failure.message.startswith("'@")


def test_a_reserved_namespace(fail: Fail) -> None:
    failure = fail("redis:\n  namespace: '@cdc'\n" + table("- table: dbo.Forecasts\n"))
    assert failure == Failure(
        2, "redis.namespace", "'@cdc' is not valid here (must match ^[A-Za-z0-9_][A-Za-z0-9_.-]*$)"
    )


# -- tables and sections are registered once --------------------------------------------


def test_a_table_registered_twice(fail: Fail) -> None:
    text = table(
        """\
        - table: dbo.Forecasts
          section: forecasts
        - table: dbo.Regions
        - table: DBO.forecasts
          section: forecasts_copy
        """
    )
    assert fail(text) == Failure(
        8, "tables[2].table", "DBO.forecasts is registered twice (first as tables[0] on line 5)"
    )


def test_a_section_written_by_two_tables(fail: Fail) -> None:
    text = table(
        """\
        - table: dbo.Forecasts
          section: forecasts
        - table: archive.Forecasts2019
          section: forecasts
        """
    )
    assert fail(text) == Failure(
        8,
        "tables[1].section",
        "section 'forecasts' is already written by dbo.Forecasts; each section belongs to one table",
    )


def test_a_default_section_written_by_two_tables_gets_a_hint(fail: Fail) -> None:
    text = table("- table: dbo.Forecasts\n- table: archive.Forecasts\n")
    assert fail(text) == Failure(
        6,
        "tables[1].section",
        "section 'forecasts' is already written by dbo.Forecasts; each section belongs to one table "
        "(the default section is the table name, lower-cased: set section for archive.Forecasts)",
    )


# -- backoff --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "field", "message"),
    [
        (
            "[[5, 50ms], [20, 200ms]]",
            "tables[0].backoff[1]",
            "the last step must be [null, wait] (what happens beyond)",
        ),
        (
            "[[5, 50ms], [null, 1s], [100, 5s]]",
            "tables[0].backoff[2]",
            "the last step must be [null, wait] (what happens beyond)",
        ),
        ("[[null, 50ms], [null, 5s]]", "tables[0].backoff[0]", "only the last step may be [null, wait]"),
        ("[[20, 50ms], [5, 200ms], [null, 5s]]", "tables[0].backoff", "the step limits must increase"),
        ("[[5, 50ms], [5, 200ms], [null, 5s]]", "tables[0].backoff", "the step limits must increase"),
        ("[[0, 50ms], [null, 5s]]", "tables[0].backoff[0][0]", "0 is less than the minimum of 1"),
        ("[[5.5, 50ms], [null, 5s]]", "tables[0].backoff[0][0]", "5.5 is not of type 'integer', 'null'"),
        (
            "[[5, fast], [null, 5s]]",
            "tables[0].backoff[0][1]",
            "expected a duration such as 50ms, 5s or 7d, got 'fast'",
        ),
        (
            "[[5, 50ms], [null, .inf]]",
            "tables[0].backoff[1][1]",
            "a duration must be a finite number of seconds, got inf",
        ),
        ("[[5], [null, 5s]]", "tables[0].backoff[0]", "[5] is too short"),
        ("[[5, 50ms, 1], [null, 5s]]", "tables[0].backoff[0]", "[5, '50ms', 1] is too long"),
        ("[]", "tables[0].backoff", "[] should be non-empty"),
        ("5s", "tables[0].backoff", "'5s' is not of type 'array'"),
    ],
)
def test_bad_backoff_steps(fail: Fail, backoff: str, field: str, message: str) -> None:
    assert fail(table(f"- table: dbo.Forecasts\n  backoff: {backoff}\n")) == Failure(6, field, message)


def test_backoff_steps_on_their_own_lines(load: Load, fail: Fail) -> None:
    text = table(
        """\
        - table: dbo.Forecasts
          backoff:
            - [10, 100ms]
            - [50, 2s]
            - [null, 1m]
        """
    )
    assert load(text).tables[0].backoff == ((10, 0.1), (50, 2.0), (None, 60.0))
    assert fail(text.replace("[50, 2s]", "[5, 2s]")) == Failure(
        6, "tables[0].backoff", "the step limits must increase"
    )
    assert fail(text.replace("[null, 1m]", "[100, 1m]")) == Failure(
        9, "tables[0].backoff[2]", "the last step must be [null, wait] (what happens beyond)"
    )


def test_the_shallowest_error_is_told_first(fail: Fail) -> None:
    text = DESIGN_EXAMPLE.replace("worker:", "workers:").replace("Status]", "Status, Valid To]")
    assert fail(text) == Failure(
        10, "workers", "unknown key workers (allowed: redis, source, tables, worker)"
    )


# -- the example config and the reference page ---------------------------------------------


def _schema_keys(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, prop in schema.get("properties", {}).items():
        yield f"{prefix}{key}"
        if prop.get("type") == "object":
            yield from _schema_keys(prop, f"{prefix}{key}.")
        elif prop.get("type") == "array" and "properties" in prop.get("items", {}):
            yield from _schema_keys(prop["items"], f"{prefix}{key}[].")


def _written_keys(data: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield f"{prefix}{key}"
            yield from _written_keys(value, f"{prefix}{key}.")
    elif isinstance(data, list) and data and isinstance(data[0], dict):
        for item in data:
            yield from _written_keys(item, f"{prefix[:-1]}[].")


EXAMPLE = ROOT / "examples" / "tables.yaml"


def test_the_example_config_writes_every_option() -> None:
    written = set(_written_keys(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))))
    assert set(_schema_keys(config_schema())) == written


def test_the_example_config_loads_with_every_default() -> None:
    config = load_config(EXAMPLE, {"CDC_SOURCE_DSN": DSN})
    assert config.source == SourceConfig(kind="mssql", dsn=DSN)
    assert (config.redis, config.worker) == (RedisConfig(), WorkerConfig())
    forecasts = config.tables[0]
    assert forecasts.section == "forecasts" and forecasts.partition == Template.parse("forecasts")
    assert forecasts.operations == frozenset({"I", "U", "D"}) and forecasts.backoff == DEFAULT_BACKOFF
    assert forecasts.key == Template.join(("Id",))  # what the key is when left out, for a key on Id
    lines = config.table("sales.OrderLines")
    assert lines.partition.columns == ("RegionId",)
    assert lines.key is not None and lines.key.columns == ("OrderId", "LineNo")


def test_the_example_needs_the_dsn_from_the_environment() -> None:
    with pytest.raises(
        ConfigError, match=r"tables\.yaml:21: source\.dsn: environment variable CDC_SOURCE_DSN is not set"
    ):
        load_config(EXAMPLE, {})


def _doc_generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_config_doc", ROOT / "scripts" / "gen_config_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_is_up_to_date() -> None:
    expected = _doc_generator().render(config_schema())
    actual = (ROOT / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    assert actual == expected, "docs/CONFIG.md is out of date: run python scripts/gen_config_doc.py"


def test_the_config_reference_names_every_key() -> None:
    page = (ROOT / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    for key in _schema_keys(config_schema()):
        if key not in ("source", "redis", "worker", "tables"):
            assert f"`{key}`" in page, key


# -- source.capture ------------------------------------------------------------


def test_capture_defaults_to_triggers_and_logical_is_postgres_only(load: Load, fail: Fail) -> None:
    postgres = "source:\n  kind: postgres\n  dsn: postgresql://h/db\n{capture}tables:\n  - table: s.t\n"
    assert load(postgres.format(capture="")).source.capture == "triggers"
    logical = load(postgres.format(capture="  capture: logical\n"))
    assert logical.source.capture == "logical"
    assert logical.source.deployment == "cdc at 127.0.0.1:6379/0"  # whose slots: namespace and Redis

    failure = fail(postgres.replace("postgres\n", "mssql\n", 1).format(capture="  capture: logical\n"))

    assert (failure.line, failure.field) == (4, "source.capture")
    assert "postgres only" in failure.message
