"""Session fixtures: real servers on free loopback ports.

- ``redis_url``: a redis-server started for the session (or CDC_TEST_REDIS_URL)
- ``redis_cluster_url``: a 3-master Redis Cluster started for the session
- ``postgres_dsn``: a PostgreSQL cluster initdb'ed for the session (or
  CDC_TEST_POSTGRES_DSN)
- ``redis_client``: a client of ``redis_url`` named ``cdc-test`` (chaos tests
  never cut connections of that name)
- ``mssql_admin_dsn``: CDC_TEST_MSSQL_DSN, or a testcontainers SQL Server when a
  Docker engine answers; skipped with the reason otherwise (a failure under
  CDC_TEST_MSSQL_REQUIRED=1); ``mssql_dsn``: it through each installed ODBC
  driver (``mssql_driver``: FreeTDS, ODBC Driver 18); ``mssql_reader``: a
  least-privileged login for the source under test (tests/mssql_env.py)

Where the binaries are missing the dependent tests are skipped with the
reason on a laptop, and fail under CI=true.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from cdc.config import RedisConfig
from cdc.devservers import PostgresServer, RedisCluster, RedisServer, ServerUnavailable
from tests import mssql_env
from tests.chaos import TEST_CLIENT

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


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, client_name=TEST_CLIENT)
    yield client
    await client.aclose()


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
        # logical: the logical-decoding capture mode's tests (a slot per table; 10 by default)
        server = PostgresServer(settings=("wal_level=logical", "max_replication_slots=100")).start()
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


# -- SQL Server: never started here; skipped (even under CI=true) when none is reachable,
# -- except under CDC_TEST_MSSQL_REQUIRED=1 (`make test-mssql`), where that is a failure --

MSSQL_IMAGE = "mcr.microsoft.com/mssql/server:2022-latest"
NO_MSSQL = "no SQL Server: set CDC_TEST_MSSQL_DSN or run a Docker engine"
MSSQL_SA_PASSWORD = "Cdc-Test-1234"


def no_mssql(reason: str) -> None:
    if mssql_env.REQUIRED:
        pytest.fail(f"CDC_TEST_MSSQL_REQUIRED=1 but {reason}")
    pytest.skip(reason)


def _docker_answers() -> bool:
    """A quick ping of the Docker engine (2 s at most); no socket, no ping."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host[len("unix://") :]):
        return False
    import gc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # docker-py leaks its socket when the ping fails
        try:
            import docker

            client = docker.DockerClient(base_url=host, timeout=2, version="1.41")
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False
        finally:
            gc.collect()


@pytest.fixture(scope="session")
def mssql_admin_dsn() -> Iterator[str]:
    """The administrator's DSN of a database the tests may alter (tracking, tables, logins):
    CDC_TEST_MSSQL_DSN as given; else a SQL Server 2022 container (SA), in which a
    fresh CdcTest database is created."""
    if os.environ.get("CDC_TEST_MSSQL_DSN"):
        yield os.environ["CDC_TEST_MSSQL_DSN"]
        return
    if not _docker_answers():
        no_mssql(NO_MSSQL)
    from testcontainers.community.mssql import SqlServerContainer

    with SqlServerContainer(MSSQL_IMAGE, password=MSSQL_SA_PASSWORD) as server:
        host, port = server.get_container_host_ip(), int(server.get_exposed_port(1433))
        endpoint = mssql_env.Endpoint(host, port, "master", "SA", MSSQL_SA_PASSWORD)
        mssql_env.run(
            endpoint.dsn(MSSQL_DRIVERS[0] if MSSQL_DRIVERS else "FreeTDS"), "CREATE DATABASE CdcTest"
        )
        yield endpoint.dsn(MSSQL_DRIVERS[0] if MSSQL_DRIVERS else "FreeTDS", database="CdcTest")


MSSQL_DRIVERS = mssql_env.installed_drivers()


@pytest.fixture(
    scope="session",
    params=MSSQL_DRIVERS or [None],
    ids=[mssql_env.DRIVER_IDS[d] for d in MSSQL_DRIVERS] or ["no-driver"],
)
def mssql_driver(request: pytest.FixtureRequest) -> str:
    """Each installed SQL Server ODBC driver in turn (FreeTDS, Microsoft ODBC Driver 18)."""
    if request.param is None:
        no_mssql("no SQL Server ODBC driver is installed (FreeTDS or ODBC Driver 18 for SQL Server)")
    return str(request.param)


@pytest.fixture(scope="session")
def mssql_dsn(mssql_admin_dsn: str, mssql_driver: str) -> str:
    """The administrator's DSN, through ``mssql_driver``."""
    return mssql_env.dsn_for(mssql_admin_dsn, mssql_driver)


@pytest.fixture(scope="session")
def mssql_reader(mssql_dsn: str, mssql_driver: str) -> Iterator[mssql_env.LeastPrivilegeLogin]:
    """A login that is not SA: SELECT and VIEW CHANGE TRACKING on the tables a test grants
    it (SQLSERVER.md §2), for the source under test."""
    login = mssql_env.LeastPrivilegeLogin.create(mssql_dsn, mssql_driver)
    yield login
    login.drop()


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def redis_config(request: pytest.FixtureRequest, namespace: str) -> RedisConfig:
    """A RedisConfig with a fresh namespace: once on the single server, once
    on the 3-master cluster (``cluster: true``, so SPUBLISH)."""
    if request.param == "cluster":
        url = request.getfixturevalue("redis_cluster_url")
        return RedisConfig(url=url, cluster=True, namespace=namespace)
    return RedisConfig(url=request.getfixturevalue("redis_url"), namespace=namespace)
