"""What counts as a change of a table's shape (``cdc.shapes``), and how a
degraded table's failures are logged and exported (``cdc.table_health``)."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

from cdc.config import TableConfig, parse_config
from cdc.describer import Describer
from cdc.errors import SchemaError, SourceUnavailable
from cdc.mapping import TableMapper
from cdc.metrics import Metrics
from cdc.shapes import shape_change
from cdc.sources.base import Column, TableInfo
from cdc.sources.memory import MemorySource
from cdc.table_health import REPEAT_LOG, TableHealth


def info(*columns: tuple[str, str], key: tuple[str, ...] = ("id",), identity: str = "1") -> TableInfo:
    return TableInfo("s.t", "s", "t", key, tuple(Column(n, t) for n, t in columns), identity=identity)


BASE = info(("id", "int"), ("a", "text"), ("b", "int"))


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        (info(("id", "int"), ("a", "text"), ("b", "int")), None),
        (info(("id", "int"), ("a", "text"), ("b", "int"), ("c", "int")), "columns added: c"),
        (info(("id", "int"), ("a", "text")), "columns dropped: b"),
        (info(("id", "int"), ("a", "text"), ("bb", "int")), "columns added: bb; columns dropped: b"),
        (info(("id", "int"), ("a", "text"), ("b", "bigint")), "columns retyped: b int -> bigint"),
        (info(("id", "int"), ("a", "text"), ("b", "int"), key=("id", "a")), "primary key (id) -> (id, a)"),
        (
            info(("id", "int"), ("a", "text"), ("b", "int"), identity="2"),
            "the table was dropped and created again",
        ),
    ],
)
def test_shape_changes_are_named(new: TableInfo, expected: str | None) -> None:
    assert shape_change(BASE, new) == expected


def test_nullability_alone_is_no_change() -> None:
    nullable = TableInfo("s.t", "s", "t", ("id",), (Column("id", "int"), Column("a", "text", True)))
    not_null = TableInfo("s.t", "s", "t", ("id",), (Column("id", "int"), Column("a", "text", False)))
    assert shape_change(nullable, not_null) is None


def test_the_state_gauge_holds_one_state_at_a_time() -> None:
    metrics = Metrics()
    health = TableHealth("s.t", metrics)
    health.state = "streaming"
    health.failed(SchemaError("s.t: no such table"), retry_in=1.0)

    def value(state: str) -> float | None:
        return metrics.registry.get_sample_value("cdc_table_state", {"table": "s.t", "state": state})

    assert (value("degraded"), value("streaming"), value("starting")) == (1.0, 0.0, 0.0)
    assert health.error == "s.t: no such table"
    health.recovered()
    health.state = "streaming"
    assert (value("degraded"), value("streaming"), health.error) == (0.0, 1.0, None)


def test_a_repeated_failure_is_logged_again_only_after_a_while(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    health = TableHealth("s.t", Metrics(), clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "cdc.tracker")
    for _ in range(5):
        health.failed(SchemaError("s.t: no such table"), retry_in=1.0)
        now[0] += 10
    health.failed(SourceUnavailable("PostgreSQL: gone"), retry_in=1.0)  # another failure: logged
    now[0] += REPEAT_LOG
    health.failed(SourceUnavailable("PostgreSQL: gone"), retry_in=1.0)  # the same, a while later
    levels = [(r.levelname, r.error) for r in caplog.records]  # type: ignore[attr-defined]
    assert levels == [
        ("ERROR", "s.t: no such table"),
        ("WARNING", "PostgreSQL: gone"),
        ("WARNING", "PostgreSQL: gone"),
    ]


def shape_of_0_1(described: TableInfo, table_config: TableConfig) -> str:
    """The stored shape as cdc-sync 0.1 computed it (before key values were percent-encoded)."""
    parts = [
        described.fingerprint,
        described.identity,
        [(c.name, c.type_name) for c in described.columns],
        described.primary_key,
        table_config.section,
        table_config.partition.source,
        None if table_config.key is None else table_config.key.source,
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


@pytest.mark.parametrize(
    ("key", "template", "partition", "snapshotted"),
    [
        (("id",), None, "p", False),
        (("id",), "row-{id}", "p", False),
        (("a", "b"), None, "p", True),  # the default key joins them: {a}:{b}
        (("a", "b"), "{a}", "{b}", False),
        (("a", "b"), "{a}:{b}", "p", True),
        (("a", "b"), "{b}", "{a}-{b}", True),
    ],
)
def test_an_upgrade_snapshots_the_tables_whose_keys_are_now_percent_encoded(
    key: tuple[str, ...], template: str | None, partition: str, snapshotted: bool
) -> None:
    """A key or partition of several columns renders ':' and '%' in values
    percent-encoded since 0.2: documents a 0.1 sidecar wrote under 'x:y:z' would
    stay beside the new 'x%3Ay:z' unless the table is snapshotted once (its
    sweep removes them). The stored shape differs for exactly those tables."""
    lines = f"  - table: s.t\n    partition: '{partition}'\n"
    if template is not None:
        lines += f"    key: '{template}'\n"
    text = f"source:\n  kind: postgres\n  dsn: x\nredis:\n  url: redis://localhost\ntables:\n{lines}"
    table_config = parse_config(text, "sidecar.yaml", {}).tables[0]
    described = info(("id", "int"), ("a", "text"), ("b", "text"), key=key)
    describer = Describer(table_config, MemorySource(), max_row_bytes=1 << 20)
    describer.info, describer.mapper = described, TableMapper(table_config, described, 1 << 20)
    assert (describer.shape != shape_of_0_1(described, table_config)) is snapshotted
