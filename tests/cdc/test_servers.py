"""The session fixtures start real servers that answer."""

from __future__ import annotations

import psycopg
import redis


def test_redis_answers(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.ping() is True
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    finally:
        client.close()


def test_postgres_answers(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn) as conn:
        row = conn.execute(
            "select pg_current_xact_id()::text::bigint > 0, current_setting('server_version_num')::int"
        ).fetchone()
        assert row is not None
        assert row[0] is True
        assert row[1] >= 130000
