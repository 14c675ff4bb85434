"""The one-off loader a user writes instead of cdc-sync: the reference of the
snapshot benchmark (issue 17: "a psycopg server-side cursor feeding redis-py
pipelines of HSET"). Ten lines, as written by hand: every column as its text,
one HSET per row, a pipeline per 1,000 rows. It writes no index, no version,
no message: a lower bound on what copying the rows costs, not a mirror.

    python -m bench.loader DSN REDIS_URL TABLE   prints rows and seconds as JSON
"""

from __future__ import annotations

import json
import sys
import time

import psycopg
import redis


def load(dsn: str, url: str, table: str) -> int:
    r = redis.Redis.from_url(url)
    rows = 0
    with psycopg.connect(dsn) as conn, conn.cursor(name="loader") as cur:
        cur.itersize = 1000
        cur.execute(f"select * from {table}")
        names = [d.name for d in cur.description or ()]
        pipe = r.pipeline(transaction=False)
        for row in cur:
            pipe.hset(f"loader:{row[0]}", mapping={n: str(v) for n, v in zip(names, row, strict=True)})
            rows += 1
            if rows % 1000 == 0:
                pipe.execute()
        pipe.execute()
    r.close()
    return rows


if __name__ == "__main__":
    started = time.monotonic()
    cpu = time.process_time()
    count = load(*sys.argv[1:4])
    print(
        json.dumps({"rows": count, "seconds": time.monotonic() - started, "cpu": time.process_time() - cpu})
    )
