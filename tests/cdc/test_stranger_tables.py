"""Issue 13, tried as a stranger would: what a table's mirror holds when other
tables inherit from it, or it is partitioned.

Found on main: the snapshot of a table that others inherit from (``create
table child (...) inherits (parent)``) read the children's rows too, while
the parent's change triggers see only its own rows: those documents were
never updated or deleted again (a stale mirror), and a child row with the
same key as a parent row took its document.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.cdc.test_stranger_keys import cdc, execute


def write_config(path: Path, dsn: str, redis_url: str, namespace: str, schema: str, table: str) -> Path:
    path.write_text(
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n"
        f"tables:\n  - table: {schema}.{table}\n    section: t\n",
        encoding="utf-8",
    )
    return path


def documents(client: redis.Redis, namespace: str) -> dict[str, bytes | None]:
    """data key -> its document's v field, for every live key of the section."""
    keys = sorted(k.decode() for k in client.smembers(f"{namespace}:{{t}}:@index:t"))
    return {key: client.hget(f"{namespace}:{{t}}:t:{key}", "v") for key in keys}


def run_once(path: Path) -> None:
    result = cdc("run", "--once", "-c", str(path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(120)
def test_a_parent_tables_mirror_holds_its_own_rows_not_its_childrens(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    s = pg_schema
    execute(
        postgres_dsn,
        f'create table "{s}".parent (id int primary key, v text)',
        f'create table "{s}".child (extra int) inherits ("{s}".parent)',
        f"""insert into "{s}".parent values (1, 'parent 1')""",
        f"""insert into "{s}".child values (2, 'child 2', 0), (1, 'child 1', 0)""",
    )
    path = write_config(tmp_path / "cdc.yaml", postgres_dsn, redis_url, namespace, s, "parent")
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    client = redis.Redis.from_url(redis_url)
    try:
        run_once(path)
        assert documents(client, namespace) == {"1": b'"parent 1"'}
        execute(
            postgres_dsn,
            f"""update "{s}".child set v = 'child 2 again'""",
            f"""update only "{s}".parent set v = 'parent 1 again'""",
            f"""insert into "{s}".parent values (3, 'parent 3')""",
        )
        run_once(path)
        assert documents(client, namespace) == {"1": b'"parent 1 again"', "3": b'"parent 3"'}
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_a_partitioned_tables_mirror_holds_its_partitions_rows(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    s = pg_schema
    execute(
        postgres_dsn,
        f'create table "{s}".parts (id int primary key, v text) partition by range (id)',
        f'create table "{s}".parts_low partition of "{s}".parts for values from (0) to (10)',
        f'create table "{s}".parts_high partition of "{s}".parts for values from (10) to (100)',
        f"""insert into "{s}".parts values (1, 'one'), (11, 'eleven')""",
    )
    path = write_config(tmp_path / "cdc.yaml", postgres_dsn, redis_url, namespace, s, "parts")
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    client = redis.Redis.from_url(redis_url)
    try:
        run_once(path)
        assert documents(client, namespace) == {"1": b'"one"', "11": b'"eleven"'}
        execute(
            postgres_dsn,
            f"""update "{s}".parts_high set v = 'eleven again'""",
            f"""delete from "{s}".parts where id = 1""",
        )
        run_once(path)
        assert documents(client, namespace) == {"11": b'"eleven again"'}
    finally:
        client.close()
