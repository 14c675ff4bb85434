"""Snapshot progress as a progress bar, when stderr is a terminal."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Protocol


class _Tracked(Protocol):
    table: str

    @property
    def progress(self) -> object: ...


class SnapshotProgressView:
    """``with SnapshotProgressView(trackers):`` shows one bar per table, refreshed
    from the trackers' ``progress`` (rows done, estimated total) a few times a
    second. Does nothing when stderr is not a terminal."""

    def __init__(self, trackers: Sequence[_Tracked]) -> None:
        self.trackers = trackers
        self.enabled = sys.stderr.isatty()
        self._task: asyncio.Task[None] | None = None
        self._progress: object | None = None

    def __enter__(self) -> SnapshotProgressView:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        progress.start()
        self._ids = [progress.add_task(t.table, total=None) for t in self.trackers]
        self._progress = progress
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def refresh(self) -> None:
        progress = self._progress
        if progress is None:
            return
        for task_id, tracker in zip(self._ids, self.trackers, strict=True):
            state = tracker.progress
            progress.update(  # type: ignore[attr-defined]
                task_id, completed=getattr(state, "rows", 0), total=getattr(state, "total", None)
            )

    async def _tick(self) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(0.2)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
        self.refresh()
        if self._progress is not None:
            with contextlib.suppress(Exception):
                self._progress.stop()  # type: ignore[attr-defined]
