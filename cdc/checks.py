"""What ``cdc validate`` and ``cdc doctor`` say beyond each side's own findings:
the config file's secrets, the GRANTs to run, and how a replica is refused."""

from __future__ import annotations

from cdc.config import Config
from cdc.sources.base import Finding

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
