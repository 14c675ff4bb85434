"""The ``redis.sentinel`` and ``redis.durability`` forms as a user meets them:
what loads, and each mistake told as ``<file>:<line>: <field>: <message>``,
never quoting a URL (it may hold a password)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cdc.config import load_config
from cdc.errors import ConfigError
from publishers.settings import Durability, SentinelConfig

HEAD = """\
source:
  kind: postgres
  dsn: postgresql://cdc@127.0.0.1/cdc
tables:
  - table: public.items
redis:
"""  # the redis section's fields start on line 7
PASSWORD = "Qv7rN9031kW"


def load(tmp_path: Path, redis: str, env: dict[str, str] | None = None) -> object:
    path = tmp_path / "cdc.yaml"
    path.write_text(HEAD + textwrap.indent(textwrap.dedent(redis), "  "), encoding="utf-8")
    return load_config(path, env or {})


def failure(tmp_path: Path, redis: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, redis, env)
    assert raised.value.exit_code == 2
    message = str(raised.value)
    prefix = f"{tmp_path / 'cdc.yaml'}:"
    assert message.startswith(prefix), message
    assert PASSWORD not in message
    return message[len(prefix) :]


def test_the_sentinel_form_loads_with_passwords_from_the_environment(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """\
        url: rediss://cdc:${CDC_REDIS_PASSWORD}@/2?ssl_cert_reqs=none
        sentinel:
          master: mymaster
          nodes: [10.0.0.1:26379, "s2.internal:26380", "[::1]:26381"]
          url: redis://sentinel:${CDC_SENTINEL_PASSWORD}@
        durability: {replicas: 1, timeout: 250ms}
        """,
        {"CDC_REDIS_PASSWORD": "pw1", "CDC_SENTINEL_PASSWORD": PASSWORD},
    )
    redis = config.redis  # type: ignore[attr-defined]
    assert redis.url == "rediss://cdc:pw1@/2?ssl_cert_reqs=none"
    assert redis.sentinel == SentinelConfig(
        "mymaster",
        (("10.0.0.1", 26379), ("s2.internal", 26380), ("::1", 26381)),
        f"redis://sentinel:{PASSWORD}@",
    )
    assert redis.durability == Durability(replicas=1, timeout=0.25)
    assert PASSWORD not in repr(redis)
    assert config.literal_secrets == ()  # type: ignore[attr-defined]


def test_without_a_url_the_primary_needs_no_password_and_the_durability_is_off(tmp_path: Path) -> None:
    config = load(tmp_path, "sentinel: {master: m, nodes: ['127.0.0.1:26379']}\n")
    redis = config.redis  # type: ignore[attr-defined]
    assert (redis.url, redis.sentinel.url, redis.durability) == ("redis:///0", "redis://", Durability(0, 1.0))


def test_a_sentinel_password_written_in_the_file_is_warned_about_by_line(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        f"""\
        sentinel:
          master: m
          nodes: ['127.0.0.1:26379']
          url: redis://sentinel:{PASSWORD}@
        """,
    )
    (secret,) = config.literal_secrets  # type: ignore[attr-defined]
    assert (secret.field, secret.line) == ("redis.sentinel.url", 10)
    assert PASSWORD not in secret.warning("cdc.yaml")


@pytest.mark.parametrize(
    ("redis", "expected"),
    [
        (
            "url: redis://cdc:${P}@cache:6379/0\nsentinel: {master: m, nodes: ['h:1']}\n",
            "7: redis.url: with redis.sentinel this URL gives the primary's scheme, user, password and database "
            "only, no host or port",
        ),
        (
            "sentinel: {master: m, nodes: ['h:1'], url: 'redis://s:${P}@h:26379'}\n",
            "7: redis.sentinel.url: with redis.sentinel this URL gives the sentinels' scheme",
        ),
        (
            "sentinel: {master: m, nodes: ['h:1'], url: 'redis://s:${P}@/3'}\n",
            "7: redis.sentinel.url: a sentinel has no database",
        ),
        (
            "url: unix:///tmp/r.sock\nsentinel: {master: m, nodes: ['h:1']}\n",
            "7: redis.url: the sentinels name the primary by host and port: no unix:// URL",
        ),
        (
            "sentinel: {master: m, nodes: ['h:1']}\ncluster: true\n",
            "7: redis.sentinel: a Redis Cluster fails over",
        ),
        (
            "sentinel:\n  master: m\n  nodes: ['h:1', 'h:99999']\n",
            "9: redis.sentinel.nodes[1]: port 99999 is out of range",
        ),
        (
            "sentinel:\n  master: m\n  nodes: ['h:0']\n",
            "9: redis.sentinel.nodes[0]: a sentinel's port cannot be 0",
        ),
        ("sentinel: {master: m}\n", "7: redis.sentinel: "),
        ("sentinel: {nodes: ['h:1'], master: ''}\n", "7: redis.sentinel.master: "),
        ("durability: {replicas: -1}\n", "7: redis.durability.replicas: "),
        ("durability: {replicas: 1, timeout: 1ms}\n", "7: redis.durability.timeout: "),
        ("durability: {timeout: 1s}\n", "7: redis.durability: "),
        ("cluster_nodes: ['h:7001']\n", "7: redis.cluster_nodes: cluster_nodes are nodes of a Redis Cluster"),
        (
            "cluster: true\ncluster_nodes:\n  - h:7001\n  - h:0\n",
            "10: redis.cluster_nodes[1]: a node's port cannot be 0",
        ),
        ("cluster: true\ncluster_nodes: ['h']\n", "8: redis.cluster_nodes[0]: "),
    ],
)
def test_each_mistake_names_its_line_and_field(tmp_path: Path, redis: str, expected: str) -> None:
    message = failure(tmp_path, redis, {"P": PASSWORD})
    assert message.startswith(expected), message


def test_more_cluster_nodes_load_and_leave_the_deployment_name_alone(tmp_path: Path) -> None:
    from cdc.cleanup_job import deployment_name

    plain = load(tmp_path, "url: redis://127.0.0.1:7000\ncluster: true\n")
    seeded = load(
        tmp_path, "url: redis://127.0.0.1:7000\ncluster: true\ncluster_nodes: ['a:7001', '[::1]:7002']\n"
    )
    assert seeded.redis.cluster_nodes == (("a", 7001), ("::1", 7002))  # type: ignore[attr-defined]
    assert deployment_name(seeded.redis) == deployment_name(plain.redis)  # type: ignore[attr-defined]


def test_durability_loads_with_a_cluster(tmp_path: Path) -> None:
    config = load(tmp_path, "url: redis://127.0.0.1:7000\ncluster: true\ndurability: {replicas: 1}\n")
    assert config.redis.cluster and config.redis.durability == Durability(1, 1.0)  # type: ignore[attr-defined]


def test_two_sentinel_deployments_are_told_apart_without_their_passwords(tmp_path: Path) -> None:
    from cdc.cleanup_job import deployment_name

    names = set()
    for master in ("alpha", "beta"):
        redis = f"url: redis://cdc:{PASSWORD}@/0\nsentinel: {{master: {master}, nodes: ['h2:2', 'h1:1']}}\n"
        names.add(deployment_name(load(tmp_path, redis).redis))  # type: ignore[attr-defined]
    assert names == {"cdc at sentinel alpha@h1:1,h2:2/0", "cdc at sentinel beta@h1:1,h2:2/0"}
