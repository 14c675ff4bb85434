"""``cdc deadletter list|show|replay|purge`` (docs/DEADLETTERS.md), the dead
letter's findings for ``cdc doctor`` and the summary ``cdc run --once`` prints.

Exit codes: those of DESIGN.md §6, and ``DEAD_LETTERED`` (4): the command did
its work, but changes are in the dead letter because of it (``run --once``
dead-lettered some; ``replay`` sent some back or left some there).
"""

from __future__ import annotations

import sys

import orjson

from cdc.config import Config, TableConfig
from cdc.deadletter_replay import Outcome, Replayer
from cdc.errors import CdcError, ConfigError
from cdc.sources.base import Finding
from publishers import deadletters
from publishers.deadletters import DeadLetter
from publishers.manager import DEAD_LETTER_MAX_LEN, DataManager

DEAD_LETTERED = 4
REASON_SHOWN = 200  # characters of a reason in the text views (--json has it whole)


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _short(text: str, limit: int = REASON_SHOWN) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


async def _table_name(config: Config, manager: DataManager, table: str | None) -> str | None:
    """``--table`` as the config writes it; a table the config no longer
    registers is fine while the dead letter still holds entries of it (to
    list or purge them); otherwise a usage error naming the registered tables."""
    if table is None:
        return None
    try:
        return config.table(table).table
    except ConfigError:
        held = {name.lower(): name for name in await deadletters.counts(manager)}
        if table.lower() in held:
            return held[table.lower()]
        raise


# -- list and show -------------------------------------------------------------------


async def list_entries(
    config: Config, *, table: str | None, after: str | None, limit: int, as_json: bool
) -> int:
    async with await DataManager.connect(config.redis) as manager:
        name = await _table_name(config, manager, table)
        page = await deadletters.entries(manager, table=name, after=after, limit=limit)
    if as_json:
        entries = [letter.as_json() for letter in page.entries]
        _print(orjson.dumps({"entries": entries, "next": page.next}).decode())
        return 0
    for letter in page.entries:
        _print(
            f"{letter.id}  {letter.table}  partition={letter.partition!r} key={letter.key!r} op={letter.op} "
            f"version={letter.version}  {letter.ts}\n    {_short(letter.reason)}"
        )
    if not page.entries:
        _print("the dead letter holds no entry" + (f" of {name}" if name else ""))
    if page.next is not None:
        _print(
            f"more: cdc deadletter list -c {config.path} --after {page.next}"
            + (f" --table {name}" if name else "")
        )
    return 0


async def show(config: Config, entry_id: str, *, as_json: bool) -> int:
    async with await DataManager.connect(config.redis) as manager:
        letter = await deadletters.entry(manager, entry_id)
    if letter is None:
        raise CdcError(f"the dead letter has no entry {entry_id} (cdc deadletter list -c {config.path})")
    if as_json:
        _print(orjson.dumps(letter.as_json()).decode())
        return 0
    for name, value in letter.as_json().items():
        if name == "values":
            value = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
        _print(f"{name:<10} {value}")
    return 0


# -- purge ---------------------------------------------------------------------------


async def purge(config: Config, *, table: str | None, ids: tuple[str, ...], everything: bool) -> int:
    async with await DataManager.connect(config.redis) as manager:
        if ids:
            removed = await deadletters.delete(manager, list(ids))
        else:
            name = await _table_name(config, manager, table)
            removed = await deadletters.purge(manager, None if everything else name)
    _print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from the dead letter")
    return 0


# -- replay --------------------------------------------------------------------------


