"""PostgreSQL connection strings: where one points, what is wrong with one,
and its password kept out of messages.

Secrets are kept out by ``publishers.redaction``, the one module for it; this
module only knows how libpq reads a DSN, and so how it misreads one: libpq
ends a URL's userinfo at the first ``@`` or ``/``, so a password holding one
of them unencoded is cut short and its pieces are read as the host, the port
or the database, which libpq's own messages (and a DSN rebuilt from what it
read) would then show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from publishers import redaction
from publishers.redaction import PERCENT_ENCODE, Secrets, for_display, mask_passwords

_URL = re.compile(r"(?i)postgres(?:ql)?://")
_ANY_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
KEY_VALUE_QUOTING = (
    "in a key=value DSN a value holding a space, a quote or a backslash must be in single quotes, "
    "with ' and \\ written \\' and \\\\ (or use the URL form, its password percent-encoded)"
)


def password_secrets(dsn: str) -> list[str]:
    """Every form the DSN's password may take: found by syntax (the DSN need
    not parse), and as libpq reads it."""
    found = redaction.secrets_in(dsn)
    try:
        found.append(str(conninfo_to_dict(dsn).get("password") or ""))
    except psycopg.Error:
        pass
    return found


def dsn_problem(dsn: str) -> str | None:
    """What makes ``dsn`` unusable as libpq reads it, without quoting the
    password (it may be what is wrong), or None."""
    scheme = _ANY_SCHEME.match(dsn.lstrip())
    if scheme is not None and _URL.match(scheme[0]) is None:
        return (
            f"it starts with {scheme[0]}: a PostgreSQL DSN is a postgresql:// URL or a key=value string "
            "(are the source's DSN and the Redis URL swapped?)"
        )
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        how = PERCENT_ENCODE if scheme is not None else KEY_VALUE_QUOTING
        return f"it does not parse ({scrub(exc, dsn)}): {how}"
    if scheme is not None and _misread(dsn, params):
        return f"libpq would read the host, port or database out of the password: {PERCENT_ENCODE}"
    if scheme is not None and _trimmed(dsn, params):
        return f"libpq would drop the spaces around the password: {PERCENT_ENCODE}"
    return None


def _trimmed(dsn: str, params: Mapping[str, object]) -> bool:
    """libpq strips the blanks around a URL's unencoded password ("pw " is read
    "pw"): the server would then refuse a password the user never typed."""
    read = params.get("password")
    return read is not None and any(
        p != p.strip() and unquote(p.strip()) == read for p in redaction.userinfo_passwords(dsn)
    )


def _misread(dsn: str, params: Mapping[str, object]) -> bool:
    """libpq cut the URL's password at a '/' or '@': the port it read is not
    a number, or the host or database it read holds the rest (an '@')."""
    if not any(c in "/@" for password in redaction.userinfo_passwords(dsn) for c in password):
        return False
    port = str(params.get("port") or "")
    if any(not p.isdigit() for p in port.split(",") if p):
        return True
    return "@" in str(params.get("host") or "") or "@" in str(params.get("dbname") or "")


def redact_dsn(dsn: str) -> str:
    """Where the DSN points, for messages, never its password nor a piece of it."""
    secrets = Secrets(password_secrets(dsn))
    if dsn_problem(dsn) is not None:  # what libpq read is wrong: show what was written
        return secrets.scrub(for_display(dsn))
    params = conninfo_to_dict(dsn)
    params.pop("password", None)
    return secrets.scrub(make_conninfo(**{k: str(v) for k, v in params.items() if v is not None}))


def scrub(message: object, dsn: str) -> str:
    """A driver message with the DSN's password (should it appear, whole or in
    pieces) blanked out, and any password-looking part."""
    return mask_passwords(Secrets(password_secrets(dsn)).scrub(str(message).strip()))
