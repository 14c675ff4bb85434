"""The SQL Server proof's own machinery, checked here: `make test-mssql` without a
server says why and fails; the CI workflow passes actionlint, which can fail;
the DSN of each ODBC driver is what docs/SQLSERVER.md §5 documents."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.sources.mssql_dsn import parse_dsn
from tests.mssql_env import FREETDS, MSODBC18, Endpoint, dsn_for

ROOT = Path(__file__).resolve().parent.parent
ACTIONLINT = Path(sys.executable).parent / "actionlint"


def test_make_test_mssql_without_a_server_exits_2_with_the_reason(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CDC_TEST_MSSQL_DSN"}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"  # no engine there
    done = subprocess.run(
        [sys.executable, "scripts/test_mssql.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert "make test-mssql: no SQL Server: CDC_TEST_MSSQL_DSN is not set" in done.stderr
    assert f"unix://{tmp_path}/no-docker.sock" in done.stderr and "docs/SQLSERVER.md" in done.stderr
    assert "passed" not in done.stdout  # nothing ran


def test_the_make_targets_run_the_proof_and_actionlint() -> None:
    dry = subprocess.run(
        ["make", "-n", "test-mssql", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert "scripts/test_mssql.py" in dry.stdout and "actionlint" in dry.stdout, dry


def actionlint(*paths: str) -> subprocess.CompletedProcess[str]:
    if not ACTIONLINT.exists():
        pytest.fail(f"actionlint is not installed in {ACTIONLINT.parent}: `make install` (the test extra)")
    return subprocess.run(
        [str(ACTIONLINT), "-no-color", "-oneline", "-shellcheck=", "-pyflakes=", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_workflow_passes_actionlint() -> None:
    done = actionlint(".github/workflows/test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_fails_a_broken_workflow(tmp_path: Path) -> None:
    text = (ROOT / ".github/workflows/test.yml").read_text()
    broken = tmp_path / "broken.yml"
    broken.write_text(text.replace("${{ matrix.mssql }}-latest", "${{ matrix.sqlserver }}-latest"))
    done = actionlint(str(broken))
    assert done.returncode == 1 and 'property "sqlserver" is not defined' in done.stdout, done


def test_the_workflow_runs_both_server_versions_and_both_drivers() -> None:
    text = (ROOT / ".github/workflows/test.yml").read_text()
    assert (
        'mssql: ["2019", "2022"]' in text
        and "mcr.microsoft.com/mssql/server:${{ matrix.mssql }}-latest" in text
    )
    assert "scripts/install-msodbcsql18.sh" in text and "scripts/ensure-servers.sh" in text
    assert "run: make test\n" in text and 'CDC_TEST_MSSQL_REQUIRED: "1"' in text


ADMIN = "DRIVER={FreeTDS};SERVER=db.example;PORT=14330;DATABASE=CdcTest;UID=sa;PWD={p;w}}d};TDS_Version=7.4"


def test_each_driver_gets_its_own_dsn() -> None:
    assert dsn_for(ADMIN, FREETDS) == ADMIN
    driver18 = parse_dsn(dsn_for(ADMIN, MSODBC18))
    assert driver18["DRIVER"].strip("{}") == MSODBC18 and driver18["SERVER"] == "db.example,14330"
    assert (driver18["ENCRYPT"], driver18["TRUSTSERVERCERTIFICATE"]) == ("yes", "yes")
    assert (driver18["DATABASE"], driver18["UID"], driver18["PWD"]) == ("CdcTest", "sa", "p;w}d")
    freetds = parse_dsn(Endpoint.from_dsn(dsn_for(ADMIN, MSODBC18)).dsn(FREETDS, user="r", password="x"))
    assert (freetds["SERVER"], freetds["PORT"], freetds["TDS_VERSION"]) == ("db.example", "14330", "7.4")
    assert (freetds["UID"], freetds["PWD"]) == ("r", "x")
