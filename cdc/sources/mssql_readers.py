"""SQL Server: the source's idle reader connections. A read of changes (or
of rows by key) runs its SNAPSHOT transaction on a reader of its own, not on
the describe link, so that a long read never holds up a describe; readers
go back here with no transaction open."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from cdc.errors import CdcError
from cdc.sources.mssql_link import Link, rollback_quietly

T = TypeVar("T")


class Readers:
    def __init__(self, opener: Callable[[], Any], dsn: str) -> None:
        self._opener, self._dsn = opener, dsn
        self._idle: list[Link] = []  # no transaction open

    def take(self) -> Link:
        """An idle reader, or a new one (connected on its first run)."""
        return self._idle.pop() if self._idle else Link(self._opener, self._dsn, "cdc-mssql-read")

    def give_back(self, link: Link) -> None:
        """A reader whose transaction has ended."""
        self._idle.append(link)

    def take_all(self) -> list[Link]:
        idle, self._idle = self._idle, []
        return idle

    async def run(self, link: Link, work: Callable[[Any], T], context: str) -> T:
        """Run a page on a reader; an error returns the reader (its transaction
        rolled back) to the idle ones, a cancellation closes it: the page may
        still be running, and its transaction open, on the reader's thread."""
        try:
            return await link.run(work, context)
        except CdcError:
            self._idle.append(link)
            raise
        except BaseException:
            await link.close()
            raise

    async def release(self, link: Link, *, rollback: bool) -> None:
        """Back to the idle readers, after rolling back its open transaction if asked."""
        if rollback:
            try:
                await link.run(rollback_quietly)
            except BaseException:
                await link.close()
                raise
        self._idle.append(link)
