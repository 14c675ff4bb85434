"""``cdc deadletter replay``: the current rows of dead-lettered keys, read again
from the source and applied through the tracker's path.

For one table's entries:

1. each entry's primary key is recovered (``cdc.deadletter_keys``); an entry
   whose key cannot be is reported and stays;
2. the rows of those keys are read in one consistent view, with a version
   read before them (``ChangeSource.read_rows``): every change at or below it
   is in the rows, any later one has a higher version;
3. each becomes a change through the table's ``TableMapper`` (as the
   tracker's ``RowFeeder`` does): an update with the row's values when the row
   exists, a delete when it is gone (each subject to the table's
   ``operations``), applied with ``DataManager.apply``: the apply rule drops
   it where the document is already newer. A row that still cannot be
   encoded, or that Redis refuses, goes back to the dead letter with its
   reason, as the tracker would send it;
4. an entry is removed once its change is applied (or dropped as older than
   the document, or went back to the dead letter as a new entry); a change
   whose partition is blocked leaves its entry in place.

Why it needs no lease, while a sidecar streams the table: its changes carry a
version read before their rows, so whichever of the sidecar's change and the
replay's is applied first, the document ends with the newer row (the same
argument as a snapshot's catch-up). The one writer that may move a document
back is a snapshot (its rows reset the version, and its sweep deletes
documents whose version is not the snapshot's), so the replay waits while the
table's checkpoint says ``snapshotting`` and, after applying, reads each
document's ``@v`` back: one below the replay's version was overwritten by a
snapshot that was running meanwhile, and that key is replayed again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.config import TableConfig
from cdc.deadletter_keys import recover_key
from cdc.describer import Describer
from cdc.errors import CdcError, PoisonChange
from cdc.mapping import TableMapper
from cdc.sources.base import ChangeRow, ChangeSource, Op
from publishers import deadletters, redis_calls
from publishers.deadletters import DeadLetter
from publishers.manager import DataManager
from publishers.model import Change

# Rounds of read, apply, check: a key is replayed again after a snapshot overwrote it.
ROUNDS = 3
# Seconds the replay waits for a table's snapshot to finish before giving up.
SNAPSHOT_WAIT = 600.0
# Keys per read and per apply: one consistent read of the source, one batch.
CHUNK = 500


@dataclass
class Outcome:
    """What became of a table's entries."""

    table: str
    # entry ids applied (or older than the document), removed
    replayed: list[str] = field(default_factory=list)
    # (id, reason): back in the dead letter
    failed_again: list[tuple[str, str]] = field(default_factory=list)
    # (id, why): still in the dead letter, untouched
    left: list[tuple[str, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "replayed": self.replayed,
            "failed_again": [{"id": i, "reason": r} for i, r in self.failed_again],
            "left": [{"id": i, "reason": r} for i, r in self.left],
        }


@dataclass
class _Pending:
    letter: DeadLetter
    key: dict[str, Any]


class Replayer:
    def __init__(self, source: ChangeSource, manager: DataManager, max_row_bytes: int) -> None:
        self.source, self.manager, self.max_row_bytes = source, manager, max_row_bytes

    async def replay(self, table_config: TableConfig, letters: Sequence[DeadLetter]) -> Outcome:
        outcome = Outcome(table_config.table)
        describer = Describer(table_config, self.source, self.max_row_bytes)
        await describer.describe()
        mapper = describer.mapper
        assert mapper is not None
        pending = []
        for letter in letters:
            key = recover_key(letter, table_config.partition, mapper.key_template, mapper.info.primary_key)
            if key is None:
                outcome.left.append((letter.id, "its primary key cannot be recovered from the entry"))
            else:
                pending.append(_Pending(letter, key))
        for start in range(0, len(pending), CHUNK):
            await self._replay_chunk(mapper, pending[start : start + CHUNK], outcome)
        await deadletters.delete(self.manager, [*outcome.replayed, *(i for i, _ in outcome.failed_again)])
        return outcome

    async def _replay_chunk(self, mapper: TableMapper, pending: list[_Pending], outcome: Outcome) -> None:
        for _ in range(ROUNDS):
            if not pending:
                return
            await self._wait_until_streaming(mapper.table)
            applied = await self._apply(mapper, pending, outcome)
            await self._wait_until_streaming(mapper.table)
            pending = [p for p, change in applied if not await self._holds(change)]
        outcome.left += [
            (p.letter.id, "a snapshot of the table overwrote its replay again and again: replay it again")
            for p in pending
        ]
        outcome.replayed[:] = [i for i in outcome.replayed if i not in {p.letter.id for p in pending}]

    async def _apply(
        self, mapper: TableMapper, pending: list[_Pending], outcome: Outcome
    ) -> list[tuple[_Pending, Change]]:
        """Read the rows, apply their changes; the (entry, change) pairs applied."""
        read = await self.source.read_rows(mapper.info, [p.key for p in pending])
        changes: list[tuple[_Pending, Change]] = []
        for item, row in zip(pending, read.rows, strict=True):
            change = await self._change(mapper, item, row, read.version, outcome)
            if change is not None:
                changes.append((item, change))
        result = await self.manager.apply([c for _, c in changes])
        rejected = {id(r.change): r.reason for r in result.rejected}
        blocked = {id(b.change): b.reason for b in result.blocked}
        applied = []
        for item, change in changes:
            if id(change) in rejected:
                outcome.failed_again.append((item.letter.id, rejected[id(change)]))
            elif id(change) in blocked:
                outcome.left.append((item.letter.id, blocked[id(change)]))
            else:
                applied.append((item, change))
                if item.letter.id not in outcome.replayed:
                    outcome.replayed.append(item.letter.id)
        return applied

    async def _change(
        self, mapper: TableMapper, item: _Pending, row: dict[str, Any] | None, version: int, outcome: Outcome
    ) -> Change | None:
        """The change that brings the entry's document to ``row``; None when
        there is none to apply (its operation is not published: the entry is
        done; the row cannot be encoded or its address differs: reported)."""
        letter = item.letter
        key = item.key if row is None else {c: row[c] for c in mapper.info.primary_key}
        # an insert stays an insert (a table may publish inserts only); a snapshot row is an update
        op: Op = "D" if row is None else ("I" if letter.op == "I" else "U")
        source_row = ChangeRow(op, version, key, row)
        try:
            change = mapper.from_row(source_row)
        except PoisonChange as exc:
            address = mapper.address(key, "U", version)
            payload: dict[str, object] = {"key": {k: str(v) for k, v in key.items()}}
            await self.manager.dead_letter(address, str(exc), table=mapper.table, payload=payload)
            outcome.failed_again.append((letter.id, str(exc)))
            return None
        if change is None:
            outcome.replayed.append(letter.id)  # nothing to publish: the table's operations leave it out
            return None
        if letter.key and (change.partition, change.key) != (letter.partition, letter.key):
            outcome.left.append(
                (
                    letter.id,
                    f"the row's key renders partition {change.partition!r}, key {change.key!r}, not the "
                    f"entry's {letter.partition!r}, {letter.key!r} (the key or partition template changed "
                    "since?): the entry stays; purge it once the documents are right (cdc snapshot)",
                )
            )
            return None
        return change

    async def _holds(self, change: Change) -> bool:
        """Whether the document still holds the replay's change or a newer one:
        ``@v`` at or above its version (a delete of an absent document holds too)."""
        key = self.manager.layout.document(change.partition, change.section, change.key)
        raw = await redis_calls.call(self.manager.client.hget(key, "@v"), self.manager.config.url)
        if raw is None:
            return change.op == "D"
        return int(redis_calls.text(raw)) >= change.version

    async def _wait_until_streaming(self, table: str) -> None:
        """Wait while the table's checkpoint says a snapshot runs (``SNAPSHOT_WAIT`` at most)."""
        deadline = time.monotonic() + SNAPSHOT_WAIT
        while True:
            checkpoint = await self.manager.get_checkpoint(table)
            if checkpoint is None or checkpoint.state != "snapshotting":
                return
            if time.monotonic() > deadline:
                raise CdcError(
                    f"{table}: a snapshot of the table has been running for over {SNAPSHOT_WAIT:.0f}s; "
                    "replay its dead letters once it is done (cdc status shows its state)"
                )
            await asyncio.sleep(0.5)
