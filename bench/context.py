"""The state one ``python -m bench`` run shares between benchmarks: the
servers, the sizes of this mode, and the backlog once it is written."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.env import NAMESPACE, Env
from bench.workload import SCHEMA, Backlog
from cdc.config import RedisConfig
from publishers.manager import DataManager


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is; ``--quick`` divides them."""

    snapshot_rows: int
    backlog_per_table: int  # on each of the 10 tables
    ceiling_changes: int
    naive_changes: int
    latency_seconds: float
    latency_warmup: float
    idle_seconds: float
    idle_steady_state: bool  # also measure once every backoff is at its top step

    @classmethod
    def full(cls) -> Sizes:
        return cls(1_000_000, 100_000, 200_000, 20_000, 20.0, 2.0, 60.0, True)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(100_000, 10_000, 50_000, 4_000, 4.0, 1.0, 15.0, False)


@dataclass
class BacklogState:
    """A written backlog: the Redis state it starts from, and the versions before each round."""

    backlog: Backlog
    rdb: Path  # Redis as the sidecar left it after the initial snapshot (version ``versions[0]``)
    versions: list[int]  # versions[r]: the bound before round r was written
    write_seconds: float
    preload: dict[str, Any]


@dataclass
class Context:
    env: Env
    quick: bool
    sizes: Sizes
    results: dict[str, Any] = field(default_factory=dict)
    backlog: BacklogState | None = None

    @property
    def redis_config(self) -> RedisConfig:
        return RedisConfig(url=self.env.redis_url, namespace=NAMESPACE)

    def set_checkpoints(self, tables: tuple[str, ...], version: int) -> None:
        """Every table's checkpoint at ``version`` (streaming), as a restarted sidecar finds it."""

        async def write() -> None:
            manager = await DataManager.connect(self.redis_config)
            try:
                for name in tables:
                    await manager.set_checkpoint(f"{SCHEMA}.{name}", version, "streaming")
            finally:
                await manager.close()

        asyncio.run(write())
