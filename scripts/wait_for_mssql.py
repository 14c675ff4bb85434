"""Wait until the SQL Server of CDC_TEST_MSSQL_DSN accepts its login, then create
the test database if it is missing (CI: a fresh service container).

    python scripts/wait_for_mssql.py --create-database CdcTest --timeout 300

The DSN's DATABASE is the one created; the wait connects to master. Exits 1
with the last error (its password masked) when the deadline passes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyodbc

from cdc.sources import mssql_sql as sql
from cdc.sources.mssql_dsn import describe_dsn, parse_dsn, scrub
from tests.mssql_env import DRIVERS, FREETDS, Endpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create-database", metavar="NAME")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    dsn = os.environ["CDC_TEST_MSSQL_DSN"]
    endpoint = Endpoint.from_dsn(dsn)
    named = parse_dsn(dsn).get("DRIVER", "").strip("{}")
    master = endpoint.dsn(named if named in DRIVERS else FREETDS, database="master")
    deadline = time.monotonic() + args.timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            conn = pyodbc.connect(master, autocommit=True, timeout=5)
        except pyodbc.Error as exc:
            last = scrub(str(exc), dsn)
            time.sleep(2)  # the container is starting: its login fails until it is up
            continue
        try:
            if args.create_database:
                name = sql.quote(args.create_database)
                conn.execute(f"IF DB_ID(?) IS NULL CREATE DATABASE {name}", args.create_database)
            version = conn.execute("SELECT @@VERSION").fetchone()[0].splitlines()[0]
        finally:
            conn.close()
        print(f"SQL Server is up ({describe_dsn(dsn)}): {version}; database {endpoint.database}")
        return 0
    print(f"SQL Server did not accept the login within {args.timeout:.0f} s ({describe_dsn(dsn)}): {last}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
