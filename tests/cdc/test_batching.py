"""The AutoBatchWorker and the empty-poll backoff, with an in-memory apply
function (a real Redis adds nothing to what these check: queueing, batching,
backpressure, retries and tickets)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from cdc.backoff import EmptyPollBackoff
from cdc.batching import AutoBatchWorker, Refusal, Ticket
from cdc.config import DEFAULT_BACKOFF
from cdc.errors import RedisUnavailable
from publishers.model import ApplyResult, Blocked, Change


def change(n: int, table: str = "dbo.T") -> Change:
    return Change(table, "p", "s", str(n), "U", n, {"v": str(n).encode()})


class Recorder:
    def __init__(self, fail_times: int = 0, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.fail_times = fail_times
        self.delay = delay
        self.calls = 0

    async def __call__(self, changes: Sequence[Change]) -> ApplyResult:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_times > 0:
            self.fail_times -= 1
            raise RedisUnavailable("connection refused")
        self.batches.append([c.version for c in changes])
        return ApplyResult(applied=len(changes))


async def test_a_lone_change_is_applied_without_waiting_for_max_wait() -> None:
    recorder = Recorder()
    worker = AutoBatchWorker(recorder, max_batch_size=500, max_wait=30.0, capacity=100)
    worker.start()
    ticket = Ticket(version=1)
    started = time.monotonic()
    await worker.put(change(1), ticket)
    ticket.seal()
    await asyncio.wait_for(ticket.done.wait(), 5)
    assert time.monotonic() - started < 1.0  # far below max_wait=30s
    assert recorder.batches == [[1]]
    await worker.stop()


async def test_batches_fill_while_one_is_in_flight_and_never_exceed_max_size() -> None:
    recorder = Recorder(delay=0.02)
    worker = AutoBatchWorker(recorder, max_batch_size=50, max_wait=1.0, capacity=1000)
    worker.start()
    ticket = Ticket(version=500)
    for n in range(1, 501):
        await worker.put(change(n), ticket)
    ticket.seal()
    await asyncio.wait_for(ticket.done.wait(), 10)
    await worker.stop()
    flat = [v for batch in recorder.batches for v in batch]
    assert flat == list(range(1, 501))  # every change once, in order
    assert max(len(b) for b in recorder.batches) <= 50
    assert len(recorder.batches) < 100  # batched, not one by one


async def test_producers_wait_when_the_queue_is_full() -> None:
    release = asyncio.Event()

    async def blocked(changes: Sequence[Change]) -> ApplyResult:
        await release.wait()
        return ApplyResult(applied=len(changes))

    worker = AutoBatchWorker(blocked, max_batch_size=1, max_wait=0.01, capacity=3)
    worker.start()
    ticket = Ticket(version=10)
    for n in range(4):  # one in flight + three queued
        await asyncio.wait_for(worker.put(change(n), ticket), 1)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(worker.put(change(99), ticket), 0.2)
    release.set()
    await asyncio.wait_for(worker.drain(), 5)
    await worker.stop()


async def test_transient_failures_are_retried_until_the_batch_applies() -> None:
    recorder = Recorder(fail_times=3)
    degraded: list[object] = []
    worker = AutoBatchWorker(
        recorder, max_batch_size=10, max_wait=0.01, capacity=10, on_degraded=degraded.append
    )
    worker.start()
    ticket = Ticket(version=2)
    await worker.put(change(1), ticket)
    await worker.put(change(2), ticket)
    ticket.seal()
    await asyncio.wait_for(ticket.done.wait(), 10)
    await worker.stop()
    assert recorder.calls >= 4 and [v for b in recorder.batches for v in b] == [1, 2]
    assert any(isinstance(e, RedisUnavailable) for e in degraded) and degraded[-1] is None
    assert worker.stats.retries == 3


async def test_a_ticket_completes_only_when_sealed_and_every_change_is_applied() -> None:
    ticket = Ticket(version=7)
    ticket.add()
    ticket.add()
    ticket.applied()
    ticket.applied()
    assert not ticket.done.is_set()  # not sealed: the read may still add changes
    ticket.seal()
    assert ticket.done.is_set()
    empty = Ticket(version=8)
    empty.seal()
    assert empty.done.is_set()  # an empty read completes at once


def test_backoff_follows_the_configured_steps_and_resets_on_changes() -> None:
    backoff = EmptyPollBackoff(DEFAULT_BACKOFF)
    delays = []
    for _ in range(120):
        backoff.record(found_changes=False)
        delays.append(backoff.delay)
    assert delays[0] == 0.05 and delays[4] == 0.05
    assert delays[5] == 0.2 and delays[19] == 0.2
    assert delays[20] == 1.0 and delays[99] == 1.0
    assert delays[100] == 5.0 and delays[119] == 5.0
    backoff.record(found_changes=True)
    assert backoff.delay == 0.0 and backoff.step == -1


async def test_put_many_queues_what_fits_waits_for_room_and_keeps_order_across_tickets() -> None:
    recorder = Recorder(delay=0.01)
    worker = AutoBatchWorker(recorder, max_batch_size=7, max_wait=1.0, capacity=10)
    worker.start()
    first, second = Ticket(version=30), Ticket(version=60)
    # 30 changes into a queue of 10: the call returns only once all of them are queued
    await asyncio.wait_for(worker.put_many([change(n) for n in range(1, 31)], first), 10)
    first.seal()
    assert worker.depth <= 10
    await asyncio.wait_for(worker.put_many([change(n) for n in range(31, 61)], second), 10)
    second.seal()
    await asyncio.wait_for(second.done.wait(), 10)
    assert first.done.is_set()  # applied in order: the earlier read first
    assert (first.changes, first.pending, second.changes, second.pending) == (30, 0, 30, 0)
    await worker.stop()
    assert [v for b in recorder.batches for v in b] == list(range(1, 61))
    assert max(len(b) for b in recorder.batches) <= 7


async def test_a_fenced_change_marks_only_its_own_ticket_refused() -> None:
    async def fence_seven(changes: Sequence[Change]) -> ApplyResult:
        return ApplyResult(applied=len(changes), fenced=[c for c in changes if c.version == 7])

    worker = AutoBatchWorker(fence_seven, max_batch_size=100, max_wait=1.0, capacity=100)
    tickets = [Ticket(version=5), Ticket(version=10), Ticket(version=15)]
    for i, ticket in enumerate(tickets):  # queued before the applier starts: one batch holds all three
        await worker.put_many([change(n) for n in range(5 * i + 1, 5 * i + 6)], ticket)
        ticket.seal()
    worker.start()
    await asyncio.wait_for(worker.drain(), 5)
    await worker.stop()
    assert all(t.done.is_set() for t in tickets)
    assert [t.refusal for t in tickets] == [None, Refusal("fenced", "p", "FENCED"), None]


async def test_a_blocked_change_refuses_its_ticket_with_the_reason_and_fenced_outranks_it() -> None:
    """Blocked and FENCED changes in one read: the read is refused as FENCED
    (the table is not ours any more: nothing to retry), whatever came first."""

    async def refuse_some(changes: Sequence[Change]) -> ApplyResult:
        blocked = [Blocked(c, "Redis layout is damaged: x") for c in changes if c.version in (2, 6)]
        return ApplyResult(
            applied=len(changes) - 3, blocked=blocked, fenced=[c for c in changes if c.version == 7]
        )

    worker = AutoBatchWorker(refuse_some, max_batch_size=100, max_wait=1.0, capacity=100)
    tickets = [Ticket(version=5), Ticket(version=10)]
    for i, ticket in enumerate(tickets):
        await worker.put_many([change(n) for n in range(5 * i + 1, 5 * i + 6)], ticket)
        ticket.seal()
    worker.start()
    await asyncio.wait_for(worker.drain(), 5)
    await worker.stop()
    assert [t.refusal for t in tickets] == [
        Refusal("blocked", "p", "Redis layout is damaged: x"),
        Refusal("fenced", "p", "FENCED"),
    ]


def test_fenced_outranks_blocked_in_either_order() -> None:
    blocked, fenced = Refusal("blocked", "p1", "why"), Refusal("fenced", "p2", "FENCED")
    for first, second in ((blocked, fenced), (fenced, blocked)):
        ticket = Ticket(version=1)
        ticket.add(2)
        ticket.seal()
        ticket.applied(refusal=first)
        ticket.applied(refusal=second)
        assert ticket.done.is_set() and ticket.refusal == fenced


class TakesAhead:
    """An apply function that, while its batch is "in Redis", takes the next
    batch as the pipeline does (``take_ahead``) and records what it got."""

    def __init__(self, worker_box: list[AutoBatchWorker], fail_on: int | None = None) -> None:
        self.box, self.fail_on = worker_box, fail_on
        self.batches: list[list[int]] = []
        self.taken: list[list[int] | None] = []

    async def __call__(self, changes: Sequence[Change]) -> ApplyResult:
        ahead = self.box[0].take_ahead()
        self.taken.append(None if ahead is None else [c.version for c in ahead])
        await asyncio.sleep(0.005)  # the batch in flight
        if self.fail_on is not None and changes[0].version == self.fail_on:
            raise RuntimeError("a bug in the apply function")
        self.batches.append([c.version for c in changes])
        return ApplyResult(applied=len(changes))


async def test_a_batch_taken_ahead_under_a_backlog_is_the_next_applied_in_order() -> None:
    box: list[AutoBatchWorker] = []
    apply = TakesAhead(box)
    worker = AutoBatchWorker(apply, max_batch_size=10, max_wait=1.0, capacity=30)
    box.append(worker)
    ticket = Ticket(version=100)
    await worker.put_many([change(n) for n in range(1, 31)], ticket)  # a backlog: the queue full
    worker.start()
    await asyncio.wait_for(worker.put_many([change(n) for n in range(31, 101)], ticket), 10)
    ticket.seal()
    await asyncio.wait_for(ticket.done.wait(), 10)
    await worker.stop()
    assert [v for b in apply.batches for v in b] == list(range(1, 101))  # each once, in order
    assert any(apply.taken), "a whole batch was queued: it was taken ahead"
    for i, ahead in enumerate(apply.taken):  # a batch taken ahead is the next one applied
        if ahead is not None:
            assert apply.batches[i + 1] == ahead
    assert worker.stats.changes == 100


async def test_nothing_is_taken_ahead_under_a_light_load() -> None:
    box: list[AutoBatchWorker] = []
    apply = TakesAhead(box)
    worker = AutoBatchWorker(apply, max_batch_size=10, max_wait=1.0, capacity=30)
    box.append(worker)
    worker.start()
    ticket = Ticket(version=9)
    await worker.put_many([change(n) for n in range(1, 10)], ticket)  # fewer than a batch
    ticket.seal()
    await asyncio.wait_for(ticket.done.wait(), 10)
    await worker.stop()
    assert apply.taken and all(t is None for t in apply.taken)  # the next batch goes on filling


async def test_the_batch_taken_ahead_counts_against_the_capacity() -> None:
    release = asyncio.Event()
    box: list[AutoBatchWorker] = []

    async def slow(changes: Sequence[Change]) -> ApplyResult:
        box[0].take_ahead()
        await release.wait()
        return ApplyResult(applied=len(changes))

    worker = AutoBatchWorker(slow, max_batch_size=5, max_wait=1.0, capacity=10)
    box.append(worker)
    ticket = Ticket(version=99)
    await worker.put_many([change(n) for n in range(10)], ticket)
    worker.start()  # takes 5 (in flight), then 5 ahead: 5 taken ahead + 5 queued = the capacity
    await asyncio.wait_for(worker.put_many([change(n) for n in range(10, 15)], ticket), 1)
    assert worker.depth == 10  # the batch taken ahead is still queued, for the gauge too
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(worker.put(change(99), ticket), 0.2)
    release.set()
    ticket.seal()
    await asyncio.wait_for(ticket.done.wait(), 5)
    await worker.stop()


async def test_after_a_crashing_apply_the_batch_taken_ahead_is_applied_first_by_the_next_applier() -> None:
    box: list[AutoBatchWorker] = []
    apply = TakesAhead(box, fail_on=1)
    worker = AutoBatchWorker(apply, max_batch_size=5, max_wait=1.0, capacity=20)
    box.append(worker)
    await worker.put_many([change(n) for n in range(1, 21)], Ticket(version=20))
    worker.start()
    task = worker.task
    assert task is not None
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(task, 5)
    assert apply.taken == [[6, 7, 8, 9, 10]]
    apply.fail_on = None  # whoever applies next (here: the worker started again) finds it first
    worker.start()
    await asyncio.wait_for(worker.drain(), 5)
    await worker.stop()
    assert [v for b in apply.batches for v in b] == list(range(6, 21))  # nothing lost, in order
