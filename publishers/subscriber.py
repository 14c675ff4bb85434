"""The subscriber client: a local replica of one partition, kept current from
the partition's change stream.

How it stays exact (DESIGN.md §5):

1. *Load*: one read-only Lua call returns the partition's ``@seq`` and the
   documents of its sections (index + hashes) atomically, so the replica is
   exactly the state at that seq.
2. *Follow*: ``XREAD BLOCK`` from ``<seq>-0`` (stream ids are ``<seq>-0``);
   each message's patch is applied to the replica (``publishers.patching``).
3. *Gaps*: a message whose seq is not the previous one + 1 means entries are
   missing from what was read; they are fetched with ``XRANGE``. When they are
   gone (the subscriber fell off the stream's trimmed end), or a patch does not
   fit the replica, the documents are loaded again and following continues
   from the current seq; ``on_reload`` is called and ``reloads`` counts it.
4. *Bulk snapshots*: a message with ``op`` ``R`` says a snapshot wrote the
   section's documents without a message per row: the replica is loaded
   again (``on_reload``, ``snapshot_reloads``) and the message is delivered.
5. *Replaced data*: after each read the entry at the read position must still
   be the message taken there. A Redis that restarted empty (or was flushed)
   starts every stream again from seq 1, and reading on from the old
   position would apply the new data's patches to a replica of the old: the
   replica is loaded again instead.
6. *Outages*: ``async for`` keeps following across transient Redis errors
   (a restart, a failover), retrying with a capped backoff; ``poll()`` raises
   them to callers that want to decide themselves. A reload that such an
   error interrupted is done first thing at the next poll, before reading on
   (the message that called for it is delivered then), so it is never lost.

``from_seq`` replays history first: messages from that seq on are yielded,
and only those newer than the loaded state are applied to the replica; one
past the partition's next seq raises ``CdcError`` at start (nothing would
come until the partition got there). It places the start only: after a
reload every message is yielded (the data replaced, seq starting again
from 1, included).
``async for message in subscriber`` yields messages as dicts (those of
``section`` only, when one is given); ``subscriber.entries()`` yields them as
``Entry`` (seq, the stream entry's JSON text as stored, and the dict);
``subscriber.replica`` is ``{section: {key: document}}``, and moves with the
messages: each is applied just before it is yielded, so while the
application handles message N the replica holds exactly the state after N
(``poll()``, which returns a batch, leaves it at the batch's last message).
``BlockingSubscriber`` wraps it for scripts (its ``replica`` is a copy).

Values are read exactly (``publishers.exact_json``): integers of any size,
non-integers a float64 cannot hold as ``Decimal``, any depth of nesting.
A process holding a large replica: ``publishers.gc_tuning``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from jsonpatch import JsonPatchException
from jsonpointer import JsonPointerException
from tenacity import AsyncRetrying, retry_if_exception_type

from publishers import connection, exact_json, patching, redis_calls
from publishers.connection import RedisClient
from publishers.errors import CdcError, TransientError
from publishers.layout import Layout
from publishers.messages import Document, Message, stream_seq
from publishers.replica_load import PartitionLoad, Replica
from publishers.retrying import equal_jitter
from publishers.settings import RedisConfig
from publishers.stream_entries import Entry, StreamReads, read_entries

T = TypeVar("T")
RETRY_WAIT = equal_jitter(0.1, 2.0)  # between attempts while Redis is unavailable: 0.05-0.1 s ... 1-2 s


# What a message needs after it is taken (Subscriber._step), and the reload
# of a gap (entries gone from the stream, or the partition's data replaced).
_NO_RELOAD, _MARKER, _MISFIT, _GAP = "none", "marker", "misfit", "gap"


class Subscriber:
    """A replica of ``partition`` (or of one ``section`` of it) and its messages."""

    def __init__(
        self,
        source: RedisClient | RedisConfig,
        namespace: str,
        partition: str,
        section: str | None = None,
        from_seq: int | None = None,
        *,
        sections: Sequence[str] | None = None,
        block: float = 1.0,
        count: int = 1000,
        on_reload: Callable[[int], None] | None = None,
    ) -> None:
        self._config = source if isinstance(source, RedisConfig) else None
        self._client = None if isinstance(source, RedisConfig) else source
        self.layout = Layout(namespace)
        self.partition = partition
        self.section = section
        self.from_seq = from_seq
        self._fixed_sections = [section] if section else (list(sections) if sections else None)
        self.block_ms = max(1, round(block * 1000))
        self.count = count
        self.on_reload = on_reload
        self.replica: Replica = {}
        self.seq = 0  # the seq the replica reflects
        self.position = 0  # the last seq read from the stream
        self._last: bytes | None = None  # the message at ``position``, when known
        self.reloads = 0
        self.snapshot_reloads = 0  # reloads at R messages (a bulk snapshot)
        # a reload a transient error interrupted, and the message to deliver
        # after it: done first at the next poll, as what is read then may not call for it
        self._pending: tuple[str, Entry | None] | None = None
        self._started = False
        self._stream = self.layout.stream(partition)
        self._stream_reads = StreamReads(lambda: self.client, self.layout, partition, self._redis)

    @property
    def client(self) -> RedisClient:
        if self._client is None:
            raise CdcError("the subscriber is not started (await start() or iterate it)")
        return self._client

    async def start(self) -> None:
        """Connect if needed, load the replica, and set the read position."""
        if self._started:
            return
        if self._client is None and self._config is not None:
            self._client = await connection.connect(self._config)
        await self._load()
        self.position = self.seq
        if self.from_seq is not None and _start_in_history(self.from_seq, self.partition, self.seq):
            await self._start_from_history(max(1, self.from_seq))
        self._started = True  # not before: a transient error above makes the next call start again

    async def aclose(self) -> None:
        """Close the client if the subscriber made it from a config."""
        if self._config is not None and self._client is not None:
            await connection.close_client(self._client)
            self._client = None

    async def __aenter__(self) -> Subscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self.messages()

    async def messages(self) -> AsyncGenerator[Message, None]:
        """Every message from the start position on, forever, across Redis
        outages (transient errors are retried with a capped, jittered backoff)."""
        async for entry in self.entries():
            yield entry.message

    async def entries(self) -> AsyncGenerator[Entry, None]:
        """``messages()`` as ``Entry`` (with the text as stored), each applied
        to ``replica`` just before it is yielded (module docstring)."""
        while True:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(TransientError), wait=RETRY_WAIT
            ):
                with attempt:
                    ready, read = await self._read()
            try:
                async for entry in self._taken(ready, read):
                    yield entry
            except TransientError:
                pass  # what was not taken is read again, and that read waits out the outage

    async def poll(self, block: float | None = None) -> list[Message]:
        """Read what the stream has after the position (waiting up to
        ``block`` seconds for something), update the replica, and return the
        messages to deliver (the replica then reflects the last of them)."""
        return [entry.message for entry in await self.poll_entries(block)]

    async def poll_entries(self, block: float | None = None) -> list[Entry]:
        """``poll()`` as ``Entry``. A transient error raises, unless messages were
        taken before it: those are returned, the rest is read again."""
        ready, read = await self._read(block)
        out: list[Entry] = []
        try:
            async for entry in self._taken(ready, read):
                out.append(entry)
        except TransientError:
            if not out:
                raise
        return out

    async def _read(self, block: float | None = None) -> tuple[list[Entry], list[tuple[int, bytes]]]:
        """The entry of a reload an error had interrupted (done now), and the
        stream's entries after the position (up to ``block`` s), not applied yet."""
        await self.start()
        if self._pending is not None:
            return await self._reload_then(*self._pending), []
        block_ms = self.block_ms if block is None else max(1, round(block * 1000))
        reply = await self._redis(
            self.client.xread({self._stream: f"{self.position}-0"}, count=self.count, block=block_ms),
            grace=block_ms / 1000 + redis_calls.SOCKET_TIMEOUT,
        )
        if not await self._stream_reads.holds(self.position, self._last):
            # what was read belongs to the new data, if anything
            return await self._reload_then(_GAP, None), []
        return [], read_entries(reply)

    # -- following ---------------------------------------------------------

    async def _taken(self, ready: list[Entry], read: list[tuple[int, bytes]]) -> AsyncIterator[Entry]:
        """``ready``, then ``read`` taken in seq order, each applied just before
        it is yielded; gaps filled from the stream, or reloaded."""
        for entry in ready:
            yield entry
        for seq, raw in read:
            if seq <= self.position:
                continue
            if seq != self.position + 1:
                missing = await self._stream_reads.fill(self.position + 1, seq - 1)
                if missing is None:  # gone from the stream
                    await self._reload_then(_GAP, None)
                    return
                for gap_seq, gap_raw in missing:
                    for entry in await self._take(gap_seq, gap_raw):
                        yield entry
            # _take inline: no coroutine a message (the reload, rare, is the only await)
            taken, reload = self._step(seq, raw)
            if reload is not _NO_RELOAD:
                for entry in await self._reload_then(reload, taken):
                    yield entry
            elif taken is not None:
                yield taken

    async def _take(self, seq: int, raw: bytes) -> list[Entry]:
        """Apply one message (if newer than the replica) and say whether to deliver it."""
        taken, reload = self._step(seq, raw)
        if reload is not _NO_RELOAD:
            return await self._reload_then(reload, taken)
        return [] if taken is None else [taken]

    def _step(self, seq: int, raw: bytes) -> tuple[Entry | None, str]:
        """``_take`` up to the reload: the entry to deliver (or None), and which
        reload it needs: none, an ``R`` message's (``_MARKER``), or that of a
        patch that did not fit the replica (``_MISFIT``)."""
        message: Message = exact_json.loads(raw)  # messages.decode_message, a call less
        self.position, self._last = seq, raw
        section = message.get("section")
        wanted = self.section is None or section == self.section
        reload = _NO_RELOAD
        if seq > self.seq:
            self.seq = seq
            if wanted and message.get("op") == "R":
                # a bulk snapshot wrote the section's documents without a
                # message per row: load them (DESIGN.md §5)
                reload = _MARKER
            elif wanted:
                try:
                    self._apply(message["section"], message["key"], message["patch"])
                except (JsonPatchException, JsonPointerException):
                    reload = _MISFIT
        # every message read is at or after from_seq: start() set the position
        # (not a filter here: after a reload of replaced data, whose seq starts
        # again from 1, it would hold back every message below the old from_seq)
        return (Entry(seq, raw, message) if wanted else None), reload

    def _apply(self, section: str, key: str, patch: list[dict[str, Any]]) -> None:
        """Patch one replica document (``apply_patch`` copies the patch's values,
        so the message handed out never shares objects with the replica)."""
        docs = self.replica.get(section)
        if docs is None:  # (not setdefault: its default would be a new dict every message)
            docs = self.replica[section] = {}
        document = patching.apply_patch(docs.get(key), patch)
        if document is None:
            docs.pop(key, None)
        else:
            docs[key] = document

    async def _start_from_history(self, from_seq: int) -> None:
        """Read from ``from_seq`` if the stream still holds it; else say so."""
        first = await self._redis(self.client.xrange(self._stream, f"{from_seq}-0", "+", count=1))
        if first and stream_seq(first[0][0]) == from_seq:
            self.position, self._last = from_seq - 1, None
        else:
            self.reloads += 1
            if self.on_reload is not None:
                self.on_reload(self.seq)

    # -- loading -----------------------------------------------------------

    async def _reload_then(self, kind: str, entry: Entry | None) -> list[Entry]:
        """Load the documents again, then deliver ``entry`` (the message that
        called for it, if any). After a gap (``_GAP``) the lost messages are
        skipped (position = the new seq); after a patch that did not fit
        (``_MISFIT``) or an ``R`` message (``_MARKER``), reading goes on from
        where it was, delivering without applying up to the new seq. Until the
        load succeeds the reload is pending (a transient error leaves it to the
        next poll). ``reloads`` counts the reloads nothing announced (a gap, a
        patch that did not fit, replaced data); ``snapshot_reloads`` those of
        ``R`` messages; ``on_reload`` hears both, once each."""
        self._pending = (kind, entry)
        last = self._last
        await self._load()
        self._pending = None
        if kind == _GAP or self.position > self.seq:
            self.position = self.seq
        else:
            self._last = last  # reading goes on from where it was
        if kind == _MARKER:
            self.snapshot_reloads += 1
        else:
            self.reloads += 1
        if self.on_reload is not None:
            self.on_reload(self.seq)
        return [] if entry is None else [entry]

    async def _load(self) -> None:
        """Seq and documents in one atomic read (``replica_load``)."""
        url = self._config.url if self._config else ""
        load = PartitionLoad(self.client, self.layout, self.partition, self._redis, url)
        self.seq, self._last, self.replica = await load.load(self._fixed_sections)

    async def _redis(self, awaitable: Any, grace: float = redis_calls.SOCKET_TIMEOUT) -> Any:
        """Await a command (never abandoned half-way), mapping its errors."""
        return await redis_calls.call(awaitable, self._config.url if self._config else "", grace=grace)


