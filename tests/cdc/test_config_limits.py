"""The config loader's limits, as an operator meets them: YAML aliases that
recurse or expand, values too long to echo, values that may hold a password,
durations and sizes outside what Redis and the sources honour, the Redis URL's
database, the health address. Each refusal is ``<file>:<line>: <field>:
<message>`` (exit code 2); the command line's side is in test_operator_cli.py.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.config import Config, config_schema, load_config, parse_config
from cdc.durations import parse_duration
from cdc.errors import ConfigError

PASSWORD = "Zr8/kk@2p#x"
MESSAGE = re.compile(r"(?P<file>.+?):(?P<line>[0-9]+): (?P<field>[^:]+): (?P<message>.+)", re.S)
HEAD = "source:\n  kind: postgres\n  dsn: postgresql://cdc@db1/planning\n"
TABLE = "tables:\n  - table: public.forecasts\n"


class Failure(NamedTuple):
    line: int
    field: str
    message: str


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "tables.yaml"


@pytest.fixture
def fail(path: Path) -> Callable[[str], Failure]:
    def fail(text: str) -> Failure:
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        with pytest.raises(ConfigError) as info:
            load_config(path, {})
        assert info.value.exit_code == 2
        match = MESSAGE.fullmatch(str(info.value))
        assert match, f"not <file>:<line>: <field>: <message>: {info.value}"
        assert match["file"] == str(path)
        return Failure(int(match["line"]), match["field"], match["message"])

    return fail


def load(text: str) -> Config:
    return parse_config(textwrap.dedent(text), "tables.yaml", {})


# -- YAML aliases --------------------------------------------------------------


def test_an_alias_inside_its_own_value_is_refused_at_its_line(fail: Callable[[str], Failure]) -> None:
    assert fail(HEAD + "tables: &t [*t]\n") == Failure(
        4,
        "tables[0]",
        "the alias *t refers to a value that contains it, which would be infinite: "
        "repeat a value with an alias, never inside itself",
    )
    entry = HEAD + "tables:\n  - &entry\n    table: public.a\n    columns:\n      - *entry\n"
    failure = fail(entry)
    assert (failure.line, failure.field) == (8, "tables[0].columns[0]")


def test_an_alias_bomb_is_refused_at_once_naming_the_alias(fail: Callable[[str], Failure]) -> None:
    """Nine lines that expand to half a billion values: refused in well under
    a second, without building any of it."""
    levels = ['  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n']
    for level in range(1, 9):
        name, previous = chr(ord("a") + level), chr(ord("a") + level - 1)
        levels.append(f"  {name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n")
    started = time.monotonic()
    failure = fail(HEAD + "worker:\n" + "".join(levels) + TABLE)
    assert time.monotonic() - started < 2
    assert (failure.line, failure.field) == (13, "worker.i[0]")
    assert failure.message.startswith("YAML aliases repeat 490,329,036 values")
    assert "the alias *h alone repeats 48,427,561" in failure.message


def test_aliases_that_share_a_value_among_many_tables_load() -> None:
    """What aliases are for: one backoff list for 2,000 tables repeats 26,000
    values, below the file's own 30,000."""
    entries = "".join(f"  - table: public.t{i}\n    backoff: *slow\n" for i in range(1, 2000))
    config = load(
        HEAD
        + "tables:\n  - table: public.t0\n    backoff: &slow [[5, 50ms], [20, 200ms], [100, 1s], [null, 5s]]\n"
        + entries
    )
    assert len(config.tables) == 2000
    assert {t.backoff for t in config.tables} == {((5, 0.05), (20, 0.2), (100, 1.0), (None, 5.0))}


def test_a_merge_key_is_not_a_duplicate_key() -> None:
    config = load(
        HEAD
        + "tables:\n  - &base\n    table: public.a\n    partition: p\n    operations: [I, U]\n"
        + "  - <<: *base\n    table: public.b\n    section: b\n"
    )
    second = config.tables[1]
    assert (second.table, second.section, second.operations) == ("public.b", "b", frozenset({"I", "U"}))


def test_a_key_must_be_a_name(fail: Callable[[str], Failure]) -> None:
    assert fail(HEAD + "worker:\n  1: x\n" + TABLE) == Failure(
        5, "worker.1", "a key must be a name (quote a key such as 1, true or null)"
    )


def test_nesting_deeper_than_64_levels_is_refused(fail: Callable[[str], Failure]) -> None:
    failure = fail(HEAD + "tables: " + "[" * 500 + "]" * 500 + "\n")
    assert failure.line == 4 and failure.message == "nested deeper than 64 levels"
    assert failure.field.startswith("tables[0][0]")