async def replay(config: Config, *, table: str | None, ids: tuple[str, ...], as_json: bool) -> int:
    """Replay the entries of ``table`` (every table's when None), or the entries ``ids``."""
    from cdc.commands import connected

    async with connected(config) as (source, manager):
        assert manager is not None
        chosen = [config.table(table)] if table else list(config.tables)
        letters = await _chosen_letters(manager, chosen, ids)
        replayer = Replayer(source, manager, config.worker.max_row_bytes)
        outcomes = []
        for table_config in chosen:
            mine = [letter for letter in letters if letter.table.lower() == table_config.table.lower()]
            if mine:
                outcomes.append(await replayer.replay(table_config, mine))
        registered = {t.table.lower() for t in config.tables}
        unknown = {letter.table for letter in letters if letter.table.lower() not in registered}
    if as_json:
        _print(orjson.dumps({"tables": [o.as_json() for o in outcomes]}).decode())
    else:
        _print_outcomes(config, outcomes)
    for name in sorted(unknown):
        _print(
            f"left   {name}: not a table of {config.path}; its entries stay (cdc deadletter purge --table {name})"
        )
    return DEAD_LETTERED if any(o.failed_again or o.left for o in outcomes) or unknown else 0


async def _chosen_letters(
    manager: DataManager, chosen: list[TableConfig], ids: tuple[str, ...]
) -> list[DeadLetter]:
    if ids:
        found = [await deadletters.entry(manager, i) for i in ids]
        missing = [i for i, letter in zip(ids, found, strict=True) if letter is None]
        if missing:
            raise CdcError(f"the dead letter has no entry {', '.join(missing)}")
        return [letter for letter in found if letter is not None]
    names = {t.table.lower() for t in chosen}
    return [letter async for letter in deadletters.scan(manager) if letter.table.lower() in names]


def _print_outcomes(config: Config, outcomes: list[Outcome]) -> None:
    if not outcomes:
        _print("the dead letter holds nothing to replay")
    for o in outcomes:
        _print(
            f"{o.table}: {len(o.replayed)} replayed, {len(o.failed_again)} back in the dead letter, {len(o.left)} left"
        )
        for entry_id, reason in o.failed_again:
            _print(f"  failed again  {entry_id}: {_short(reason)}")
        for entry_id, reason in o.left:
            _print(f"  left          {entry_id}: {_short(reason)}")
    if any(o.failed_again or o.left for o in outcomes):
        _print(f"see them: cdc deadletter list -c {config.path}")


# -- for cdc run --once and cdc doctor ---------------------------------------------


async def run_summary(config: Config, mark: str) -> int:
    """After ``cdc run --once``: the entries the run added (after the id
    ``mark``), per table on stderr; ``DEAD_LETTERED`` if any, else 0."""
    per_table: dict[str, list[DeadLetter]] = {}
    async with await DataManager.connect(config.redis) as manager:
        async for letter in deadletters.scan(manager, after=mark):
            per_table.setdefault(letter.table, []).append(letter)
    for table, letters in sorted(per_table.items()):
        sys.stderr.write(
            f"dead-lettered: {table}: {len(letters)} change(s); first: key {letters[0].key!r}: "
            f"{_short(letters[0].reason)}\n"
        )
    if per_table:
        sys.stderr.write(
            f"see them: cdc deadletter list -c {config.path}; fix the cause, then "
            f"cdc deadletter replay -c {config.path} (docs/DEADLETTERS.md)\n"
        )
        sys.stderr.flush()
    return DEAD_LETTERED if per_table else 0


async def doctor_findings(config: Config, manager: DataManager) -> list[Finding]:
    """A warning per table with entries in the dead letter, and one when it nears its cap."""
    counts = await deadletters.counts(manager)
    findings = [
        Finding(
            "warning",
            table,
            f"{count} change(s) in the dead letter: cdc deadletter list -c {config.path} --table {table}; "
            f"fix the cause, then cdc deadletter replay -c {config.path} --table {table}",
            {"dead_letters": count},
        )
        for table, count in sorted(counts.items())
    ]
    total = sum(counts.values())
    if total >= DEAD_LETTER_MAX_LEN * 0.9:
        findings.append(
            Finding(
                "warning",
                manager.layout.deadletter(),
                f"holds {total} entries; at {DEAD_LETTER_MAX_LEN} the oldest are trimmed as new ones arrive",
                {"dead_letters": total},
            )
        )
    return findings
