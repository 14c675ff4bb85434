"""What ``cdc consume`` checks in Redis before it joins a group, as ``cdc
subscribe`` does (``cdc.subscribe_args``): a ``--section`` or
``--partition`` that was never written is refused (exit 2, with a "did you
mean"), not a silent wait; nothing is written to Redis before.

A section or partition a table will write later can be consumed once it has
been. (``publishers.consumer.Consumer`` itself waits for them: a library
cannot tell a typo from a partition still to come.)
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from cdc.config import Config
from cdc.errors import ConfigError
from cdc.subscribe_args import check_subscription
from publishers import redis_calls
from publishers.manager import DataManager
from publishers.partition_sets import scanned_sections, sections_of


async def check_consumption(
    config: Config, manager: DataManager, sections: Sequence[str], partitions: Sequence[str]
) -> None:
    """Raise ``ConfigError`` naming the section or partition never written."""
    for partition in partitions:
        await check_subscription(config, manager, partition, None, None)
    written = await _written_sections(manager, partitions)
    for section in sections:
        if section in written:
            continue
        where = f"namespace {manager.layout.namespace!r} of {config.path}"
        if partitions:
            raise ConfigError(
                f"--section {section!r}: this section has never written partition"
                f"{'s' if len(partitions) > 1 else ''} {', '.join(map(repr, partitions))} in {where};"
                f" the sections that have: {', '.join(sorted(written)) or 'none'}"
            )
        close = difflib.get_close_matches(section, sorted(written), n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ConfigError(f"--section {section!r}: no table has written this section in {where}{hint}")


async def _written_sections(manager: DataManager, partitions: Sequence[str]) -> set[str]:
    """The sections that have written any of ``partitions``, or any partition at all."""
    client, layout, url = manager.client, manager.layout, manager.config.url
    if partitions:
        found: set[str] = set()
        for partition in partitions:
            found |= set(await redis_calls.call(sections_of(client, layout, partition), url))
        return found
    registry = await redis_calls.call(client.smembers(layout.sections()), url)
    if registry:
        return {redis_calls.text(s) for s in registry}
    return set(await redis_calls.call(scanned_sections(client, layout), url))
