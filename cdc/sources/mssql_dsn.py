"""SQL Server connection strings: parsing, where one points, and its password kept out of messages.

Secrets are kept out by ``publishers.redaction``, the one module for it; this
module only knows where an ODBC connection string keeps its password.
"""

from __future__ import annotations

from publishers import redaction
from publishers.redaction import Secrets, mask_passwords


def parse_dsn(dsn: str) -> dict[str, str]:
    """An ODBC connection string as {UPPER-CASE KEY: value}; ``{...}`` values
    may hold ``;`` and ``}}`` (an escaped ``}``)."""
    out: dict[str, str] = {}
    i, n = 0, len(dsn)
    while i < n:
        while i < n and dsn[i] in "; \t\r\n":
            i += 1
        eq = dsn.find("=", i)
        if i >= n or eq < 0:
            break
        key = dsn[i:eq].strip().upper()
        i = eq + 1
        while i < n and dsn[i] in " \t":
            i += 1
        if i < n and dsn[i] == "{":
            value, i = _braced(dsn, i + 1)
        else:
            end = dsn.find(";", i)
            end = n if end < 0 else end
            value, i = dsn[i:end].strip(), end
        out[key] = value
    return out


def _braced(dsn: str, i: int) -> tuple[str, int]:
    chars: list[str] = []
    while i < len(dsn):
        if dsn[i] == "}":
            if dsn[i + 1 : i + 2] == "}":
                chars.append("}")
                i += 2
                continue
            return "".join(chars), i + 1
        chars.append(dsn[i])
        i += 1
    return "".join(chars), i


def describe_dsn(dsn: str) -> str:
    """Where a DSN points, for messages: server, port, database, driver, user; never the password."""
    fields = parse_dsn(dsn)
    shown = []
    for label, keys in (
        ("dsn", ("DSN",)),
        ("server", ("SERVER", "ADDRESS", "ADDR", "HOST", "SERVERNAME")),
        ("port", ("PORT",)),
        ("database", ("DATABASE", "INITIAL CATALOG")),
        ("driver", ("DRIVER",)),
        ("user", ("UID", "USER ID", "USER")),
    ):
        value = next((fields[k] for k in keys if fields.get(k)), None)
        if value:
            shown.append(f"{label}={value}")
    # A password holding an unbraced ';' spills into what follows it.
    return Secrets(password_secrets(dsn)).scrub(", ".join(shown)) or "the configured DSN"


def password_secrets(dsn: str) -> list[str]:
    """Every form the DSN's password may take: as the driver reads it, and as
    found by syntax (a ';' or '}' typed unescaped makes the two differ)."""
    fields = parse_dsn(dsn)
    return [*redaction.secrets_in(dsn), fields.get("PWD") or "", fields.get("PASSWORD") or ""]


def scrub(text: str, dsn: str) -> str:
    """``text`` without the DSN's password, however it appears: the value
    itself or a piece of it, and any ``PWD=``/``password=`` part (braced or bare)."""
    return mask_passwords(Secrets(password_secrets(dsn)).scrub(text))
