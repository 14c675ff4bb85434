"""The Redis distributed data manager: the facade the daemon and the tools use.

``DataManager`` owns the client and the config and keeps its public methods;
the work is done beside it: ``publishers.apply`` (the apply path's Python half,
beside ``lua/apply.lua``), ``publishers.documents`` (reading documents back). The
dead letter, checkpoints and heartbeats are small enough to stay here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import orjson
from redis.asyncio.cluster import RedisCluster
from redis.typing import EncodableT, FieldT

from publishers import cluster_wait, connection, redis_calls, scripts
from publishers.apply import MAX_CHANGES_PER_CALL, MAX_ROW_BYTES, Applier, apply_script
from publishers.apply_calls import MAX_CALL_BYTES, Prepared
from publishers.bulk import BulkWriter
from publishers.connection import RedisClient
from publishers.documents import Documents, decode_document
from publishers.durability import Acknowledgements
from publishers.errors import CdcError, LeaseLost
from publishers.layout import Layout
from publishers.model import ApplyResult, Blocked, Change, Checkpoint, Rejected, timestamp
from publishers.settings import RedisConfig

__all__ = [
    "MAX_CALL_BYTES",
    "MAX_CHANGES_PER_CALL",
    "MAX_ROW_BYTES",
    "DataManager",
    "Prepared",
    "apply_script",
    "decode_document",
    "timestamp",
]

log = logging.getLogger("publishers.deadletter")

# The dead letter is capped (XADD MAXLEN ~): a poison storm (a key template
# that fails every row of a large table) must not fill Redis, which would stop
# every table's mirroring (noeviction). The cap is not silent: once the stream
# holds this many entries, each process logs an error at most every
# ``DEAD_LETTER_FULL_WARN_EVERY`` seconds (docs/DEADLETTERS.md), and ``cdc
# doctor`` warns as it nears it. A table with that many entries is fixed by a
# snapshot (``cdc snapshot --table T``), not by replaying entries one by one.
DEAD_LETTER_MAX_LEN = 100_000
DEAD_LETTER_FULL_WARN_EVERY = 60.0


class DataManager:
    """The Redis side of cdc-sync. Build with ``await DataManager.connect(config)``."""

    def __init__(
        self,
        client: RedisClient,
        config: RedisConfig,
        *,
        max_row_bytes: int = MAX_ROW_BYTES,
        max_changes_per_call: int = MAX_CHANGES_PER_CALL,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.config = config
        self.layout = Layout(config.namespace)
        self.max_row_bytes = max_row_bytes
        self.max_changes_per_call = max(1, max_changes_per_call)
        self._owns_client = owns_client
        self._applier = Applier(
            client, config, self.layout, reject=self._reject, max_row_bytes=max_row_bytes,
            max_changes_per_call=max_changes_per_call,
        )  # fmt: skip
        self.prepare = self._applier.prepare  # what ``apply`` does before it needs Redis (CPU only)
        self._documents = Documents(client, self.layout, config.url)
        self._cap = _DeadLetterCap(client, self.layout.deadletter(), config.url)
        self._acks = Acknowledgements(config.durability, self.layout)  # confirm()'s WAIT

    @classmethod
    async def connect(
        cls, config: RedisConfig, *, client: RedisClient | None = None, **options: Any
    ) -> DataManager:
        """Connect (``ConnectError`` if Redis does not answer) and load the script;
        ``client``: an existing client (tests), which ``close()`` leaves open."""
        owns = client is None
        client = client or await connection.connect(config)
        try:
            manager = cls(client, config, owns_client=owns, **options)
            await manager._applier.load_script()
        except CdcError:
            if owns:
                await connection.close_client(client)
            raise
        return manager

    async def close(self) -> None:
        if self._owns_client:
            await connection.close_client(self.client)

    async def __aenter__(self) -> DataManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- applying -------------------------------------------------------------

    async def apply(
        self,
        changes: Sequence[Change],
        *,
        now: datetime | None = None,
        prepared: Prepared | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> ApplyResult:
        """Apply a batch: per partition in order, atomically per call (``prepared``:
        ``prepare(changes)``, made earlier; ``meanwhile`` runs once while the first
        calls are in Redis). Raises ``RedisUnavailable`` on transient failures (retry
        the batch). A partition whose shared keys cannot be written: its changes in
        ``ApplyResult.blocked``; a content failure: ``rejected`` (the dead letter)."""
        return await self._applier.apply(changes, now=now, prepared=prepared, meanwhile=meanwhile)

    def forget_registrations(self) -> None:
        """Register every partition again (``PartitionSets.forget``): a failover, a wipe."""
        self._applier.forget_registrations()

    # -- dead letter ----------------------------------------------------------

    async def _reject(self, change: Change, reason: str, result: ApplyResult) -> None:
        """Dead-letter a change of a batch. When the dead letter cannot be
        written (another type stored there, the ACL), the change is blocked
        instead: never applied, never lost; its reader reads it again."""
        key = self.layout.deadletter()
        command = self.client.xadd(
            key, self._dead_fields(change, reason, change.table), maxlen=DEAD_LETTER_MAX_LEN, approximate=True
        )
        reply = await redis_calls.reply_or_error(command, self.config.url)
        if not redis_calls.is_error_reply(reply):
            await self.confirm([key], "the dead letter entry", "its batch is retried")
            result.rejected.append(Rejected(change, reason))
            await self._cap.check()
            return
        blocked = redis_calls.blocked_reason(reply, shared_key=key)
        if blocked is None:
            raise redis_calls.translate(reply, self.config.url)
        result.blocked.append(Blocked(change, f"{blocked}; the change would go there: {reason}"))

    async def dead_letter(
        self,
        change: Change | None,
        reason: str,
        *,
        table: str,
        payload: Mapping[str, Any] | None = None,
        now: datetime | None = None,
    ) -> None:
        """Append to ``ns:@deadletter``: table, partition, section, key, op,
        version, reason, values (JSON object), ts. ``payload`` stands in for
        the values when there is no Change (e.g. a row that cannot be encoded)."""
        fields = self._dead_fields(change, reason, table, payload, now)
        deadletter = self.layout.deadletter()
        await self._call(self.client.xadd(deadletter, fields, maxlen=DEAD_LETTER_MAX_LEN, approximate=True))
        await self.confirm([deadletter], "the dead letter entry")
        await self._cap.check()

    def _dead_fields(
        self,
        change: Change | None,
        reason: str,
        table: str,
        payload: Mapping[str, Any] | None = None,
        now: datetime | None = None,
    ) -> dict[FieldT, EncodableT]:
        fields: dict[FieldT, EncodableT] = {
            "table": table,
            "partition": change.partition if change else "",
            "section": change.section if change else "",
            "key": change.key if change else "",
            "op": change.op if change else "",
            "version": str(change.version) if change else "",
            "reason": reason,
            "values": _dead_values(change, payload, self.max_row_bytes),
            "ts": timestamp(now),
        }
        return fields

    async def read_dead_letters(self, count: int = 100) -> list[dict[str, str]]:
        """The newest ``count`` dead letters, oldest first, each with its ``id``."""
        entries = await self._call(self.client.xrevrange(self.layout.deadletter(), count=count))
        out = []
        for entry_id, fields in reversed(entries):
            item = {redis_calls.text(k): redis_calls.text(v) for k, v in fields.items()}
            item["id"] = redis_calls.text(entry_id)
            out.append(item)
        return out

    # -- checkpoints and heartbeats ---------------------------------------------

    async def get_checkpoint(self, table: str) -> Checkpoint | None:
        """The table's stored checkpoint; None if none, or if the hash lacks ``version`` (a request or
        a snapshot's progress written after a wipe or a failover took the key). ``CdcError`` when
        the key is damaged (another type, a ``version`` not decimal): it names the key."""
        key = self.layout.checkpoint(table)
        raw = await self._call(self.client.hgetall(key))
        fields = {redis_calls.text(k): redis_calls.text(v) for k, v in raw.items()}
        if "version" not in fields:
            return None
        state: Literal["snapshotting", "streaming"] = (
            "snapshotting" if fields.get("state") == "snapshotting" else "streaming"
        )
        version = fields.get("version", "")
        if not version.isdecimal():
            raise CdcError(
                f"{table}: Redis layout is damaged: {key} field version holds {version!r}, not a version: "
                "delete the key to snapshot the table again"
            )
        return Checkpoint(table, int(version), state, fields.get("updated_at", ""))

    async def set_checkpoint(
        self,
        table: str,
        version: int,
        state: Literal["snapshotting", "streaming"],
        *,
        now: datetime | None = None,
        fence: int = 0,
    ) -> None:
        """Store the table's checkpoint; the version as a decimal string.

        With a ``fence`` token (the lease's), the write is refused with LeaseLost
        when a newer owner has written the checkpoint: a sidecar paused past its
        lease cannot move the new owner's checkpoint."""
        key = self.layout.checkpoint(table)
        if fence:
            args = (str(version), timestamp(now), state, str(fence))
            try:
                await scripts.run(self.client, scripts.FENCED_CHECKPOINT, [key], args, self.config.url)
            except LeaseLost as lost:
                raise LeaseLost(f"{table}: {lost}") from None
        else:
            mapping: dict[FieldT, EncodableT] = {
                "version": str(version),
                "updated_at": timestamp(now),
                "state": state,
            }
            await self._call(self.client.hset(key, mapping=mapping))
        await cluster_wait.checkpoint_durable(self.client, self.layout, table, self._acks, self.config.url)

    async def heartbeat(self, worker_id: str, fields: Mapping[str, Any], ttl: float) -> None:
        """Replace ``ns:@worker:id`` with ``fields`` and a TTL, atomically."""
        key = self.layout.worker(worker_id)
        mapping: dict[FieldT, EncodableT] = {name: _field_value(value) for name, value in fields.items()}
        if isinstance(self.client, RedisCluster):
            pairs = [item for name, value in mapping.items() for item in (name, value)]
            hset = [("HSET", key, *pairs)] if pairs else []
            commands = [("DEL", key), *hset, ("PEXPIRE", key, max(1, round(ttl * 1000)))]
            await cluster_wait.transaction(self.client, key, commands, self.config.url)
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        if mapping:
            pipe.hset(key, mapping=mapping)
        pipe.pexpire(key, max(1, round(ttl * 1000)))
        await redis_calls.execute(pipe, self.config.url)

    # -- reading documents (publishers.documents) --------------------------------

    async def document(self, partition: str, section: str, key: str) -> dict[str, Any] | None:
        """A live document, values decoded; None when absent or deleted."""
        return await self._documents.document(partition, section, key)

    async def documents(self, partition: str, section: str) -> dict[str, dict[str, Any]]:
        """Every live document of a section in a partition (not atomic)."""
        return await self._documents.documents(partition, section)

    async def partitions(self, section: str) -> set[str]:
        """The partition values ``section`` has written."""
        return await self._documents.partitions(section)

    def stale_keys(self, section: str) -> AsyncIterator[tuple[str, str]]:
        """(partition, key) of the section's live documents the whole snapshot
        running now did not write."""
        return self._documents.stale_keys(section)

    async def forget_seen(self, section: str) -> None:
        """Drop what the last whole snapshot of ``section`` recorded as written."""
        dropped = await self._documents.forget_seen(section)
        await self.confirm(dropped, "the dropped @seen sets")

    async def confirm(self, keys: Iterable[str], what: str, then: str = "it is retried") -> None:
        """With ``redis.durability``: WAIT until the replicas have ``keys``'
        writes (``cluster_wait.confirm``), else ``RedisUnavailable``."""
        await cluster_wait.confirm(self.client, keys, self._acks, self.config.url, what=what, then=then)

    def bulk_writer(self) -> BulkWriter:
        """A snapshot's bulk writer on this manager's client (``publishers.bulk``)."""
        return BulkWriter(self.client, self.config, self.layout)

    async def _call(self, awaitable: Any) -> Any:
        """Await one command (never abandoned half-way), mapping its errors."""
        return await redis_calls.call(awaitable, self.config.url)


def _dead_values(change: Change | None, payload: Mapping[str, Any] | None, max_row_bytes: int) -> bytes:
    """The values as one JSON object (spliced from the encoded columns), or
    ``null`` when they are absent or larger than ``max_row_bytes``."""
    if payload is not None:
        text = orjson.dumps(payload, default=str, option=orjson.OPT_NON_STR_KEYS)
    elif change is None or change.values is None:
        return b"null"
    else:
        members = (orjson.dumps(name) + b":" + value for name, value in change.values.items())
        text = b"{" + b",".join(members) + b"}"
    return text if len(text) <= max_row_bytes else b"null"


def _field_value(value: Any) -> EncodableT:
    if isinstance(value, (bytes, str, int, float)) and not isinstance(value, bool):
        return value
    return orjson.dumps(value)


class _DeadLetterCap:
    """Says when the dead letter is at its cap (``DEAD_LETTER_MAX_LEN``)."""

    def __init__(self, client: RedisClient, key: str, url: str) -> None:
        self.client, self.key, self.url = client, key, url
        self._next_check = 0.0  # monotonic time after which the length is read again

    async def check(self) -> None:
        """An error line, at most every ``DEAD_LETTER_FULL_WARN_EVERY``, while
        the dead letter is at its cap: its oldest entries are then trimmed as
        new ones arrive, and their keys can no longer be replayed. The length
        is read at most once a second: a poison storm dead-letters thousands
        of changes a second, each one XADD already. Never raises: the entry
        is written, and a failed check must not make its batch be retried."""
        now = time.monotonic()
        if now < self._next_check:
            return
        try:
            length = int(await redis_calls.call(self.client.xlen(self.key), self.url))
        except CdcError:
            return
        full = length >= DEAD_LETTER_MAX_LEN
        self._next_check = now + (DEAD_LETTER_FULL_WARN_EVERY if full else 1.0)
        if full:
            log.error(
                f"the dead letter {self.key} holds {length} entries, its cap ({DEAD_LETTER_MAX_LEN}): its "
                "oldest entries are trimmed as new ones arrive, and their keys are no longer replayed. See "
                "cdc deadletter list; fix the cause, then snapshot the table (cdc snapshot --table T) and "
                "purge its entries (cdc deadletter purge --table T)",
                extra={"entries": length},
            )
