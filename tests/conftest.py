"""Session fixtures: real servers on free loopback ports.

- ``redis_url``: a redis-server started for the session (or CDC_TEST_REDIS_URL)
- ``redis_cluster_url``: a 3-master Redis Cluster started for the session
- ``postgres_dsn``: a PostgreSQL cluster initdb'ed for the session (or
  CDC_TEST_POSTGRES_DSN)
- ``mssql_dsn``: CDC_TEST_MSSQL_DSN, or a testcontainers SQL Server when a
  Docker engine answers; skipped with the reason otherwise

Where the binaries are missing the dependent tests are skipped with the
reason on a laptop, and fail under CI=true.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from cdc.devservers import PostgresServer, RedisCluster, RedisServer, ServerUnavailable

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip on a laptop; fail in CI, where every server must be there."""
    if IN_CI:
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    if os.environ.get("CDC_TEST_REDIS_URL"):
        yield None
        return
    try:
        server = RedisServer().start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
        return
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | None) -> str:
    return os.environ.get("CDC_TEST_REDIS_URL") or (redis_server.url if redis_server else "")


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    try:
        cluster = RedisCluster().start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
        return
    yield cluster.url
    cluster.cleanup()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer | None]:
    if os.environ.get("CDC_TEST_POSTGRES_DSN"):
        yield None
        return
    try:
        server = PostgresServer().start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
        return
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def postgres_dsn(postgres_server: PostgresServer | None) -> str:
    return os.environ.get("CDC_TEST_POSTGRES_DSN") or (postgres_server.dsn if postgres_server else "")


@pytest.fixture
def namespace() -> str:
    """A fresh Redis namespace per test, so tests never see each other's keys."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def pg_schema(postgres_dsn: str) -> Iterator[str]:
    """A fresh PostgreSQL schema per test, dropped afterwards."""
    import psycopg

    name = "s" + uuid.uuid4().hex[:10]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"create schema {name}")
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"drop schema if exists {name} cascade")
