"""Change sources: SQL Server Change Tracking and PostgreSQL tracking."""

from __future__ import annotations

from cdc.config import SourceConfig
from cdc.sources.base import ChangeSource


def make_source(config: SourceConfig) -> ChangeSource:
    """The source for ``config.kind``; drivers are imported only when used."""
    if config.kind == "postgres" and config.capture == "logical":
        from cdc.sources.postgres_logical import PostgresLogicalSource

        return PostgresLogicalSource(config)
    if config.kind == "postgres":
        from cdc.sources.postgres import PostgresSource

        return PostgresSource(config)
    from cdc.sources.mssql import MssqlSource

    return MssqlSource(config)
