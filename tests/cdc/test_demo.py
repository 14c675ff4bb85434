"""`cdc demo` (what `make demo` runs): its screen, rendered from a state
snapshot (unit tests), and the whole demo end to end on this machine."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from cdc.config import load_config
from cdc.demo.compare import compare_table, same_value
from cdc.demo.screen import patch_summary, render, wrap_command
from cdc.demo.view import Header, MessageView, PartitionView, RowView, SidecarView, TableView, View

HEADER = Header(
    config_path=".demo/tables.yaml",
    dsn="postgresql://cdc@127.0.0.1:45678/cdc",
    redis_url="redis://127.0.0.1:45679/0",
    cdc=".venv/bin/cdc",
    psql='psql "postgresql://cdc@127.0.0.1:45678/cdc"',
    featured="demo.stations id=7",
    update_sql="update demo.stations set name = 'renamed by me' where id = 7",
)
MESSAGE = re.compile(r" *\d+ region-1 +forecasts ")  # a message line: seq partition section ...
STATION = {"id": 7, "name": "station 7", "active": True, "load_kw": 42.5, "meta": {"zone": 1}}


def a_view(messages: int = 100, events: int = 0) -> View:
    return View(
        header=HEADER,
        sidecars=[
            SidecarView("A", 101, True, "http://127.0.0.1:40001", 200, ("demo.forecasts",)),
            SidecarView("B", 102, True, "http://127.0.0.1:40002", 200, ("demo.stations",)),
        ],
        tables=[
            TableView("demo.forecasts", "streaming", 15.8, 0.05, "done", 250, 250, 250),
            TableView("demo.stations", "snapshotting", 2.0, None, "12/20", 20, 12, 12),
        ],
        partitions=[PartitionView(p, 40, 80, 0) for p in ("grid", "region-1", "region-2", "region-3")],
        messages=[
            MessageView(
                i,
                "region-1",
                "forecasts",
                str(i),
                "U",
                [{"op": "replace", "path": "/price", "value": "1.25"}],
            )
            for i in range(1, messages + 1)
        ],
        row=RowView(STATION, {k: _json(v) for k, v in STATION.items()} | {"@v": "99"}, dict(STATION)),
        events=[f"event {i}" for i in range(events)],
        elapsed=12.0,
    )


def _json(value: object) -> str:
    import json

    return json.dumps(value)


@pytest.mark.parametrize(("width", "height"), [(119, 40), (79, 24), (79, 18)])
def test_the_screen_fits_the_terminal_and_keeps_its_header_and_footer(width: int, height: int) -> None:
    lines = render(a_view(events=3), width, height)
    assert len(lines) <= height
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    text = "\n".join(lines)
    for kept in (".demo/tables.yaml", HEADER.dsn, HEADER.redis_url, "http://127.0.0.1:40001"):
        assert kept in text
    # the footer's commands, whole (a long one wrapped with a trailing backslash)
    joined = text.replace(" \\\n", " ").replace("\n      ", "\n")
    assert ".venv/bin/cdc status -c .demo/tables.yaml" in joined
    assert "curl -s http://127.0.0.1:40001/metrics | grep cdc_" in joined
    assert ".venv/bin/cdc subscribe -c .demo/tables.yaml --partition grid" in joined
    assert f'{HEADER.psql} -c "{HEADER.update_sql}"' in " ".join(joined.split())
    assert lines[-1].strip().endswith('where id = 7"')  # the footer is the bottom, never cut off


def test_an_80x24_terminal_still_shows_messages_every_table_and_partition() -> None:
    lines = render(a_view(events=3), 79, 24)
    text = "\n".join(lines)
    assert sum(bool(MESSAGE.match(line)) for line in lines) >= 3
    for name in ("demo.forecasts", "demo.stations", "grid", "region-1", "region-2", "region-3"):
        assert name in text
    assert "12/20" in text  # snapshot progress
    assert "all three agree" in text


def test_the_newest_messages_are_shown_newest_last() -> None:
    lines = render(a_view(messages=100), 119, 40)
    seqs = [int(line.split()[0]) for line in lines if MESSAGE.match(line)]
    assert seqs and seqs[-1] == 100 and seqs == sorted(seqs)


def test_the_row_in_flight_names_the_column_and_who_is_behind() -> None:
    view = a_view()
    newer = STATION | {"load_kw": 50.0}
    redis = {k: _json(v) for k, v in newer.items()}
    lines = render(View(**{**view.__dict__, "row": RowView(newer, redis, dict(STATION))}), 119, 40)
    assert any("in flight: load_kw (replica behind)" in line for line in lines)


def test_the_op_rendering_insert_update_delete() -> None:
    insert = [{"op": "replace", "path": "", "value": {"id": 3, "price": "1.50", "status": "draft"}}]
    assert patch_summary("I", insert) == '+ id=3 price="1.50" status="draft"'
    assert patch_summary("D", [{"op": "replace", "path": "", "value": None}]) == "-"
    update = [
        {"op": "replace", "path": "/price", "value": "1.75"},
        {"op": "add", "path": "/a~1b", "value": 1},
        {"op": "remove", "path": "/gone"},
    ]
    assert patch_summary("U", update) == 'price="1.75" +a/b=1 -gone'
    assert patch_summary("S", [{"op": "replace", "path": "/n", "value": Decimal("1e400")}]) == "n=1E+400"


def test_a_long_command_wraps_at_a_space_outside_quotes() -> None:
    command = (
        'psql "postgresql://cdc@127.0.0.1:45678/cdc" -c "update demo.stations set name = \'x\' where id = 7"'
    )
    lines = wrap_command(command, 60, indent="  ")
    assert len(lines) == 2 and all(line.endswith(" \\") for line in lines[:-1])
    assert all(len(line) <= 60 for line in lines)
    assert " ".join(line.removesuffix(" \\").strip() for line in lines) == command


def test_values_compare_by_what_the_sidecar_writes() -> None:
    moment = dt.datetime(2024, 2, 29, 11, 45, 30, 120000, tzinfo=dt.UTC)
    assert same_value(Decimal("12.50"), "12.50")
    assert not same_value(Decimal("12.50"), "12.25")
    assert same_value(moment, "2024-02-29T11:45:30.12+00:00")
    assert not same_value(moment, "2024-02-29T11:45:30")
    assert same_value(10.0, 10) and not same_value(1, True) and same_value(None, None)


def test_the_closing_line_names_the_key_that_differs() -> None:
    rows = {("grid", "7"): dict(STATION), ("grid", "8"): STATION | {"id": 8}}
    replicas = {"grid": {"stations": {"7": dict(STATION), "8": STATION | {"id": 8, "load_kw": 1.0}, "9": {}}}}
    result = compare_table("demo.stations", "stations", rows, replicas)
    assert not result.same
    line = result.line()
    assert line.startswith("replica != PostgreSQL for demo.stations: 1/2 rows equal, 2 differ")
    assert "key 8 (partition grid): load_kw: PostgreSQL 42.5, replica 1.0" in line
    assert "key 9 (partition grid): in the replica, not in PostgreSQL" in line
    same = compare_table(
        "demo.stations", "stations", rows, {"grid": {"stations": {k: v for (_, k), v in rows.items()}}}
    )
    assert same.line() == "replica == PostgreSQL: 2/2 rows of demo.stations"


@pytest.mark.timeout(240)
def test_demo_runs_two_sidecars_survives_a_kill_and_ends_with_the_replica_equal(
    tmp_path: Path, postgres_dsn: str, redis_url: str
) -> None:
    # The fixtures are only asked for so that the test is skipped (or fails
    # under CI) where the servers cannot run; the demo starts its own.
    args = ["--dir", str(tmp_path / "demo"), "--duration", "16", "--rate", "40", "--kill-after", "5"]
    result = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "demo", *args], capture_output=True, text=True, timeout=200
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "\x1b" not in out  # piped: plain lines, no escape codes
    assert "SIGKILL to sidecar" in out
    assert "moved from sidecar" in out and "after" in out, out[-3000:]
    assert "replica == PostgreSQL:" in out and "rows of demo.forecasts" in out
    assert "rows of demo.stations" in out
    assert "replica != PostgreSQL" not in out
    assert "sidecars stopped: " in out and "exit 0" in out
    assert "PostgreSQL and Redis stopped" in out
    config = load_config(tmp_path / "demo" / "tables.yaml")  # the file it wrote is an ordinary config
    assert [t.table for t in config.tables] == ["demo.forecasts", "demo.stations"]
