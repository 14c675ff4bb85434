"""``cdc status`` as an operator runs it: a real sidecar, real servers, the
command as a subprocess whose stdout is a pipe (``| less``, ``| grep``, a
script): nothing cut, JSON typed, and the Redis side shown while the source
is down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rich.console import Console

from cdc.config import parse_config
from cdc.devservers import free_port
from cdc.status_cmd import tables_view, typed_snapshot, typed_worker
from tests.chaos import Sidecar
from tests.e2e import config_text, create_tables, enable_tracking, wait_for, write_config

# A table name and column headers that rich cut at 80 columns when piped
# ("shop.cus…", "checkpoi…").
LONG_TABLE = "customers_of_the_northern_region_with_a_long_name"


def cdc(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The command line with stdout and stderr pipes, and no COLUMNS: as a script sees it."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "--text-logs", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def status_json(config: Path, expected_exit: int = 0) -> dict[str, Any]:
    result = cdc("status", "-c", str(config), "--json")
    assert result.returncode == expected_exit, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def long_table_config(path: Path, dsn: str, redis_url: str, namespace: str, schema: str) -> Path:
    """One table with a long name; rows above 1024 bytes go to the dead letter."""
    path.write_text(
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        "worker:\n  health: null\n  heartbeat: 300ms\n  max_row_bytes: 1024\n"
        f"tables:\n  - table: {schema}.{LONG_TABLE}\n    partition: all\n    section: c\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.timeout(120)
async def test_status_piped_is_never_cut_and_its_json_is_typed(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    table = f"{pg_schema}.{LONG_TABLE}"
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f"create table {table} (id int primary key, note text)")
        await conn.execute(f"insert into {table} select i, 'n' || i from generate_series(1, 20) i")
        await conn.execute(f"insert into {table} values (21, repeat('x', 5000))")  # above max_row_bytes
    path = long_table_config(tmp_path / "long.yaml", postgres_dsn, redis_url, namespace, pg_schema)
    await enable_tracking(parse_config(path.read_text(), str(path), {}))
    sidecar = Sidecar(path, tmp_path / "sidecar.log")
    try:

        async def streaming_with_its_worker() -> bool:
            report = status_json(path)
            row = report["tables"][0]
            return (
                row["state"] == "streaming"
                and row["dead_letters"] == 1
                and any(w["tables"] == [table] for w in report["workers"])
            )

        await wait_for(streaming_with_its_worker, 60, f"{table} streaming, its dead letter and its worker")
        report = status_json(path)
        row, worker = report["tables"][0], report["workers"][0]
        assert report["source"] == {"kind": "postgres", "version": row["source_version"], "error": None}
        assert isinstance(row["checkpoint"], int) and isinstance(row["source_version"], int)
        assert row["lag_versions"] == max(0, row["source_version"] - row["checkpoint"])
        assert row["snapshot"] is None and row["error"] is None and row["worker_state"] == "streaming"
        assert row["owner"] == worker["id"] and sidecar.is_worker(worker["id"])
        assert isinstance(worker["applied"], int) and worker["applied"] >= 20
        assert isinstance(worker["queue_depth"], int) and isinstance(worker["batches"], int)
        assert isinstance(worker["heartbeat_at"], float) and isinstance(worker["started_at"], float)
        assert isinstance(worker["age"], float) and 0 <= worker["age"] < 30
        assert isinstance(worker[f"applied:{table}"], int)  # the heartbeat's view of the table
        assert worker[f"state:{table}"] == "streaming"

        piped = cdc("status", "-c", str(path))
        assert piped.returncode == 0, piped.stderr
        lines = piped.stdout.splitlines()
        assert "…" not in piped.stdout, piped.stdout
        (table_line,) = [line for line in lines if table in line and "streaming" in line]  # whole, one line
        assert worker["id"] in table_line  # the owner, whole, on the table's line
        assert str(row["checkpoint"]) in table_line
        header = next(line for line in lines if "checkpoint" in line)
        for column in ("state", "source", "lag (versions)", "dead letters", "owner", "worker state"):
            assert column in header, header
        # and the workers view: the worker's line names its table, whole
        assert len([line for line in lines if worker["id"] in line and table in line]) == 2
    finally:
        await sidecar.stop()


async def test_status_shows_the_redis_side_while_the_source_is_down_and_exits_3(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    """What an operator needs in an incident: checkpoints and owners from
    Redis, the source's column "unreachable" with the reason (no password),
    exit 3 (cannot connect) once everything is printed."""
    await create_tables(postgres_dsn, pg_schema)
    good = write_config(tmp_path / "good.yaml", pg_schema, postgres_dsn, redis_url, namespace)
    assert cdc("tracking", "enable", "-c", str(good)).returncode == 0
    run = cdc("run", "-c", str(good), "--once")
    assert run.returncode == 0, run.stderr
    before = {t["table"]: t for t in status_json(good)["tables"]}

    port = free_port()  # nothing listens there
    down = tmp_path / "down.yaml"
    down.write_text(
        config_text(pg_schema, f"postgresql://cdc:s3cret@127.0.0.1:{port}/db", redis_url, namespace),
        encoding="utf-8",
    )
    report = status_json(down, expected_exit=3)
    assert report["source"]["version"] is None and str(port) in report["source"]["error"]
    for row in report["tables"]:
        assert row["checkpoint"] == before[row["table"]]["checkpoint"]  # the Redis side, as it is
        assert row["state"] == "streaming" and row["dead_letters"] == 0
        assert row["source_version"] is None and row["lag_versions"] is None  # unknown, not 0

    text = cdc("status", "-c", str(down))
    assert text.returncode == 3
    assert "s3cret" not in text.stdout + text.stderr
    assert "source unreachable: " in text.stdout and str(port) in text.stdout
    assert "source unreachable" in text.stderr
    for table, row in before.items():
        (line,) = [line for line in text.stdout.splitlines() if table in line and "unreachable" in line]
        assert str(row["checkpoint"]) in line and "streaming" in line


def test_status_exits_3_and_prints_nothing_when_redis_is_down(
    postgres_dsn: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    path = write_config(
        tmp_path / "t.yaml", pg_schema, postgres_dsn, f"redis://127.0.0.1:{free_port()}", namespace
    )
    for args in ((), ("--json",)):
        result = cdc("status", "-c", str(path), *args)
        assert result.returncode == 3, result.stderr
        assert result.stdout == "" and "redis" in result.stderr.lower()


def test_worker_fields_are_typed_and_unknown_ones_are_null() -> None:
    heartbeat = {
        "id": "w-1",
        "tables": "s.a,s.b",
        "applied": "12",
        "queue_depth": "",
        "batches": "x",
        "heartbeat_at": "1700000000.250",
        "age": "0.4",
        "applied:s.a": "7",
        "state:s.a": "streaming",
        "error:s.b": "cannot connect to postgresql://app:s3cret@db/x",
    }
    assert typed_worker(heartbeat) == {
        "id": "w-1",
        "tables": ["s.a", "s.b"],
        "applied": 12,
        "queue_depth": None,
        "batches": None,
        "heartbeat_at": 1700000000.25,
        "age": 0.4,
        "applied:s.a": 7,
        "state:s.a": "streaming",
        "error:s.b": "cannot connect to postgresql://app:***@db/x",
    }
    assert typed_worker({"id": "w-2", "tables": ""})["tables"] == []
    assert typed_worker({"id": "w-3"})["tables"] == []


def test_snapshot_progress_is_numbers_and_an_unknown_total_is_null() -> None:
    assert typed_snapshot({"rows": "500", "total": "1200"}) == {"rows": 500, "total": 1200}
    assert typed_snapshot({"rows": "500", "total": "?"}) == {"rows": 500, "total": None}
    assert typed_snapshot(None) is None


def _row(owner: str | None, worker_state: str | None) -> dict[str, Any]:
    return {
        "table": "app.t", "state": "streaming", "checkpoint": 7, "source_version": 9, "lag_versions": 2,
        "updated_at": None, "snapshot": None, "dead_letters": 0, "owner": owner,
        "worker_state": worker_state, "error": None,
    }  # fmt: skip


def _rendered(row: dict[str, Any]) -> str:
    console = Console(width=250, record=True)
    console.print(tables_view([row]))
    return console.export_text()


def test_the_table_view_says_when_no_sidecar_runs_a_streaming_table() -> None:
    """The checkpoint's state stays ``streaming`` after every sidecar stopped:
    the line must not read as if the table were followed."""
    nobody = _rendered(_row(None, None))
    assert "no sidecar holds it" in nobody and "none" in nobody
    dead = _rendered(_row("w-dead", None))
    assert "no heartbeat" in dead and "no sidecar" not in dead
    live = _rendered(_row("w-live", "streaming"))
    assert "no heartbeat" not in live and "no sidecar" not in live
    assert live.count("streaming") == 2  # the checkpoint's state and the worker's
