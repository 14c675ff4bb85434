"""A name the config shows anyway (the role its DSN names, a table's schema)
is printed even where it matches a piece of the password: masking it would
break the GRANT that doctor prints, and tell that the password holds it."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from tests.e2e import cdc, create_tables, write_config


async def _execute(dsn: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)


async def test_doctor_names_the_role_whose_name_is_part_of_its_password(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    role = "weak" + uuid.uuid4().hex[:6]
    password = f"{role}pw"  # every 4 characters of the role name are a piece of the password
    await _execute(postgres_dsn, f"create role {role} login password '{password}'")
    await create_tables(postgres_dsn, pg_schema)
    dsn = make_conninfo(postgres_dsn, user=role, password=password)
    path = write_config(tmp_path / "cdc.yaml", pg_schema, dsn, redis_url, namespace)
    try:
        doctor = cdc("doctor", "-c", str(path))

        said = doctor.stdout + doctor.stderr
        assert f"role {role} lacks USAGE on schema {pg_schema}" in said, said
        assert f'TO "{role}"' in said
        assert password not in said
    finally:
        await _execute(postgres_dsn, f"drop role {role}")
