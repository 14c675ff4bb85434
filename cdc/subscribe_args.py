"""What ``cdc subscribe`` checks in Redis before it follows a partition, so
that a typo is an error (exit 2) and not a silent wait for messages that
will never come:

- the partition has been written by some section (``ns:@sections`` and the
  sections' partitions sets: no SCAN), and ``--section``, when given, is one
  of those that wrote it;
- ``--from-seq`` is at most the partition's ``@seq`` + 1 (the next message).

A partition or section that has never been written cannot be told from a
typo; one that a table will write later can be followed once it has been.
"""

from __future__ import annotations

import difflib

from cdc.config import Config
from cdc.errors import ConfigError
from publishers import redis_calls
from publishers.manager import DataManager
from publishers.partition_sets import sections_of

_SUGGESTED_FROM = 1_000  # partitions sets up to this size are read for a "did you mean"


async def check_subscription(
    config: Config, manager: DataManager, partition: str, section: str | None, from_seq: int | None
) -> None:
    """Raise ``ConfigError`` naming what is wrong with the arguments."""
    layout, url = manager.layout, manager.config.url
    written = await redis_calls.call(sections_of(manager.client, layout, partition), url)
    where = f"namespace {layout.namespace!r} of {config.path}"
    if not written:
        raise ConfigError(
            f"--partition {partition!r}: no section has written this partition in {where}"
            f"{await _did_you_mean(manager, partition)}"
        )
    if section is not None and section not in written:
        raise ConfigError(
            f"--section {section!r}: this section has never written partition {partition!r} in {where};"
            f" the sections that have: {', '.join(written)}"
        )
    if from_seq is not None:
        seq = int(await redis_calls.call(manager.client.get(layout.seq(partition)), url) or 0)
        if from_seq > seq + 1:
            raise ConfigError(
                f"--from-seq {from_seq}: partition {partition!r} is at seq {seq}, so its next message"
                f" is seq {seq + 1}; --from-seq starts at the message of that seq"
            )


async def _did_you_mean(manager: DataManager, partition: str) -> str:
    """``; did you mean ...`` with the written partitions closest to ``partition``
    (of the sections whose sets are small enough to read), or nothing."""
    client, layout, url = manager.client, manager.layout, manager.config.url
    candidates: set[str] = set()
    for section in await redis_calls.call(client.smembers(layout.sections()), url):
        key = layout.partitions(redis_calls.text(section))
        if await redis_calls.call(client.scard(key), url) <= _SUGGESTED_FROM:
            candidates |= {redis_calls.text(p) for p in await redis_calls.call(client.smembers(key), url)}
    close = difflib.get_close_matches(partition, sorted(candidates), n=3)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
