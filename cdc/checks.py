"""What ``cdc validate`` and ``cdc doctor`` say beyond each side's own findings:
the config file's secrets, the GRANTs to run, how a replica is refused, and
checkpoints that retention will expire."""

from __future__ import annotations

import datetime as dt

from cdc.config import Config
from cdc.errors import ConfigError
from cdc.sources.base import Finding
from publishers.manager import DataManager

# ``cdc validate`` with a replica as redis.url: 2, not 3. Redis answers, and the
# fix is the config's redis.url (the primary), as for a table that is not as
# the config says; 3 ("cannot connect") would read as "retry later" to a
# supervisor, and waiting fixes nothing (DESIGN.md §6's exit codes).
REPLICA_EXIT = 2


def secret_findings(config: Config) -> list[Finding]:
    """A warning per field holding a password written in the file (never the password)."""
    return [Finding("warning", s.field, s.warning(config.path)) for s in config.literal_secrets]


def grant_script(findings: list[Finding]) -> list[str]:
    """The findings' GRANTs, once each, as a script to run as the objects' owner."""
    grants = list(dict.fromkeys(str(f.extra["grant"]) for f in findings if f.extra.get("grant")))
    if not grants:
        return []
    head = "-- the GRANTs that give the sidecar's role what it lacks (run them as the objects' owner):"
    return [head, *(grant if grant.endswith(";") else grant + ";" for grant in grants)]


async def retention_findings(config: Config, manager: DataManager) -> list[Finding]:
    """A checkpoint older than the retention will expire: re-snapshot ahead."""
    if config.source.kind != "postgres":
        return []
    out = []
    now = dt.datetime.now(dt.UTC)
    for table in (table_config.table for table_config in config.tables):
        checkpoint = await manager.get_checkpoint(table)
        if checkpoint is None:
            out.append(Finding("warning", table, "no checkpoint yet: the first run will snapshot it"))
            continue
        try:
            age = (now - dt.datetime.fromisoformat(checkpoint.updated_at)).total_seconds()
        except ValueError as exc:
            raise ConfigError(f"{table}: unreadable checkpoint time {checkpoint.updated_at!r}") from exc
        if age > config.source.retention:
            out.append(Finding("error", table, f"checkpoint is {age:.0f}s old, beyond retention"))
        elif age > config.source.retention / 2:
            out.append(Finding("warning", table, f"checkpoint is {age:.0f}s old, over half the retention"))
    return out
