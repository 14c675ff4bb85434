"""The Redis settings that the data manager and the subscriber are built from.

Owned by ``publishers`` (which imports nothing from ``cdc``) so that an
application can build one by hand; ``cdc.config`` builds it from the
``redis:`` section of the config file, durations already in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RedisConfig:
    url: str = field(default="redis://127.0.0.1:6379/0", repr=False)  # may hold a password
    cluster: bool = False
    namespace: str = "cdc"
    stream_max_len: int = 100_000
    tombstone_ttl: float = 7 * 86400.0  # seconds
