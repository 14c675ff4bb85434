"""PostgreSQL connection strings: where one points, and its password kept out of messages.

The redaction here (``redact_dsn``, ``scrub``) is the source side's own; it
is kept apart so that one redaction module can replace it in one place.
"""

from __future__ import annotations

import re

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for messages."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparseable DSN>"
    params.pop("password", None)
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


_PASSWORDS = re.compile(r"(://[^:/@\s]*:)[^@]*@|(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def scrub(message: object, dsn: str) -> str:
    """A driver message with the DSN's password (should it appear) blanked out:
    the password itself where the DSN parses, any password-looking part else."""
    text = str(message).strip()
    try:
        password = conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        return _PASSWORDS.sub(lambda m: f"{m[1]}***@" if m[1] else f"{m[2]}***", text)
    return text.replace(str(password), "***") if password else text
