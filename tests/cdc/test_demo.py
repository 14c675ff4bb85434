"""`cdc demo` (what `make demo` runs): its screen, rendered from a state
snapshot (unit tests), and the whole demo end to end on this machine."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import redis

from cdc.config import load_config
from cdc.demo.compare import compare_table, same_value
from cdc.demo.leftovers import PIDS_FILE, LeftoverError, PidFile, start_time, stop_leftovers
from cdc.demo.screen import patch_summary, render, wrap_command
from cdc.demo.sidecars import sidecar_environment
from cdc.demo.view import Header, MessageView, PartitionView, RowView, SidecarView, TableView, View
from cdc.demo.watch import Holding, holding_of
from cdc.devservers import wait_until

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
    marker = [{"op": "test", "path": "/@reload", "value": True}]
    assert patch_summary("R", marker) == "snapshot written: subscribers reload the section"


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


# The operator's shell may export these for a real database and Redis: the
# demo must use its own servers all the same (and its sidecars too).
OPERATOR_DSN = "postgresql://operator@127.0.0.1:9/production"  # port 9 (discard): nothing answers


def operator_environment(other_redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "CDC_SOURCE_DSN": OPERATOR_DSN,
        "CDC_REDIS_URL": other_redis_url,
        "CDC_CONFIG": "/nonexistent/production.yaml",
    }


def demo_keys(url: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match="demo:*", count=1000))
    finally:
        client.close()


@pytest.mark.timeout(240)
def test_demo_runs_two_sidecars_survives_a_kill_and_ends_with_the_replica_equal(
    tmp_path: Path, postgres_dsn: str, redis_url: str
) -> None:
    # The fixtures' servers are not the demo's (it starts its own): the
    # fixtures' Redis plays the operator's real Redis, exported in the shell.
    assert not demo_keys(redis_url)
    args = ["--dir", str(tmp_path / "demo"), "--duration", "16", "--rate", "40", "--kill-after", "5"]
    result = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=200,
        env=operator_environment(redis_url),
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
    assert not demo_keys(redis_url), "the demo wrote to the operator's Redis (CDC_REDIS_URL)"
    for log in (tmp_path / "demo").glob("sidecar-*.log"):
        assert ":9/production" not in log.read_text(errors="replace"), log.name
    config = load_config(tmp_path / "demo" / "tables.yaml", environ={})  # its servers are written in it
    assert [t.table for t in config.tables] == ["demo.forecasts", "demo.stations"]
    assert config.source.dsn != OPERATOR_DSN and config.redis.url != redis_url
    assert not (tmp_path / "demo" / PIDS_FILE).exists()  # the orderly stop leaves nothing to stop


@pytest.mark.timeout(240)
def test_a_demo_killed_with_sigkill_is_cleaned_up_by_the_next_one(
    tmp_path: Path, postgres_dsn: str, redis_url: str
) -> None:
    directory = tmp_path / "demo"
    first = subprocess.Popen(
        [sys.executable, "-m", "cdc.cli", "demo", "--dir", str(directory), "--duration", "120"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids = PidFile(directory)
    try:
        wait_until(lambda: len(pids.entries()) == 5, 90, "the first demo to record its 5 processes")
    finally:
        first.kill()  # SIGKILL: no orderly stop; its servers and sidecars keep running
        first.wait()
    left = pids.entries()
    try:
        assert {e.role for e in left} == {"demo", "PostgreSQL", "Redis", "sidecar A", "sidecar B"}
        assert all(e.running() for e in left if e.role != "demo")
        second = subprocess.run(
            [sys.executable, "-m", "cdc.cli", "demo", "--dir", str(directory), "--duration", "6"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        out = second.stdout
        assert second.returncode == 0, out[-3000:] + second.stderr[-3000:]
        assert "Traceback" not in second.stderr
        said = [line for line in out.splitlines() if "a previous demo in" in line]
        assert len(said) == 1, out[-3000:]
        for entry in left:
            if entry.role != "demo":
                assert f"{entry.role} (pid {entry.pid})" in said[0]
        assert "replica == PostgreSQL: " in out and "replica != PostgreSQL" not in out
        assert not [e.described() for e in left if e.running()], "left running after the second demo"
        assert not pids.path.exists()
    finally:  # a failure leaves nothing running either
        for entry in left:
            if entry.running():
                os.kill(entry.pid, signal.SIGKILL)


# -- what a previous demo left, without servers: sleep processes stand in --------------------


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_leftovers_are_stopped_and_the_pid_file_removed(tmp_path: Path) -> None:
    procs = [sleeper(), sleeper()]
    pids = PidFile(tmp_path)
    pids.record("sidecar A", procs[0].pid)
    pids.record("Redis", procs[1].pid)
    said: list[str] = []
    try:
        stop_leftovers(tmp_path, said.append)
        assert [p.wait(5) for p in procs] == [-signal.SIGTERM, -signal.SIGTERM]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert len(said) == 1 and f"sidecar A (pid {procs[0].pid}), Redis (pid {procs[1].pid})" in said[0]
    assert not pids.path.exists()


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    """pids.json names a pid that another process has by now: its start time differs."""
    other = sleeper()
    try:
        started = start_time(other.pid)
        assert started is not None
        (tmp_path / PIDS_FILE).write_text(
            json.dumps([{"role": "sidecar A", "pid": other.pid, "start_time": started - 1, "data": None}])
        )
        said: list[str] = []
        stop_leftovers(tmp_path, said.append)
        assert other.poll() is None and said == []
    finally:
        other.kill()
        other.wait()


def test_a_demo_still_running_in_the_directory_is_a_clear_error(tmp_path: Path) -> None:
    running = sleeper()
    try:
        PidFile(tmp_path).record("demo", running.pid)
        with pytest.raises(LeftoverError, match=rf"another cdc demo \(pid {running.pid}\) is running"):
            stop_leftovers(tmp_path, print)
        assert running.poll() is None  # not stopped: it is not a leftover
    finally:
        running.kill()
        running.wait()


def test_the_sidecars_get_none_of_the_operators_cdc_variables() -> None:
    shell = {
        "PATH": "/usr/bin",
        "CDC_SOURCE_DSN": "x",
        "CDC_REDIS_URL": "y",
        "CDC_CONFIG": "z",
        "CDC_HEALTH": "h",
    }
    assert sidecar_environment(shell, health="127.0.0.1:5000") == {
        "PATH": "/usr/bin",
        "CDC_HEALTH": "127.0.0.1:5000",
    }


# -- the table's owner and state during a take-over --------------------------------------------


def test_the_new_owner_owns_the_table_from_the_read_that_names_it() -> None:
    """B killed, C takes the lease: C owns the table from that read on, and
    it is "starting" until C's heartbeat reports it, never orphaned or C standby."""
    assert holding_of("host-101-aa", "streaming", ("B", True)) == Holding("B", "streaming")
    assert holding_of("host-101-aa", "streaming", ("B", False)) == Holding(None, "orphaned")
    assert holding_of("host-103-cc", None, ("C", True)) == Holding("C", "starting")
    assert holding_of("host-103-cc", "snapshotting", ("C", True)) == Holding("C", "snapshotting")
    assert holding_of(None, None, None) == Holding(None, "no owner")
    assert holding_of("elsewhere-9-zz", "streaming", None) == Holding(None, "streaming")
    assert holding_of("elsewhere-9-zz", None, None) == Holding(None, "orphaned")