def test_nesting_past_libyamls_own_limit_gets_the_same_refusal(fail: Callable[[str], Failure]) -> None:
    """PyYAML 6.0.4's libyaml stops scanning at 1,000 levels, before the
    composer counts 64: the message and the line are the same (the field is
    the deepest one reached); with older wheels the composer refuses it."""
    failure = fail(HEAD + "tables: " + "[" * 5000 + "]" * 5000 + "\n")
    assert failure.line == 4 and failure.message == "nested deeper than 64 levels"
    assert failure.field.startswith("tables")


# -- values in messages ----------------------------------------------------------


def test_a_50_mb_value_is_cut_in_the_message(fail: Callable[[str], Failure]) -> None:
    value = "x" * 50_000_000
    failure = fail(HEAD + f"redis:\n  namespace: '@{value}'\n" + TABLE)
    assert (failure.line, failure.field) == (5, "redis.namespace")
    assert failure.message == f"'@{'x' * 78}… is not valid here (must match ^[A-Za-z0-9_][A-Za-z0-9_.-]*$)"


def test_long_names_are_cut_wherever_they_are_quoted(fail: Callable[[str], Failure]) -> None:
    key = "k" * 1000  # YAML's longest key without a "? " before it
    failure = fail(HEAD + f"worker:\n  {key}: 1\n" + TABLE)
    assert failure.field == "worker." + "k" * 80 + "…"
    assert failure.message.startswith("unknown key " + "k" * 80 + "… (allowed: ")
    table = "public." + "t" * 100_000
    failure = fail(HEAD + f"tables:\n  - table: {table}\n")
    assert failure.message == f"'public.{'t' * 72}… is too long"
    longest = "public." + "t" * 128
    failure = fail(HEAD + f"tables:\n  - table: {longest}\n  - table: {longest}\n")
    assert failure.message == f"{longest[:80]}… is registered twice (first as tables[0] on line 5)"
    assert len(str(_error(lambda: load_config_named(table)))) < 300


def load_config_named(table: str) -> None:
    load(HEAD + TABLE).table(table)


