"""`cdc demo` (what `make demo` runs) works end to end on this machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cdc.config import load_config


@pytest.mark.timeout(180)
def test_demo_runs_the_sidecar_a_writer_and_a_live_view(
    tmp_path: Path, postgres_dsn: str, redis_url: str
) -> None:
    # The fixtures are only asked for so that the test is skipped (or fails
    # under CI) where the servers cannot run; the demo starts its own.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cdc.cli",
            "demo",
            "--dir",
            str(tmp_path / "demo"),
            "--duration",
            "8",
            "--rate",
            "40",
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    messages = [line for line in result.stdout.splitlines() if line.startswith("[demo] seq")]
    assert len(messages) >= 5, result.stdout[-2000:]
    assert "[demo] stopped" in result.stdout
    config = load_config(tmp_path / "demo" / "tables.yaml")  # the file it wrote is an ordinary config
    assert [t.table for t in config.tables] == ["demo.forecasts", "demo.stations"]
