"""ReaderLock: one holder at a time; the next page of a read under way goes
before new reads, unless a new read has waited ``max_wait``; a waiter that
gives up never keeps the lock from the others."""

from __future__ import annotations

import asyncio

import pytest

from cdc.sources.reader_lock import ReaderLock
from tests.e2e import wait_for


async def until_waiting(lock: ReaderLock, count: int) -> None:
    async def waiting() -> bool:
        return lock.waiting() == count

    await wait_for(waiting, 5, f"{count} waiting for the lock")


async def holder(lock: ReaderLock, name: str, order: list[str], *, continuing: bool = False) -> None:
    async with lock.continuing() if continuing else lock:
        order.append(name)
        await asyncio.sleep(0)  # still held: nobody else gets in meanwhile
        assert order[-1] == name


async def test_pages_of_reads_under_way_go_first_then_the_others_in_order() -> None:
    lock, order = ReaderLock(), []
    await lock.acquire()
    tasks = []
    for name, continuing in [("new 1", False), ("page 1", True), ("new 2", False), ("page 2", True)]:
        tasks.append(asyncio.create_task(holder(lock, name, order, continuing=continuing)))
        await until_waiting(lock, len(tasks))
    lock.release()
    await asyncio.gather(*tasks)
    assert order == ["page 1", "page 2", "new 1", "new 2"]
    assert not lock.locked()


async def test_a_new_read_that_waited_max_wait_goes_next() -> None:
    lock, order = ReaderLock(max_wait=0.05), []
    await lock.acquire()
    new = asyncio.create_task(holder(lock, "new", order))
    await until_waiting(lock, 1)
    await asyncio.sleep(0.06)
    page = asyncio.create_task(holder(lock, "page", order, continuing=True))
    await until_waiting(lock, 2)
    lock.release()
    await asyncio.gather(new, page)
    assert order == ["new", "page"]


async def test_a_waiter_cancelled_before_its_turn_leaves_the_line() -> None:
    lock, order = ReaderLock(), []
    await lock.acquire()
    gone = asyncio.create_task(holder(lock, "gone", order, continuing=True))
    other = asyncio.create_task(holder(lock, "other", order))
    await until_waiting(lock, 2)
    gone.cancel()
    await until_waiting(lock, 1)
    lock.release()
    await other
    assert order == ["other"] and not lock.locked()
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_a_waiter_cancelled_once_handed_the_lock_passes_it_on() -> None:
    lock, order = ReaderLock(), []
    await lock.acquire()
    handed = asyncio.create_task(holder(lock, "handed", order, continuing=True))
    other = asyncio.create_task(holder(lock, "other", order))
    await until_waiting(lock, 2)
    lock.release()  # "handed" is given the lock, and is cancelled before it runs
    handed.cancel()
    await other
    assert order == ["other"] and not lock.locked()
    with pytest.raises(asyncio.CancelledError):
        await handed


async def test_release_without_acquire_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        ReaderLock().release()


async def test_a_waiter_that_times_out_leaves_the_line() -> None:
    lock, order = ReaderLock(), []
    await lock.acquire()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await lock.acquire(continuing=True)
    assert lock.waiting() == 0
    other = asyncio.create_task(holder(lock, "other", order))
    await until_waiting(lock, 1)
    lock.release()
    await other
    assert order == ["other"] and not lock.locked() and lock.waiting() == 0