def _error(call: Callable[[], Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call()
    return info.value


@pytest.mark.parametrize(
    ("text", "field"),
    [
        # the two environment variables swapped
        (
            f"source:\n  kind: postgres\n  dsn: redis://:{PASSWORD}@cache:6379/0\nredis:\n  url: postgresql://cdc:{PASSWORD}@db1/planning\n",
            "redis.url",
        ),
        # a scheme that is no Redis one
        (HEAD + f"redis:\n  url: http://cdc:{PASSWORD}@cache:6379/0\n", "redis.url"),
        # the DSN given as a list, as a mapping, as a number
        (f"source:\n  kind: postgres\n  dsn: [postgresql://cdc:{PASSWORD}@db1/planning]\n", "source.dsn"),
        (f"source:\n  kind: postgres\n  dsn: {{user: cdc, password: '{PASSWORD}'}}\n", "source.dsn"),
        # the whole source section given as the DSN
        (f"source: postgresql://cdc:{PASSWORD}@db1/planning\n", "source"),
        # the Redis section given as the URL
        (HEAD + f"redis: redis://:{PASSWORD}@cache:6379/0\n", "redis"),
        # a DSN with a malformed reference next to the password
        (f"source:\n  kind: postgres\n  dsn: 'postgresql://cdc:${{{PASSWORD}@db1/planning'\n", "source.dsn"),
        # a password with an unencoded / (redis-py reads the rest as the database)
        (HEAD + f"redis:\n  url: redis://cdc:{PASSWORD}@cache:6379/0\n", "redis.url"),
    ],
)
def test_a_value_that_may_hold_a_password_is_never_shown(
    fail: Callable[[str], Failure], text: str, field: str
) -> None:
    failure = fail(text + ("" if "tables" in text else TABLE))
    assert failure.field == field
    assert "not shown: it may hold a password" in failure.message
    for piece in (PASSWORD, "Zr8", "kk@2p", "2p#x"):
        assert piece not in str(failure)


# -- bounds: every duration and size -----------------------------------------------


def bounded_options() -> list[tuple[str, str, dict[str, Any]]]:
    """(section, key, schema) of every duration and integer option."""
    schema = config_schema()
    out = []
    for section in ("source", "redis", "worker"):
        for key, prop in schema["properties"][section]["properties"].items():
            if prop.get("$ref") == "#/$defs/duration" or prop.get("type") == "integer":
                out.append((section, key, prop))
    return out


def test_every_duration_and_size_has_bounds() -> None:
    options = bounded_options()
    assert len(options) == 13
    for section, key, prop in options:
        if prop.get("type") == "integer":
            assert "minimum" in prop and "maximum" in prop, f"{section}.{key}"
        else:
            assert "durationMinimum" in prop and "durationMaximum" in prop, f"{section}.{key}"
    backoff = config_schema()["properties"]["tables"]["items"]["properties"]["backoff"]["items"]
    limit, wait = backoff["prefixItems"]
    assert "maximum" in limit and "durationMaximum" in wait


def _option_text(section: str, key: str, value: str) -> str:
    if section == "source":
        return f"source:\n  kind: postgres\n  dsn: postgresql://cdc@db1/planning\n  {key}: {value}\n" + TABLE
    return HEAD + f"{section}:\n  {key}: {value}\n" + TABLE


@pytest.mark.parametrize(
    ("section", "key", "prop"), bounded_options(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_each_bound_is_inclusive_and_a_step_beyond_is_refused(
    fail: Callable[[str], Failure], section: str, key: str, prop: dict[str, Any]
) -> None:
    line = 4 if section == "source" else 5
    if prop.get("type") == "integer":
        low, high = prop["minimum"], prop["maximum"]
        below, above = str(low - 1), str(high + 1)
        messages = (
            f"{below} is less than the minimum of {low}",
            f"{above} is greater than the maximum of {high}",
        )
    else:
        low, high = prop["durationMinimum"], prop["durationMaximum"]
        # a millisecond beyond, written in seconds
        below = f"{parse_duration(low) - 0.001:.3f}"
        above = f"{parse_duration(high) + 0.001:.3f}"
        off = " (or 0, which turns it off)" if prop.get("durationOff") else ""
        messages = (
            f"{below} is less than the minimum of {low}{off}",
            f"{above} is greater than the maximum of {high}",
        )
    for value in (low, high):
        loaded = getattr(getattr(load(_option_text(section, key, str(value))), section), key)
        assert loaded == (value if isinstance(value, int) else parse_duration(value))
    for value, message in zip((below, above), messages, strict=True):
        if float(value) < 0:
            continue  # a negative duration: not a duration at all (test_config.py)
        assert fail(_option_text(section, key, value)) == Failure(line, f"{section}.{key}", message)


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("worker", "lease_ttl", "0", "0 is less than the minimum of 500ms"),
        (
            "worker",
            "page_size",
            "100000000000000000000",
            "100000000000000000000 is greater than the maximum of 100000",
        ),
        ("redis", "tombstone_ttl", "200000000000d", "'200000000000d' is greater than the maximum of 3650d"),
        ("source", "query_timeout", "0", "0 is less than the minimum of 1s"),
        (
            "source",
            "cleanup_interval",
            "10s",
            "'10s' is less than the minimum of 1m (or 0, which turns it off)",
        ),
        ("worker", "max_row_bytes", "1", "1 is less than the minimum of 1024"),
    ],
)
def test_the_reported_nonsense_is_refused(
    fail: Callable[[str], Failure], section: str, key: str, value: str, message: str
) -> None:
    line = 4 if section == "source" else 5
    assert fail(_option_text(section, key, value)) == Failure(line, f"{section}.{key}", message)


def test_cleanup_interval_0_turns_cleanup_off() -> None:
    assert load(_option_text("source", "cleanup_interval", "0")).source.cleanup_interval == 0


def test_a_backoff_wait_has_bounds(fail: Callable[[str], Failure]) -> None:
    entry = HEAD + "tables:\n  - table: public.a\n    backoff: [[5, 0ms], [null, 2h]]\n"
    assert fail(entry) == Failure(6, "tables[0].backoff[0][1]", "'0ms' is less than the minimum of 1ms")


# -- redis.url ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "cluster", "why"),
    [
        ("redis://cache/abc", False, "the database must be a number"),
        ("redis://cache:6379/1/2", False, "the database must be a number"),
        ("redis://cache:6379/0?db=x", False, "the database must be a number"),
        ("unix:///run/redis.sock?db=one", False, "the database must be a number"),
        ("redis://cache:6379/1?db=2", False, "the database is given twice"),
        ("redis://cache:6379/3", True, "a Redis Cluster has database 0 only"),
        ("redis://cache:63x9/0", False, "the host or port cannot be read"),
        ("redis://[::1:6379/0", False, "the host or port cannot be read"),
        ("redis://cdc:pa#ss@cache:6379/0", False, "a Redis URL has no #fragment"),
    ],
)
def test_a_redis_url_that_redis_py_would_misread_is_refused(
    fail: Callable[[str], Failure], url: str, cluster: bool, why: str
) -> None:
    failure = fail(HEAD + f"redis:\n  url: '{url}'\n  cluster: {str(cluster).lower()}\n" + TABLE)
    assert (failure.line, failure.field) == (5, "redis.url")
    assert failure.message.startswith(why)
    assert failure.message.endswith("the value is not shown: it may hold a password")


@pytest.mark.parametrize(
    "url",
    [
        "redis://cache",
        "redis://cache:6379/",
        "redis://cache:6379/15",
        "rediss://u:p%2Fw@cache:6380/2?db=2",
        "unix:///run/redis.sock?db=1",
    ],
)
def test_a_redis_url_with_a_numbered_database_loads(url: str) -> None:
    assert load(HEAD + f"redis:\n  url: '{url}'\n" + TABLE).redis.url == url


# -- worker.health ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "address"),
    [
        ("'[::1]:9478'", ("::1", 9478)),
        ("'[::]:9100'", ("::", 9100)),
        ("'[fe80::1%eth0]:9100'", ("fe80::1%eth0", 9100)),
        ("0.0.0.0:9478", ("0.0.0.0", 9478)),
        ("sidecar_1.pods.local:9478", ("sidecar_1.pods.local", 9478)),
        ("':9100'", ("127.0.0.1", 9100)),
    ],
)
def test_health_addresses_ipv6_too(written: str, address: tuple[str, int]) -> None:
    assert load(HEAD + f"worker:\n  health: {written}\n" + TABLE).worker.health == address


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("'::1:9478'", "an IPv6 address goes in brackets, as in [::1]:9478; got '::1:9478'"),
        ("'[::g]:9478'", "'::g' is not an IPv6 address"),
        ("'[::1]9478'", "expected host:port, [IPv6]:port or :port (on 127.0.0.1), got '[::1]9478'"),
        ("'-bad-.local:9478'", "'-bad-.local' is neither an IP address nor a host name"),
        ("'a..b:9478'", "'a..b' is neither an IP address nor a host name"),
        ("'my host:9478'", "expected host:port, [IPv6]:port or :port (on 127.0.0.1), got 'my host:9478'"),
        ("'[::1]:70000'", "port 70000 is out of range (0-65535)"),
    ],
)
def test_a_bad_health_address_is_refused_at_load(
    fail: Callable[[str], Failure], written: str, message: str
) -> None:
    assert fail(HEAD + f"worker:\n  health: {written}\n" + TABLE) == Failure(5, "worker.health", message)