def _start_in_history(from_seq: int, partition: str, seq: int) -> bool:
    """Whether ``from_seq`` lies in the stream's history (else it is the next
    message); one past that raises: nothing would come until the partition
    got there, a silent wait."""
    if from_seq > seq + 1:
        raise CdcError(
            f"from_seq {from_seq}: partition {partition!r} is at seq {seq}, so its"
            f" next message is seq {seq + 1}; from_seq starts at the message of that seq"
        )
    return from_seq <= seq


class ReplicaCopy(dict[str, dict[str, Document]]):
    """A copy of a replica, ``{section: {key: document}}``. Calling it returns
    it, with a ``DeprecationWarning``: ``BlockingSubscriber.replica`` was a
    method before 0.5 (``sub.replica()``), and is an attribute now, as
    ``Subscriber.replica`` is; the call goes in 0.6."""

    def __call__(self) -> ReplicaCopy:
        warnings.warn(
            "BlockingSubscriber.replica is an attribute since cdc-sync 0.5: write sub.replica, "
            "not sub.replica() (the call goes in 0.6)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self


class BlockingSubscriber:
    """``Subscriber`` on its own thread and event loop, for scripts::

    with BlockingSubscriber(config, "app1") as sub:
        for message in sub:
            print(message, sub.replica)

    A message is read and applied when ``get`` asks for it, not before, so
    while the script handles message N, ``replica`` is the state after N.
    """

    def __init__(
        self,
        config: RedisConfig,
        partition: str,
        section: str | None = None,
        from_seq: int | None = None,
        *,
        namespace: str | None = None,
        block: float = 1.0,
        start_timeout: float = 30.0,
    ) -> None:
        self.subscriber = Subscriber(
            config, namespace or config.namespace, partition, section, from_seq, block=block
        )
        self._messages = self.subscriber.messages()
        self._next: concurrent.futures.Future[Message] | None = None  # get's read, while it runs
        self._task: asyncio.Task[Message] | None = None  # the same, on the loop
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="cdc-subscriber")
        self._thread.start()
        try:
            self._on_loop(self.subscriber.start()).result(start_timeout)
        except TimeoutError:
            self.close()
            raise CdcError(f"the subscriber did not start within {start_timeout:.0f}s") from None
        except BaseException:
            self.close()
            raise

    def _on_loop(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def _next_message(self) -> Message:
        self._task = asyncio.current_task()
        return await anext(self._messages)

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds or once closed.
        A read that timed out goes on, and the next ``get`` returns its message."""
        if self._closed:
            return None
        if self._next is None:
            self._next = self._on_loop(self._next_message())
        try:
            return self._next.result(timeout)
        except TimeoutError:
            if not self._next.done():
                return None
            raise
        except StopAsyncIteration:
            return None
        finally:
            if self._next.done():
                self._next = None

    def __iter__(self) -> Iterator[Message]:
        while (message := self.get()) is not None:
            yield message

    @property
    def replica(self) -> ReplicaCopy:
        """A copy of the replica (taken on the subscriber's loop): the state
        after the message ``get`` returned last, unless a ``get`` timed out
        since (its read goes on: the copy may then hold the next message)."""

        async def copy() -> ReplicaCopy:
            return ReplicaCopy(exact_json.copy(self.subscriber.replica))  # deepcopy recurses

        return self._on_loop(copy()).result()

    def close(self) -> None:
        """Stop reading, close the connection, end the thread."""
        if self._closed:
            return
        self._closed = True
        if self._loop.is_running():
            self._on_loop(self._shutdown()).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._messages.aclose()
        await self.subscriber.aclose()

    def __enter__(self) -> BlockingSubscriber:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
