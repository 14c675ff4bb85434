"""What ``cdc doctor`` and ``cdc validate`` say of the Redis target and of the
config file's secrets, as a user runs them:

- a replica as ``redis.url`` (a redis-server started with ``--replicaof`` the
  fixture's): doctor reports an error and exits 1, validate refuses it (2);
- an ACL user that may not run a command the sidecar sends (``ACL DRYRUN``);
- a password written in the file (not from ``${VAR}``): a warning naming the
  file, the line and the field, never the password.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from psycopg.conninfo import make_conninfo

from cdc.config import parse_config
from cdc.devservers import RedisServer
from tests.e2e import config_text, create_tables, enable_tracking, make_config
from tests.e2e import wait_for as wait_until

SECRET = "Zq8-literal-Secret-5521"


def cdc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "--text-logs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def findings(result: subprocess.CompletedProcess[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for finding in json.loads(result.stdout):
        out.setdefault(finding["subject"], []).append(finding)
    return out


@pytest.fixture
async def tables(postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str) -> str:
    """Two tracked tables in ``pg_schema``; the config text's tables are these."""
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(make_config(pg_schema, postgres_dsn, redis_url, namespace))
    return pg_schema


@pytest.fixture
async def replica(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[RedisServer]:
    """A redis-server replicating the fixture's, its link up."""
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    server = RedisServer(extra=("--replicaof", "127.0.0.1", port)).start()
    client = aioredis.Redis.from_url(server.url)

    async def linked() -> bool:
        info = await client.info("replication")
        return bool(info.get("master_link_status") == "up")

    try:
        await wait_until(linked, 20, "the replica to link to its primary")
        yield server
    finally:
        await client.aclose()
        server.cleanup()


async def test_a_replica_is_an_error_in_doctor_and_refused_by_validate(
    tables: str, replica: RedisServer, postgres_dsn: str, namespace: str, redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(config_text(tables, postgres_dsn, replica.url, namespace))
    port = redis_url.rsplit(":", 1)[1].split("/")[0]

    doctor = cdc("doctor", "-c", str(path), "--json")

    assert doctor.returncode == 1, doctor.stderr
    [role] = findings(doctor)["redis role"]
    assert role["level"] == "error" and f"is a replica of 127.0.0.1:{port}" in role["message"]
    assert "point redis.url at the primary" in role["message"]

    validate = cdc("validate", "-c", str(path))

    assert validate.returncode == 2, validate.stdout + validate.stderr
    assert "error redis.url" in validate.stdout and "is a replica" in validate.stdout

    # the sidecar refuses it too, before it writes anything (its start-up cleanup claims retention)
    run = cdc("run", "-c", str(path), "--once")

    assert run.returncode == 2 and "is a replica" in run.stderr, run.stderr

    path.write_text(config_text(tables, postgres_dsn, redis_url, namespace))
    primary = cdc("doctor", "-c", str(path), "--json")
    assert [f["level"] for f in findings(primary)["redis role"]] == ["ok"]
    assert cdc("validate", "-c", str(path)).returncode == 0


async def test_too_few_replicas_for_redis_durability_is_an_error_in_doctor_and_a_warning_in_validate(
    tables: str, replica: RedisServer, postgres_dsn: str, namespace: str, redis_url: str, tmp_path: Path
) -> None:
    """The primary has one replica: ``durability.replicas: 2`` can never be
    met (every apply call would fail after the timeout), ``1`` can."""
    path = tmp_path / "t.yaml"
    text = config_text(tables, postgres_dsn, redis_url, namespace)

    def with_replicas(n: int) -> None:
        path.write_text(
            text.replace(f"  url: {redis_url}\n", f"  url: {redis_url}\n  durability: {{replicas: {n}}}\n")
        )

    with_replicas(2)
    doctor = cdc("doctor", "-c", str(path), "--json")

    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    [durability] = findings(doctor)["redis durability"]
    assert durability["level"] == "error"
    assert "has 1 replica(s) online and redis.durability.replicas is 2" in durability["message"]
    validate = cdc("validate", "-c", str(path))
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert f"warn  redis.durability.replicas ({path}): " in validate.stdout

    with_replicas(1)
    doctor = cdc("doctor", "-c", str(path), "--json")
    assert [f["level"] for f in findings(doctor)["redis durability"]] == ["ok"], doctor.stdout
    assert "redis.durability" not in cdc("validate", "-c", str(path)).stdout


@contextlib.asynccontextmanager
async def denied_user(client: aioredis.Redis, namespace: str, *denied: str) -> AsyncIterator[str]:
    """A user of ``client``'s Redis (password SECRET) that may do everything on
    the namespace but the ``denied`` rules (``"-xadd"``); its name."""
    name = f"cdc_{uuid.uuid4().hex[:8]}"
    rules = ("on", f">{SECRET}", f"~{namespace}:*", "&*", "+@all", *denied)
    await client.execute_command("ACL", "SETUSER", name, *rules)
    try:
        yield name
    finally:
        await client.execute_command("ACL", "DELUSER", name)


def as_user(url: str, name: str) -> str:
    return url.replace("redis://", f"redis://{name}:{SECRET}@")


@pytest.fixture
async def acl_user(redis_client: aioredis.Redis, namespace: str) -> AsyncIterator[str]:
    """A user of the fixture's Redis that may do everything on the namespace but XADD."""
    async with denied_user(redis_client, namespace, "-xadd") as name:
        yield name


async def test_doctor_names_the_commands_the_acl_user_may_not_run_and_never_the_password(
    tables: str, acl_user: str, postgres_dsn: str, namespace: str, redis_url: str, tmp_path: Path
) -> None:
    url = as_user(redis_url, acl_user)
    path = tmp_path / "t.yaml"
    path.write_text(config_text(tables, postgres_dsn, url, namespace))

    doctor = cdc("doctor", "-c", str(path), "--json")

    assert doctor.returncode == 1, doctor.stderr
    found = findings(doctor)
    [acl] = found["redis acl"]
    assert acl["level"] == "error" and acl["extra"]["refused"] == ["XADD"]
    [literal] = found["redis.url"]
    line = next(
        n for n, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("url:")
    )
    assert (
        literal["level"] == "warning" and f"{path}:{line}: redis.url holds a password" in literal["message"]
    )
    text = cdc("doctor", "-c", str(path))
    assert SECRET not in doctor.stdout + doctor.stderr + text.stdout + text.stderr


async def test_with_redis_durability_doctor_checks_that_the_acl_user_may_wait(
    tables: str,
    redis_client: aioredis.Redis,
    postgres_dsn: str,
    namespace: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    async with denied_user(redis_client, namespace, "-wait") as name:
        path = tmp_path / "t.yaml"
        text = config_text(tables, postgres_dsn, as_user(redis_url, name), namespace)
        path.write_text(text)
        [acl] = findings(cdc("doctor", "-c", str(path), "--json"))["redis acl"]
        assert acl["level"] == "ok", "without redis.durability the sidecar sends no WAIT"
        path.write_text(text.replace("redis:\n", "redis:\n  durability: {replicas: 1, timeout: 100ms}\n", 1))
        [acl] = findings(cdc("doctor", "-c", str(path), "--json"))["redis acl"]
        assert acl["level"] == "error" and acl["extra"]["refused"] == ["WAIT"], acl


async def test_doctor_asks_for_the_heartbeats_transaction_and_says_when_info_is_refused(
    tables: str,
    redis_client: aioredis.Redis,
    postgres_dsn: str,
    namespace: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    """A user given the read, write, script, stream and pub/sub categories
    lacks MULTI (@transaction): every heartbeat would fail. Doctor names it.
    One denied INFO (the start-up's replica check) is told in one line."""
    path = tmp_path / "t.yaml"
    async with denied_user(redis_client, namespace, "-multi") as name:
        path.write_text(config_text(tables, postgres_dsn, as_user(redis_url, name), namespace))
        [acl] = findings(cdc("doctor", "-c", str(path), "--json"))["redis acl"]
        assert acl["level"] == "error" and acl["extra"]["refused"] == ["MULTI"], acl
        assert acl["extra"]["fix"].endswith(" +multi"), acl

    async with denied_user(redis_client, namespace, "-info") as name:
        path.write_text(config_text(tables, postgres_dsn, as_user(redis_url, name), namespace))
        doctor = cdc("doctor", "-c", str(path))
        assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr
        assert (
            "Redis refused a command: NoPermissionError: this user has no permissions to run the 'info' command"
            in doctor.stderr
        )
        assert SECRET not in doctor.stdout + doctor.stderr


@pytest.mark.cluster
async def test_on_a_cluster_doctor_asks_for_cluster_nodes(
    redis_cluster_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The failover watch reads CLUSTER NODES: a user denied it would never
    see a failover (the repair without durability would not run). Doctor
    names it; the watch says so once, as an error, and goes on."""
    from redis.asyncio.cluster import RedisCluster

    from publishers import control
    from publishers.failover import FailoverWatch
    from publishers.manager import DataManager
    from publishers.settings import RedisConfig

    name = f"cdc_{uuid.uuid4().hex[:8]}"
    admin = RedisCluster.from_url(redis_cluster_url)
    rule = ("on", f">{SECRET}", "~*", "&*", "+@all", "-cluster|nodes")
    await admin.execute_command("ACL", "SETUSER", name, *rule, target_nodes=RedisCluster.ALL_NODES)
    try:
        url = as_user(redis_cluster_url, name)
        manager = await DataManager.connect(RedisConfig(url=url, cluster=True, namespace=namespace))
        try:
            acl = [f for f in await control.doctor(manager) if f.subject == "redis acl"]
            watch = FailoverWatch(manager)
            await watch.start()
            assert await watch.check() is None and await watch.check() is None
        finally:
            await manager.close()
        told = [r for r in caplog.records if r.name == "cdc.failover"]
        assert [r.levelname for r in told] == ["ERROR"], told
        assert "may not run CLUSTER NODES: failovers are not seen" in told[0].getMessage()
        assert [f.extra["refused"] for f in acl] == [["CLUSTER|NODES"]] * 3, acl
        assert all(f.extra["fix"].endswith(" +cluster|nodes") for f in acl)
    finally:
        await admin.acl_deluser(name, target_nodes=RedisCluster.ALL_NODES)
        await admin.aclose()


async def test_a_password_written_in_source_dsn_is_a_warning_that_never_shows_it(
    tables: str, postgres_dsn: str, namespace: str, redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "t.yaml"
    literal = make_conninfo(postgres_dsn, password=SECRET)  # trust auth: the password is not checked
    path.write_text(config_text(tables, literal, redis_url, namespace))

    validate = cdc("validate", "-c", str(path))

    assert validate.returncode == 0, validate.stdout + validate.stderr
    line = next(
        n for n, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("dsn:")
    )
    assert f"warn  {path}:{line}: source.dsn holds a password written in the file" in validate.stdout
    assert SECRET not in validate.stdout + validate.stderr

    path.write_text(config_text(tables, "${CDC_TEST_DSN}", redis_url, namespace))
    from_env = cdc("validate", "-c", str(path), env={"CDC_TEST_DSN": literal})
    assert from_env.returncode == 0 and "holds a password" not in from_env.stdout


def _literal(dsn: str, url: str = "redis://127.0.0.1:6379/0") -> list[str]:
    text = f"source:\n  kind: postgres\n  dsn: '{dsn}'\nredis:\n  url: '{url}'\ntables:\n  - table: a.b\n"
    return [
        f"{s.field}:{s.line}" for s in parse_config(text, "t.yaml", {"PW": "x", "DSN": "y"}).literal_secrets
    ]


@pytest.mark.parametrize(
    ("dsn", "url", "expected"),
    [
        ("postgresql://u:${PW}@h/db", "redis://:${PW}@h:6379/0", []),
        ("${DSN}", "${URL:-redis://127.0.0.1:6379/0}", []),
        ("postgresql://u@h/db", "redis://h:6379/0", []),
        ("postgresql://u:pw@h/db", "redis://h:6379/0", ["source.dsn:3"]),
        ("host=h user=u password=pw", "redis://:pw@h:6379/0", ["source.dsn:3", "redis.url:5"]),
        ("DRIVER={FreeTDS};SERVER=h;UID=sa;PWD=Secret1", "redis://h:6379/0", ["source.dsn:3"]),
        ("DRIVER={FreeTDS};SERVER=h;UID=sa;PWD=${PW}", "redis://h:6379/0", []),
        ("${DSN}", "${URL:-redis://u:pw@h:6379/0}", ["redis.url:5"]),  # the default is in the file
        ("postgresql://u:pre${PW}@h/db", "redis://h:6379/0", ["source.dsn:3"]),  # a part written there
    ],
)
def test_which_fields_hold_a_password_written_in_the_file(dsn: str, url: str, expected: list[str]) -> None:
    assert _literal(dsn, url) == expected


@pytest.mark.cluster
async def test_every_primary_of_a_cluster_is_asked(redis_cluster_url: str, namespace: str) -> None:
    """On a cluster the nodes the client writes to are its slot map's primaries:
    each is asked for its role, and each runs the ACL check (SPUBLISH there)."""
    from publishers import control
    from publishers.manager import DataManager
    from publishers.settings import RedisConfig

    manager = await DataManager.connect(RedisConfig(url=redis_cluster_url, cluster=True, namespace=namespace))
    try:
        assert await control.primary_problems(manager) == []
        found = {f.subject: f for f in await control.doctor(manager)}
    finally:
        await manager.close()
    assert found["redis role"].level == "ok" and found["redis acl"].level == "ok", found


@pytest.mark.cluster
async def test_on_a_cluster_each_primary_is_asked_for_its_replicas(
    redis_cluster_url: str, namespace: str
) -> None:
    """The fixture's cluster has no replicas: ``durability.replicas: 1`` is an
    error for each of its primaries; the ACL check with durability (WAIT and
    both wait markers) passes for a user that may run everything."""
    from publishers import control
    from publishers.manager import DataManager
    from publishers.settings import Durability, RedisConfig

    settings = RedisConfig(url=redis_cluster_url, cluster=True, namespace=namespace, durability=Durability(1))
    manager = await DataManager.connect(settings)
    try:
        findings = await control.doctor(manager)
    finally:
        await manager.close()
    durability = [f for f in findings if f.subject == "redis durability"]
    assert [f.level for f in durability] == ["error"] * 3, durability
    assert all("has 0 replica(s) online" in f.message for f in durability)
    acl = [f for f in findings if f.subject == "redis acl"]  # (one per primary)
    assert [f.level for f in acl] == ["ok"] * 3, acl
