"""PostgreSQL connection strings: where one points, and its password kept out of messages.

Secrets are kept out by ``publishers.redaction``, the one module for it; this
module only knows where a libpq DSN keeps its password.
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from publishers import redaction
from publishers.redaction import mask_passwords


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for messages."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparseable DSN>"
    params.pop("password", None)
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def scrub(message: object, dsn: str) -> str:
    """A driver message with the DSN's password (should it appear) blanked out:
    the password itself where the DSN parses, and any password-looking part."""
    try:
        password = conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        password = None
    return mask_passwords(redaction.scrub(str(message).strip(), [str(password or "")]))
