"""PostgreSQL roles as an operator sets them up (docs/POSTGRES.md): real roles
made with CREATE ROLE ... LOGIN, the command line run as each of them.

- a role with no grants: ``cdc doctor`` lists every privilege it lacks with the
  GRANT that gives it and exits 1; the GRANTs it printed, run as they are,
  make it clean;
- a read-only role: doctor says the retention cleanup cannot run;
- ``cdc tracking enable --grant-to ROLE``: ``cdc run --once`` as that role
  mirrors the tables, and a table added and enabled later (without
  ``--grant-to``) is mirrored too, with no new grant;
- ``cdc tracking enable`` as a role that owns none of the tables names them
  all in one error and installs nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc.sources.pg_tracking import net_table_name
from tests.e2e import assert_mirrored, cdc, config_text, create_tables


async def admin(dsn: str, *statements: str | sql.Composable) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)


@pytest.fixture
async def role(postgres_dsn: str, pg_schema: str) -> AsyncIterator[str]:
    """A login role with no privilege of its own; dropped with what it was granted."""
    name = f"sidecar_{uuid.uuid4().hex[:8]}"
    await admin(postgres_dsn, sql.SQL("create role {} login").format(sql.Identifier(name)))
    yield name
    await admin(
        postgres_dsn,
        sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(f"{pg_schema}_trk")),
        sql.SQL("drop owned by {}").format(sql.Identifier(name)),
        sql.SQL("drop role {}").format(sql.Identifier(name)),
    )


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
async def configs(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, role: str, tmp_path: Path
) -> tuple[Path, Path]:
    """(the admin's config, the same tables as ``role``), two tables with rows,
    tracking not enabled yet."""
    await create_tables(postgres_dsn, pg_schema)
    await admin(
        postgres_dsn,
        f"insert into {pg_schema}.items (id, name, qty) select i, 'n' || i, i from generate_series(1, 20) i",
        f"insert into {pg_schema}.lines values (1, 1, 'a', 1), (1, 2, 'b', 2)",
    )
    as_role = make_conninfo(postgres_dsn, user=role)
    return (
        write(tmp_path / "admin.yaml", config_text(pg_schema, postgres_dsn, redis_url, namespace)),
        write(tmp_path / "role.yaml", config_text(pg_schema, as_role, redis_url, namespace)),
    )


def doctor(path: Path) -> tuple[int, list[dict[str, Any]]]:
    result = cdc("doctor", "-c", str(path), "--json")
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def errors(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["level"] == "error"]


async def test_doctor_lists_every_missing_privilege_and_its_grants_make_it_clean(
    configs: tuple[Path, Path], postgres_dsn: str, pg_schema: str, role: str
) -> None:
    admin_config, role_config = configs
    assert cdc("tracking", "enable", "-c", str(admin_config)).returncode == 0
    trk = f"{pg_schema}_trk"
    items, lines = (net_table_name(pg_schema, name) for name in ("items", "lines"))

    code, findings = doctor(role_config)

    assert code == 1
    lacking = {
        (f["extra"]["privilege"], f["extra"]["object"]) for f in errors(findings) if "grant" in f["extra"]
    }
    assert lacking == {
        ("USAGE", f"schema {trk}"),
        ("SELECT", f"table {trk}.tracked_tables"),
        ("USAGE", f"schema {pg_schema}"),
        ("SELECT", f"table {pg_schema}.items"),
        ("SELECT", f"table {trk}.{items}"),
        ("SELECT", f"table {pg_schema}.lines"),
        ("SELECT", f"table {trk}.{lines}"),
        ("UPDATE", f"table {trk}.tracked_tables"),
        ("DELETE", f"table {trk}.{items}"),
        ("DELETE", f"table {trk}.{lines}"),
        ("SELECT", f"table {trk}.retention_claims"),
        ("INSERT", f"table {trk}.retention_claims"),
        ("UPDATE", f"table {trk}.retention_claims"),
        ("DELETE", f"table {trk}.retention_claims"),
    }
    grant = next(f for f in errors(findings) if f["extra"].get("object") == f"table {pg_schema}.items")
    assert f'GRANT SELECT ON TABLE "{pg_schema}"."items" TO "{role}";' in grant["message"]
    text = cdc("doctor", "-c", str(role_config))
    # the script, ready to run, closes the text
    assert text.returncode == 1 and "-- the GRANTs" in text.stdout

    await admin(postgres_dsn, *(f["extra"]["grant"] for f in errors(findings) if "grant" in f["extra"]))
    code, findings = doctor(role_config)

    assert errors(findings) == [] and code == 0
    assert any(f["subject"] == "retention cleanup" and f["message"].startswith("can run") for f in findings)
    # and it does: the sidecar's own start-up cleanup, as the role (doctor once said "can run" while
    # the cleanup failed on SELECT of retention_claims)
    run = cdc("run", "-c", str(role_config), "--once")
    assert run.returncode == 0 and "tracking cleanup fails" not in run.stderr, run.stderr
    assert {f["subject"] for f in findings if f["level"] == "ok"} >= {
        f"{pg_schema}.items",
        f"{pg_schema}.lines",
    }


async def test_doctor_says_cleanup_cannot_run_for_a_read_only_role(
    configs: tuple[Path, Path], postgres_dsn: str, pg_schema: str, role: str
) -> None:
    admin_config, role_config = configs
    assert cdc("tracking", "enable", "-c", str(admin_config)).returncode == 0
    schemas = sql.SQL(", ").join([sql.Identifier(pg_schema), sql.Identifier(f"{pg_schema}_trk")])
    await admin(
        postgres_dsn,
        sql.SQL("grant usage on schema {} to {}").format(schemas, sql.Identifier(role)),
        sql.SQL("grant select on all tables in schema {} to {}").format(schemas, sql.Identifier(role)),
    )

    code, findings = doctor(role_config)

    assert code == 1 and errors(findings)
    assert all(f["extra"]["cleanup"] for f in errors(findings)), errors(findings)
    assert all(f["message"].startswith("the retention cleanup cannot run") for f in errors(findings))
    assert {f["extra"]["privilege"] for f in errors(findings)} == {"INSERT", "UPDATE", "DELETE"}


async def test_grant_to_lets_the_runtime_role_run_now_and_for_a_table_enabled_later(
    configs: tuple[Path, Path],
    postgres_dsn: str,
    redis_client: aioredis.Redis,
    namespace: str,
    pg_schema: str,
    role: str,
) -> None:
    admin_config, role_config = configs
    enabled = cdc("tracking", "enable", "-c", str(admin_config), "--grant-to", role)
    assert enabled.returncode == 0, enabled.stderr
    assert f"{role}: granted" in enabled.stdout

    run = cdc("run", "-c", str(role_config), "--once")

    assert run.returncode == 0 and "tracking cleanup fails" not in run.stderr, run.stderr
    await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
    code, findings = doctor(role_config)
    assert code == 0, errors(findings)

    # a table added later: created and enabled by the admin, no --grant-to, no GRANT
    await admin(
        postgres_dsn,
        f"create table {pg_schema}.extra (id int primary key, note text)",
        f"insert into {pg_schema}.extra values (1, 'later')",
    )
    added = f"  - table: {pg_schema}.extra\n    partition: x\n    section: extra\n"
    write(admin_config, admin_config.read_text() + added)
    write(role_config, role_config.read_text() + added)
    assert cdc("tracking", "enable", "-c", str(admin_config), "--table", f"{pg_schema}.extra").returncode == 0

    run = cdc("run", "-c", str(role_config), "--once")

    assert run.returncode == 0, run.stderr
    document = await redis_client.hgetall(f"{namespace}:{{x}}:extra:1")
    assert document[b"note"] == b'"later"'


async def test_enable_names_every_table_the_role_does_not_own_at_once(
    configs: tuple[Path, Path], postgres_dsn: str, pg_schema: str, role: str
) -> None:
    _, role_config = configs
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
        owner, database = await (
            await conn.execute("select current_user, current_database()")
        ).fetchone() or ("", "")
    await admin(
        postgres_dsn,
        sql.SQL("grant create on database {} to {}").format(sql.Identifier(database), sql.Identifier(role)),
    )

    result = cdc("tracking", "enable", "-c", str(role_config))

    assert result.returncode == 1
    message = result.stderr
    assert (
        f"{pg_schema}.items (owned by {owner})" in message
        and f"{pg_schema}.lines (owned by {owner})" in message
    )
    assert f'GRANT "{owner}" TO "{role}"' in message and "nothing was changed" in message
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
        row = await (await conn.execute("select to_regnamespace(%s)", [f"{pg_schema}_trk"])).fetchone()
    assert row == (None,)  # no tracking schema was installed
    await admin(
        postgres_dsn,
        sql.SQL("revoke create on database {} from {}").format(
            sql.Identifier(database), sql.Identifier(role)
        ),
    )


def test_grant_to_is_for_enable_only(tmp_path: Path) -> None:
    path = write(tmp_path / "t.yaml", "source:\n  kind: postgres\n  dsn: x\ntables:\n  - table: a.b\n")
    result = cdc("tracking", "status", "-c", str(path), "--grant-to", "someone")
    assert result.returncode == 2 and "--grant-to is for enable only" in result.stderr
