"""`make test-mssql`: the SQL Server proof in one command.

Finds a SQL Server (CDC_TEST_MSSQL_DSN, or a Docker engine for a SQL Server
2022 container started by the test fixtures) and the installed ODBC drivers
(FreeTDS, Microsoft ODBC Driver 18), says which will run, and runs the
SQL Server tests with CDC_TEST_MSSQL_REQUIRED=1, so that a missing server is
a failure, never a silent pass: the live tests (tests/cdc/sources/test_mssql_live.py),
the shared contract suite's SQL Server half (tests/contract, the `mssql`
harness) and the fault tests of the SQL Server source that need a server.
Without a server it exits 2 with the reason, before running anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import mssql_env  # noqa: E402
from tests.conftest import _docker_answers  # noqa: E402

TESTS = ["tests/cdc/sources/test_mssql_live.py", "tests/contract"]
SELECT = "mssql"  # the live module's tests, and the contract suite's mssql harness


def server_reason() -> str | None:
    """None when a SQL Server can be had, else why not."""
    if os.environ.get("CDC_TEST_MSSQL_DSN"):
        return None
    if _docker_answers():
        return None
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return (
        "no SQL Server: CDC_TEST_MSSQL_DSN is not set, and no Docker engine answers at "
        f"{host} to start {mssql_env_image()}. Set CDC_TEST_MSSQL_DSN to an ODBC connection string of a "
        "database whose login may ALTER DATABASE and create tables and logins (docs/SQLSERVER.md §7), "
        "or start Docker"
    )


def mssql_env_image() -> str:
    from tests.conftest import MSSQL_IMAGE

    return MSSQL_IMAGE


def main(argv: list[str]) -> int:
    reason = server_reason()
    if reason is not None:
        print(f"make test-mssql: {reason}", file=sys.stderr)
        return 2
    drivers = mssql_env.installed_drivers()
    if not drivers:
        print(
            "make test-mssql: no SQL Server ODBC driver is installed: install FreeTDS (tdsodbc) or Microsoft "
            "ODBC Driver 18 (scripts/install-msodbcsql18.sh)",
            file=sys.stderr,
        )
        return 2
    missing = [d for d in mssql_env.DRIVERS if d not in drivers]
    where = "CDC_TEST_MSSQL_DSN" if os.environ.get("CDC_TEST_MSSQL_DSN") else "a SQL Server 2022 container"
    print(f"make test-mssql: against {where}, with {', '.join(drivers)}", file=sys.stderr)
    if missing:
        print(f"make test-mssql: not installed, so not run: {', '.join(missing)}", file=sys.stderr)
    env = {**os.environ, "CDC_TEST_MSSQL_REQUIRED": "1"}
    command = [sys.executable, "-m", "pytest", *TESTS, "-k", SELECT, "-rs", *argv]
    return subprocess.call(command, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
