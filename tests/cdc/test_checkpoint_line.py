"""The checkpoint line alone: no Redis, no source, no sleeping (a fake clock)."""

from __future__ import annotations

import asyncio

import pytest

from cdc.batching import Ticket
from cdc.checkpoint import CHECKPOINT_INTERVAL, IDLE_CHECKPOINT_INTERVAL, CheckpointLine
from cdc.errors import LeaseLost


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def read(version: int, changes: int = 1) -> Ticket:
    """A complete read of ``changes`` changes up to ``version``, none applied yet."""
    ticket = Ticket(version=version)
    ticket.add(changes)
    ticket.seal()
    return ticket


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def line(clock: Clock) -> CheckpointLine:
    line = CheckpointLine("dbo.items", clock=clock)
    line.reset(10)
    return line


def test_finished_reads_advance_in_read_order(line: CheckpointLine) -> None:
    first, second = read(20, 2), read(30, 3)
    line.register(first)
    line.register(second)
    first.applied(2)
    second.applied(3)

    assert line.advance() is True
    assert line.applied == 30
    assert line.empty
    assert line.unpersisted_changes == 5


def test_an_unfinished_read_holds_back_a_finished_later_one(line: CheckpointLine) -> None:
    first, second = read(20), read(30)
    line.register(first)
    line.register(second)
    second.applied()

    assert line.advance() is False
    assert line.applied == 10
    first.applied()
    assert line.advance() is True
    assert line.applied == 30


def test_a_partly_applied_read_is_not_passed(line: CheckpointLine) -> None:
    ticket = read(20, changes=3)
    line.register(ticket)
    ticket.applied(2)

    assert line.advance() is False
    assert line.applied == 10


def test_a_refused_read_is_never_passed(line: CheckpointLine) -> None:
    first, refused, later = read(20), read(30), read(40)
    for ticket in (first, refused, later):
        line.register(ticket)
    first.applied()
    refused.applied(refused=True)
    later.applied()

    with pytest.raises(LeaseLost, match="dbo.items"):
        line.advance()
    assert line.applied == 20  # up to the refused read, not over it
    with pytest.raises(LeaseLost):  # it stays at the head
        line.advance()
    assert line.applied == 20


def test_an_empty_read_advances_at_once(line: CheckpointLine) -> None:
    line.register(read(25, changes=0))

    assert line.advance() is True
    assert line.applied == 25
    assert line.unpersisted_changes == 0
    assert line.settled


async def test_drain_waits_for_every_read_in_order(line: CheckpointLine) -> None:
    first, second = read(20), read(30)
    line.register(first)
    line.register(second)
    drained = asyncio.create_task(line.drain())
    await asyncio.sleep(0)  # let it start waiting
    assert not drained.done()

    second.applied()
    first.applied()

    assert await asyncio.wait_for(drained, 1.0) is True
    assert line.applied == 30


async def test_drain_stops_at_a_refused_read(line: CheckpointLine) -> None:
    first, refused = read(20), read(30)
    line.register(first)
    line.register(refused)
    first.applied()
    refused.applied(refused=True)

    with pytest.raises(LeaseLost):
        await asyncio.wait_for(line.drain(), 1.0)
    assert line.applied == 20


def test_checkpoint_is_due_every_second_while_changes_apply(line: CheckpointLine, clock: Clock) -> None:
    line.persisted_now()
    ticket = read(20)
    line.register(ticket)
    ticket.applied()
    line.advance()

    assert not line.persist_due()
    clock.now += CHECKPOINT_INTERVAL
    assert line.persist_due()
    line.persisted_now()
    assert line.persisted == 20 and line.settled


def test_an_idle_table_checkpoints_on_the_long_interval(line: CheckpointLine, clock: Clock) -> None:
    line.persisted_now()
    line.register(read(20, changes=0))
    line.advance()

    clock.now += CHECKPOINT_INTERVAL
    assert not line.persist_due()
    clock.now += IDLE_CHECKPOINT_INTERVAL
    assert line.persist_due()


def test_reset_forgets_the_reads_in_flight(line: CheckpointLine) -> None:
    line.register(read(20))

    line.reset(50)

    assert line.empty
    assert (line.applied, line.persisted) == (50, 50)
    assert line.advance() is False


def test_oldest_read_age_is_the_lag_of_the_head(line: CheckpointLine, clock: Clock) -> None:
    assert line.oldest_read_age() == 0.0
    line.register(read(20))
    clock.now += 3.0
    line.register(read(30))

    assert line.oldest_read_age() == 3.0
