"""The checkpoint line alone: no Redis, no source, no sleeping (a fake clock)."""

from __future__ import annotations

import asyncio

import pytest

from cdc.batching import Refusal, Ticket
from cdc.checkpoint import CHECKPOINT_INTERVAL, IDLE_CHECKPOINT_INTERVAL, CheckpointLine
from cdc.errors import ApplyBlocked, LeaseLost


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


FENCED = Refusal("fenced", "p1", "FENCED")
BLOCKED = Refusal("blocked", "p1", "Redis layout is damaged: ns:{p1}:@seq does not hold an integer")


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
    refused.applied(refusal=FENCED)
    later.applied()

    with pytest.raises(LeaseLost, match="dbo.items"):
        line.advance()
    assert line.applied == 20  # up to the refused read, not over it
    with pytest.raises(LeaseLost):  # it stays at the head
        line.advance()
    assert line.applied == 20


def test_a_blocked_read_raises_apply_blocked_and_is_never_passed(line: CheckpointLine) -> None:
    first, blocked, later = read(20), read(30), read(40)
    for ticket in (first, blocked, later):
        line.register(ticket)
    first.applied()
    blocked.applied(refusal=BLOCKED)
    later.applied()

    with pytest.raises(ApplyBlocked) as raised:
        line.advance()
    assert str(raised.value).startswith(
        "dbo.items: changes to partition 'p1' not applied: "
        "Redis layout is damaged: ns:{p1}:@seq does not hold an integer"
    )
    assert line.applied == 20  # up to the blocked read, not over it
    with pytest.raises(ApplyBlocked):  # it stays at the head
        line.advance()
    assert (line.applied, line.lag()) == (20, 0.0)  # fresh as of the first read
    assert not line.empty


async def test_drain_and_wait_applied_raise_at_a_blocked_read(line: CheckpointLine) -> None:
    first, blocked = read(20), read(30)
    line.register(first)
    line.register(blocked)
    first.applied()
    blocked.applied(refusal=BLOCKED)

    with pytest.raises(ApplyBlocked, match="partition 'p1'"):
        await asyncio.wait_for(line.drain(), 1.0)
    assert line.applied == 20
    sweep = read(50)
    sweep.applied(refusal=BLOCKED)
    with pytest.raises(ApplyBlocked, match="dbo.items"):
        await asyncio.wait_for(line.wait_applied(sweep), 1.0)


def test_a_fenced_change_outranks_a_blocked_one_in_the_same_read(line: CheckpointLine) -> None:
    both = read(20, changes=2)
    line.register(both)
    both.applied(refusal=BLOCKED)
    both.applied(refusal=FENCED)

    with pytest.raises(LeaseLost):
        line.advance()


def test_forget_reads_keeps_what_is_applied_and_persisted(line: CheckpointLine) -> None:
    first, blocked, later = read(20), read(30), read(40)
    for ticket in (first, blocked, later):
        line.register(ticket)
    first.applied()
    line.advance()
    line.persisted_now()
    blocked.applied(refusal=BLOCKED)
    with pytest.raises(ApplyBlocked):
        line.advance()

    line.forget_reads()

    assert line.empty
    assert (line.applied, line.persisted) == (20, 20)
    assert line.advance() is False
    later.applied()  # a forgotten read that completes later moves nothing
    assert line.advance() is False and line.applied == 20
    again = read(35)  # the table reads again from 20
    line.register(again)
    again.applied()
    assert line.advance() is True and line.applied == 35


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
    refused.applied(refusal=FENCED)

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


def test_lag_is_the_age_of_the_newest_read_whose_changes_are_all_applied(
    line: CheckpointLine, clock: Clock
) -> None:
    first = read(20)
    line.register(first)  # at 100
    clock.now += 3.0
    second = read(30)
    line.register(second)  # at 103
    clock.now += 2.0
    assert line.lag() == 5.0  # reset() at 100 knew no freshness: since then

    first.applied()
    line.advance()
    assert line.lag() == 5.0  # fresh as of the first read (100)
    second.applied()
    line.advance()
    assert line.lag() == 2.0  # as of the second read (103)


def test_lag_grows_while_nothing_is_read_or_applied(line: CheckpointLine, clock: Clock) -> None:
    """The source away (no read at all), or Redis away (a read never applied):
    it is the lag that tells, not a reading of 0."""
    idle = read(20, changes=0)
    line.register(idle)
    line.advance()
    clock.now += 60.0  # no read for a minute
    assert line.lag() == 60.0
    stuck = read(30)
    line.register(stuck)  # read, never applied
    clock.now += 60.0
    line.advance()
    assert line.lag() == 120.0


def test_lag_of_an_idle_table_is_its_poll_interval(line: CheckpointLine, clock: Clock) -> None:
    for version in range(20, 30):
        clock.now += 0.5  # a poll every half second, nothing found
        ticket = read(version, changes=0)
        line.register(ticket)
        line.advance()
        assert line.lag() == 0.0
    clock.now += 0.5
    assert line.lag() == 0.5


def test_a_table_never_fresh_lags_since_its_line_started(clock: Clock) -> None:
    line = CheckpointLine("dbo.items", clock=clock)
    line.reset(None)  # no checkpoint: its first snapshot runs
    clock.now += 40.0
    assert line.lag() == 40.0
    line.snapshotted(500, started_at=110.0)
    assert (line.applied, line.lag()) == (500, 30.0)


def test_a_stored_checkpoint_keeps_its_freshness(clock: Clock) -> None:
    """Taken on from Redis: the stored checkpoint was fresh when it was
    written; the lag counts from there until a read is applied."""
    line = CheckpointLine("dbo.items", clock=clock)
    line.reset(10, fresh_at=clock.now - 3600.0)
    assert line.lag() == 3600.0
    assert line.persisted_age() == 3600.0


def test_the_persisted_age_is_that_of_the_checkpoint_written(line: CheckpointLine, clock: Clock) -> None:
    assert line.persisted_age() is None  # reset() knew no freshness
    ticket = read(20)
    line.register(ticket)
    ticket.applied()
    line.advance()
    line.persisted_now()
    clock.now += 10.0
    later = read(30)
    line.register(later)
    later.applied()
    line.advance()  # applied, not yet written
    assert (line.lag(), line.persisted_age()) == (0.0, 10.0)


def test_fresh_now_only_when_nothing_waits(line: CheckpointLine, clock: Clock) -> None:
    ticket = read(20)
    line.register(ticket)
    clock.now += 5.0
    line.fresh_now()  # a read waits to be applied: not fresh
    assert line.lag() == 5.0
    ticket.applied()
    line.advance()
    clock.now += 5.0
    line.fresh_now()
    assert line.lag() == 0.0
