"""Secrets out of everything printed: one module, each name meaning one thing.

- ``url_for_display(url)``: a Redis URL as it may be shown, its password
  (userinfo or ``?password=``) replaced by ``***``;
- ``url_secrets(url)``: the forms a URL's password may take in a message;
- ``scrub(text, secrets)``: ``text`` with each of the given secrets replaced,
  for driver messages that may quote the password itself;
- ``scrub_url(text, url)``: ``scrub`` with the URL's secrets, the URL itself
  replaced by its display form first;
- ``mask_passwords(text)``: whatever *looks like* a password in free text (URL
  userinfo, ``?password=``, ODBC ``PWD=`` with ``{...}`` braces, libpq
  ``password=`` with quotes), for log lines whose secrets are not known.

It lives in ``publishers`` (which imports nothing from ``cdc``) so that the
Redis side and the daemon's logs share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

# scheme://user:password@ : the password may hold '/', '@', ';', '%' (the last
# '@' of the word ends it: a raw '@' in a password is taken as part of it), and
# a space when the word after it still ends in '@' (a DSN typed with one).
_URL_USERINFO = re.compile(r"(://[^:/@\s]*:)(?:\S|\s(?=\S*@))*@")
# ?password=... / &password=... in a URL's query.
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&#\s]*")
# PWD=... / password=... in an ODBC or libpq connection string: a {braced}
# value ('}}' escapes '}'), a 'quoted' value (backslash escapes), or a bare one.
_KEY_PASSWORD = re.compile(
    r"(?i)(?<![?&\w])((?:pwd|password)\s*=\s*)(\{(?:[^}]|\}\})*\}?|'(?:[^'\\]|\\.)*'?|[^;\s]*)"
)


def mask_passwords(text: str) -> str:
    """``text`` with every password-looking part replaced by ``***``."""
    text = _URL_USERINFO.sub(lambda m: f"{m[1]}{MASK}@", text)
    text = _QUERY_PASSWORD.sub(lambda m: f"{m[1]}{MASK}", text)
    return _KEY_PASSWORD.sub(lambda m: f"{m[1]}{MASK}", text)


def url_for_display(url: str) -> str:
    """``url`` with its password (userinfo or ``?password=``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, colon, _ = userinfo.partition(":")
            netloc = f"{user}:{MASK}@{hostport}" if colon else f"{userinfo}@{hostport}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, MASK if k.lower() == "password" else v) for k, v in pairs], safe="*")
        shown = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<unparsable Redis URL>"
    return mask_passwords(shown)  # a raw '/' in a password ends urlsplit's netloc early


def url_secrets(url: str) -> list[str]:
    """Every form the URL's password may take in a message (raw and quoted)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.password or ""]
    found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password"]
    if "@" in parts.netloc:
        found.append(parts.netloc.rpartition("@")[0].partition(":")[2])
    found += [m[0][m.end(1) - m.start(0) : -1] for m in _URL_USERINFO.finditer(url)]
    return [s for s in found if s]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***``
    (longest first, so that a secret inside another goes with it)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def scrub_url(text: str, url: str) -> str:
    """``text`` (e.g. a driver error) without the URL's password: the URL
    itself shown as ``url_for_display`` gives it, then every secret scrubbed."""
    return scrub(text.replace(url, url_for_display(url)), url_secrets(url))
