"""What the data manager applies, and what it reports back.

A ``Change`` is one row's new state, already encoded: every published column
as JSON text (``cdc.values.encode_value``), so the Lua script only compares
and splices text and never decodes a number (DESIGN.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

ChangeOp = Literal["I", "U", "D", "S"]


def timestamp(now: datetime | None = None) -> str:
    """ISO 8601 UTC with microseconds and ``Z``, as messages carry it (naive = UTC)."""
    moment = now or datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(slots=True)
class Change:
    """(Treated as immutable; not a frozen dataclass only because one is built
    per change and a frozen dataclass's ``__init__`` costs twice as much.)"""

    table: str  # "schema.name" as registered
    partition: str  # raw partition value (percent-encoded only inside keys)
    section: str
    key: str  # data key
    op: ChangeOp  # net operation from the source, or S for a snapshot row
    version: int  # source version: applied only if above the document's @v
    values: dict[str, bytes] | None  # column -> JSON text; None for a delete
    reset: bool = False  # snapshot after the source went back in time: skip the version check
    fence: int = 0  # fencing token of the table's lease; 0: not fenced


@dataclass(frozen=True)
class Rejected:
    """A change sent to the dead letter: its content cannot be applied."""

    change: Change
    reason: str


@dataclass(frozen=True)
class Blocked:
    """A change not applied because a key that its whole partition shares
    cannot be written (a damaged layout, an ACL refusal): nothing was written
    for it, and it is not in the dead letter (the change is fine, the key is
    not). Its reader must read it again once the key is repaired."""

    change: Change
    reason: str  # e.g. "Redis layout is damaged: ns:{p1}:@seq does not hold an integer"


@dataclass
class ApplyResult:
    """Outcome of ``DataManager.apply`` for one batch."""

    applied: int = 0  # changes whose version was above the document's @v
    published: int = 0  # of those, the ones that changed something visible
    stale: int = 0  # dropped: version at or below the document's @v (replays)
    rejected: list[Rejected] = field(default_factory=list)  # sent to the dead letter
    fenced: list[Change] = field(default_factory=list)  # not applied: their lease was taken over
    blocked: list[Blocked] = field(default_factory=list)  # not applied: their partition's keys are damaged
    seqs: dict[str, int] = field(default_factory=dict)  # partition -> @seq after the batch


@dataclass(frozen=True)
class Checkpoint:
    table: str
    version: int
    state: Literal["snapshotting", "streaming"]
    updated_at: str  # ISO 8601


@dataclass(frozen=True)
class Finding:
    """One thing ``cdc doctor`` found: level is ok, warning or error."""

    level: Literal["ok", "warning", "error"]
    subject: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)