# -- linear in the number of tables ----------------------------------------------------


def _tables(count: int) -> str:
    entry = '  - table: public.t{i}\n    columns: [id, a, b]\n    key: "{{id}}"\n    backoff: [[5, 50ms], [null, 1s]]\n'
    return HEAD + "worker:\n  health: null\ntables:\n" + "".join(entry.format(i=i) for i in range(count))


def _cpu_seconds(text: str) -> float:
    started = time.process_time()
    assert len(parse_config(text, "tables.yaml", {}).tables) == text.count("- table:")
    return time.process_time() - started


def test_loading_is_linear_in_the_number_of_tables() -> None:
    """Four times the tables take about four times as long (it was sixteen:
    5,000 tables took 159 s, 20,000 minutes). CPU time, best of two, so that
    a busy machine does not decide."""
    small, large = _tables(500), _tables(2000)
    ratio = min(_cpu_seconds(large) for _ in range(2)) / min(_cpu_seconds(small) for _ in range(2))
    assert ratio < 7, f"2000 tables took {ratio:.1f} times as long as 500"


# -- whatever the file holds: a Config or a ConfigError -------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "5s",
            "0",
            "-1",
            "1e20",
            "200000000000d",
            "redis://h/abc",
            "[::1]:1",
            "::1:9",
            "{Id}",
            "public.t",
            "${X}",
            "${X",
        ]
    ),
)
_KEYS = st.one_of(
    st.sampled_from(
        ["source", "redis", "worker", "tables", "kind", "dsn", "url", "health", "lease_ttl", "table"]
    ),
    st.sampled_from(
        ["columns", "backoff", "partition", "key", "section", "cluster", "page_size", "retention"]
    ),
    st.integers(),
    st.booleans(),
    st.none(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=20,
)
_PLACES = st.sampled_from(["", "source", "redis", "worker", "table"])


def _place(doc: dict[Any, Any], place: str) -> Any:
    """Where an edit goes: the file, a section, or the first table (an earlier
    edit may have replaced any of them with something else)."""
    if place == "":
        return doc
    if place == "table":
        tables = doc.get("tables")
        return tables[0] if isinstance(tables, list) and tables else None
    return doc.get(place)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PLACES, _KEYS, _VALUES), max_size=3))
def test_any_file_loads_or_is_refused_as_a_config_error(edits: list[tuple[str, Any, Any]]) -> None:
    """Valid files changed at random: never another exception (a traceback)."""
    doc: dict[Any, Any] = {
        "source": {"kind": "postgres", "dsn": "postgresql://cdc@db1/planning"},
        "redis": {},
        "worker": {},
        "tables": [{"table": "public.t"}],
    }
    for place, key, value in edits:
        target = _place(doc, place)
        if isinstance(target, dict):
            target[key] = value
    try:
        parse_config(yaml.safe_dump(doc), "tables.yaml", {})
    except ConfigError as exc:
        assert MESSAGE.fullmatch(str(exc)) or "malformed YAML" in str(exc), str(exc)
