"""Secrets out of everything printed: one module, each name meaning one thing.

A password must not reach a message even when the value that holds it does
not parse: a ``/`` or ``@`` typed unencoded in a URL's password makes the
drivers misread it, and they then quote its pieces as a port, a host or a
database ("invalid port 'ab'"). So secrets are found by syntax alone, and
generously (a few characters too many are masked rather than one too few):

- ``secrets_in(value)``: every password a configured value (a DSN, a Redis
  URL, in any syntax, or a list or mapping of them) may hold: the userinfo
  of ``scheme://user:password@host`` up to the LAST ``@``, ``?password=``,
  ``password=`` / ``PWD=`` (bare, ``'quoted'``, ``{braced}``);
- ``Secrets``: such passwords ready to be scrubbed out of a text: each one in
  every form a message may give it (percent-encoded or decoded, JSON- or
  repr-escaped...), every piece of it of ``MIN_PIECE`` characters or more,
  and every quoted token that is part of it;
- ``scrub(text, secrets)``: ``text`` scrubbed of ``secrets``;
- ``mask_passwords(text)``: whatever *looks like* a password in free text,
  for texts whose secrets are not known;
- ``remember(*values)`` / ``redact(text)``: the process's known secrets (the
  command line remembers its config's), and a text scrubbed of them and of
  password-looking parts: for logs and everything the command line prints;
- ``for_display(value)``: a connection string as it may be shown;
- ``url_secrets(url)``, ``scrub_url(text, url)``, ``url_problem(url)``: a
  Redis URL's passwords, a driver message without them, what makes it
  unusable (said without quoting it);
- ``config_secrets(text, environ)``: the secrets a config file may hold.

It lives in ``publishers`` (which imports nothing from ``cdc``) so that the
Redis side, the sources and the daemon's logs share it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit

MASK = "***"
# Pieces of a secret this long or longer are masked wherever they appear;
# shorter ones only as a whole word or a quoted token (else every "a" goes).
MIN_PIECE = 4

# Advice for a password that a URL parser cuts short (never naming which
# character it holds: that too would tell something about the password).
PERCENT_ENCODE = (
    "a password in a URL must be percent-encoded (/ as %2F, @ as %40, ? as %3F, # as %23, "
    "% as %25, a space as %20; e.g. urllib.parse.quote(password, safe=''))"
)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# scheme://user:password@ in free text: the password may hold '/', '@', ';',
# '%' (the last '@' of the word ends it), and a space when the word after it
# still ends in '@' (a DSN typed with one).
_URL_USERINFO = re.compile(r"(://[^:/@\s]*:)(?:\S|\s(?=\S*@))*@")
# ?password=... / &password=... in a URL's query ('#' included: it is no
# fragment marker inside a password).
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)([^&\s]*)")
# PWD=... / password=... in an ODBC or libpq connection string: a {braced}
# value ('}}' escapes '}'), a 'quoted' value (backslash escapes), or a bare one.
_KEY_PASSWORD = re.compile(
    r"(?i)(?<![?&\w])((?:pwd|passwd|password)\s*=\s*)(\{(?:[^}]|\}\})*\}?|'(?:[^'\\]|\\.)*'?|[^;\s]*)"
)
# 'password': '...' in a dict's repr or a JSON object (the key quoted: free
# text saying "password: " is left alone).
_REPR_PASSWORD = re.compile(r"""(?i)(['"](?:passwd|password|pwd)['"]\s*:\s*)(['"])(?:(?!\2)[^\\]|\\.)*(\2)""")
_KEY = re.compile(r"(?i)(?<![?&\w])(?:pwd|passwd|password)\s*=\s*")
# Where a value typed with a ';' or a space in it most likely ends: at the
# next key of an ODBC string (';Key Name=') or of a libpq one (' key=').
_NEXT_KEYS = (re.compile(r";\s*[A-Za-z][\w ]*="), re.compile(r"\s+[A-Za-z_]\w*\s*="))
# password: ... in a YAML or JSON mapping, or a Python dict's repr: a quoted
# value, or a bare one up to the next ',' or '}' (a flow mapping's end).
_MAPPING_PASSWORD = re.compile(
    r"""(?i)\b(?:pass|passwd|password|pwd|secret|token)['"]?\s*:\s+('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^,}\s][^,}]*)"""
)
# A query's password as it was probably meant: up to the next '&'.
_QUERY_VALUE = re.compile(r"(?i)[?&]password=([^&]*)")
# A mapping key or a variable name that says its value is a secret (but the
# variables PWD and OLDPWD: the working directories).
_SECRET_NAME = re.compile(r"(?i)(?:pass|passwd|password|pwd|secret|token)$")
_QUOTED = re.compile(r"\"([^\"\n]{1,200})\"|'([^'\n]{1,200})'")


# -- finding the secrets of a configured value ------------------------------------


def secrets_in(value: object) -> list[str]:
    """Every password ``value`` may hold, found by syntax (it need not parse):
    a string in any of the syntaxes above, or a list or mapping of them (a
    mapping's ``password``/``pwd``/``secret``... entries are secrets whole)."""
    found: list[str] = []
    if isinstance(value, str):
        found += userinfo_passwords(value)
        found += [m[2] for m in _QUERY_PASSWORD.finditer(value)]
        found += [m[1] for m in _QUERY_VALUE.finditer(value)]
        found += _key_passwords(value)
        found += [m[1].strip() for m in _MAPPING_PASSWORD.finditer(value)]
        found += [m[1][1:-1] for m in _MAPPING_PASSWORD.finditer(value) if m[1][:1] in "'\""]
    elif isinstance(value, Mapping):
        for key, item in value.items():
            found += _scalars(item) if _SECRET_NAME.search(str(key)) else secrets_in(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            found += secrets_in(item)
    return [s for s in dict.fromkeys(found) if s]


def _scalars(value: object) -> list[str]:
    if isinstance(value, Mapping):
        return [s for item in value.values() for s in _scalars(item)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [s for item in value for s in _scalars(item)]
    return [] if value is None else [str(value)]


def userinfo_passwords(text: str) -> list[str]:
    """The password of each ``scheme://user:password@``: everything between the
    user's ':' and the LAST '@' (drivers split at the first '/', '?', '#' or
    '@', so that is where a password typed unencoded really ends)."""
    found = []
    for match in _SCHEME.finditer(text):
        rest = text[match.end() :]
        at = rest.rfind("@")
        if at > 0:
            _, colon, password = rest[:at].partition(":")
            if colon:
                found.append(password)
    return found


def _key_passwords(text: str) -> list[str]:
    """The value of each ``password=``/``PWD=``, as the driver reads it and as
    it was probably meant (up to the next key) when it holds a ';' or a space."""
    found = []
    for match in _KEY.finditer(text):
        strict = _KEY_PASSWORD.match(text, match.start())
        if strict is not None:
            found.append(strict[2])
            found.append(strict[2][1:-1] if strict[2][:1] in "{'" else strict[2])
        rest = text[match.end() :]
        ends = [m.start() for m in (key.search(rest) for key in _NEXT_KEYS) if m is not None]
        for value in [rest[:end] for end in ends] or [rest]:
            found += [value, value[1:].rstrip("}' ;") if value[:1] in "{'" else value]
    return found


def url_secrets(url: str) -> list[str]:
    """Every password ``url`` may hold (``secrets_in`` of one URL)."""
    return secrets_in(url)


# -- scrubbing them out of a text ----------------------------------------------------


def _forms(secret: str) -> set[str]:
    """The ways a message may give ``secret``: as configured, decoded (percent,
    '}}', backslash and JSON escapes), and each of those encoded or escaped again."""
    bases = {
        secret,
        unquote(secret),
        unquote_plus(secret),
        secret.replace("}}", "}"),
        re.sub(r"\\(.)", r"\1", secret),
        _json_unescaped(secret),
    }
    forms: set[str] = set()
    for base in bases:
        forms |= {
            base,
            quote(base, safe=""),
            quote(base),
            quote_plus(base),
            base.replace("}", "}}"),
            json.dumps(base)[1:-1],
            json.dumps(base, ensure_ascii=False)[1:-1],
            repr(base)[1:-1],
            str(base.encode("utf-8", "surrogatepass"))[2:-1],
        }
    return {form for form in forms if form}


def _json_unescaped(text: str) -> str:
    """``text`` as a JSON (or YAML double-quoted) string's content means it:
    ``\\u00e9`` is ``é``."""
    try:
        value = json.loads(f'"{text}"')
    except ValueError:
        return text
    return value if isinstance(value, str) else text


class Secrets:
    """Passwords, ready to be scrubbed out of texts (``scrub``). Secrets may be
    added while other threads scrub: the state is swapped whole."""

    def __init__(self, secrets: Iterable[str] = (), public: Iterable[str] = ()) -> None:
        self._state = _State.of(frozenset(), frozenset())
        self._lock = threading.Lock()
        self.add(secrets)
        self.add_public(public)

    def __bool__(self) -> bool:
        return bool(self._state.forms)

    def add(self, secrets: Iterable[str]) -> None:
        forms = {form for secret in secrets if secret for form in _forms(secret)}
        with self._lock:
            if not forms <= self._state.forms:
                self._state = _State.of(self._state.forms | forms, self._state.words)

    def add_public(self, words: Iterable[str]) -> None:
        """Names every reader may see (a table, its schema, the role the DSN
        names): shown, as whole words, even where they match a piece of a
        secret ("weak" in the password "weakpw"); masking them would say that
        the password holds them. Not a piece a parser cuts a secret into
        (``_segments``: a driver may quote that), nor one holding a secret."""
        added = frozenset(w for w in words if w)
        with self._lock:
            if not added <= self._state.words:
                self._state = _State.of(self._state.forms, self._state.words | added)

    def scrub(self, text: str) -> str:
        """``text`` with each secret, every piece of one of ``MIN_PIECE``
        characters or more, and every quoted token that is a piece a parser
        may cut one into (``_segments``), replaced by ``***``."""
        state = self._state
        if not state.forms or not text:
            return text
        masked = bytearray(len(text))
        pieces, width = state.pieces, MIN_PIECE
        for i in range(len(text) - width + 1):
            if text[i : i + width] in pieces:
                masked[i : i + width] = b"\1" * width
        for match in _QUOTED.finditer(text):
            start, end = match.span(1) if match[1] is not None else match.span(2)
            if text[start:end] in state.segments:
                masked[start:end] = b"\1" * (end - start)
        if state.short is not None:
            for match in state.short.finditer(text):
                masked[match.start() : match.end()] = b"\1" * (match.end() - match.start())
        if state.public is not None:
            for match in state.public.finditer(text):
                start, end = match.span()
                # a mask that runs on past the name is a secret there, the name a piece of it
                if not (start and masked[start - 1]) and not (end < len(text) and masked[end]):
                    masked[start:end] = bytes(end - start)
        return _apply(text, masked)


@dataclass(frozen=True)
class _State:
    forms: frozenset[str]
    pieces: frozenset[str]  # every MIN_PIECE characters of every form
    segments: frozenset[str]  # every piece of a form between delimiters (_segments)
    short: re.Pattern[str] | None  # a form shorter than MIN_PIECE, as a word of its own
    words: frozenset[str]  # public names (Secrets.add_public)
    public: re.Pattern[str] | None  # those that may be shown, as words of their own

    @classmethod
    def of(cls, forms: frozenset[str], words: frozenset[str]) -> _State:
        pieces = frozenset(f[i : i + MIN_PIECE] for f in forms for i in range(len(f) - MIN_PIECE + 1))
        short = sorted((f for f in forms if len(f) < MIN_PIECE), key=len, reverse=True)
        segments = frozenset(s for f in forms for s in _segments(f))
        shown = sorted(
            (w for w in words if w not in segments and not any(f in w for f in forms)), key=len, reverse=True
        )
        return cls(
            forms=forms,
            pieces=pieces,
            segments=segments,
            short=re.compile(rf"(?<!\w)(?:{'|'.join(map(re.escape, short))})(?!\w)") if short else None,
            words=words,
            public=re.compile(rf"(?<!\w)(?:{'|'.join(map(re.escape, shown))})(?!\w)") if shown else None,
        )


# Where a driver that misreads a connection string cuts a password typed in it
# unencoded, and then quotes the pieces ("invalid port 'ab'"): URL delimiters,
# an IPv6 host's brackets, ODBC's braces, key=value's quotes, escapes and any
# whitespace (libpq cuts key=value at a tab or a newline too).
_DELIMITERS = re.compile(r"[/@:?#;&=,\[\]{}'\"\\\s]")


def _segments(form: str) -> set[str]:
    """Every run of whole pieces of ``form`` between delimiters ("ab", "cd",
    "ab/cd" of "ab/cd"): the quoted tokens that are masked whatever their
    length. Not any substring: a quoted "4" is not part of "rt%2Fpa%40ss"
    as a parser cuts it, and a data key '4' must stay readable."""
    cuts = [0, *(m.start() for m in _DELIMITERS.finditer(form)), len(form)]
    starts, ends = [0, *(c + 1 for c in cuts[1:-1])], cuts[1:]
    return {form[a:b] for a in starts for b in ends if b > a}


def _apply(text: str, masked: bytearray) -> str:
    """``text`` with each run of masked characters replaced by ``MASK``."""
    if not any(masked):
        return text
    # A mask already in the text, and blanks between two masks, join their
    # neighbours: "password=*** ***" would tell that the password holds a space.
    for match in re.finditer(re.escape(MASK), text):
        masked[match.start() : match.end()] = b"\1" * len(MASK)
    for gap in re.finditer(rb"(?<=\x01)\x00+(?=\x01)", bytes(masked)):
        if text[gap.start() : gap.end()].isspace():
            masked[gap.start() : gap.end()] = b"\1" * (gap.end() - gap.start())
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if masked[i]:
            while i < n and masked[i]:
                i += 1
            out.append(MASK)
        else:
            j = masked.find(1, i)
            j = n if j < 0 else j
            out.append(text[i:j])
            i = j
    return "".join(out)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` scrubbed of ``secrets`` (see ``Secrets.scrub``)."""
    return Secrets(secrets).scrub(text)


def mask_passwords(text: str) -> str:
    """``text`` with every password-looking part replaced by ``***``."""
    text = _URL_USERINFO.sub(lambda m: f"{m[1]}{MASK}@", text)
    text = _QUERY_PASSWORD.sub(lambda m: f"{m[1]}{MASK}", text)
    text = _REPR_PASSWORD.sub(lambda m: f"{m[1]}{m[2]}{MASK}{m[3]}", text)
    return _KEY_PASSWORD.sub(lambda m: f"{m[1]}{MASK}", text)


# -- the process's known secrets -----------------------------------------------------

_KNOWN = Secrets()


def remember(*values: object) -> None:
    """Scrub the secrets of ``values`` (``secrets_in``) out of everything
    ``redact`` is given from now on."""
    remember_secrets(s for value in values for s in secrets_in(value))


def remember_public(words: Iterable[str]) -> None:
    """Names ``redact`` shows even where they match a piece of a secret (``Secrets.add_public``)."""
    _KNOWN.add_public(words)


def remember_secrets(secrets: Iterable[str]) -> None:
    """Scrub ``secrets`` out of everything ``redact`` is given from now on."""
    _KNOWN.add(secrets)


def remember_environment(environ: Mapping[str, str]) -> None:
    """Remember the secrets of the environment: those of every value (a DSN
    or URL in CDC_SOURCE_DSN, a proxy URL...), and whole the values of the
    variables named like a password (PGPASSWORD, ...)."""
    for name, value in environ.items():
        remember(value)
        if _secret_variable(name, value):
            remember_secrets([value])


def _secret_variable(name: str, value: str) -> bool:
    """A variable named like a password, whose value looks like one (not a
    flag such as 1 or false, which would mask every "1" printed)."""
    if name.upper() in ("PWD", "OLDPWD") or not _SECRET_NAME.search(name):
        return False
    return len(value) >= MIN_PIECE + 2 and value.lower() not in ("false", "true", "enabled", "disabled")


def redact(text: str) -> str:
    """``text`` without the known secrets nor anything that looks like a password."""
    return mask_passwords(_KNOWN.scrub(text))


# -- Redis URLs --------------------------------------------------------------------------


def _mask_userinfo(url: str) -> str:
    """``url`` with its userinfo's password (up to the last '@') replaced."""
    match = _SCHEME.search(url)
    if match is None:
        return url
    rest = url[match.end() :]
    at = rest.rfind("@")
    user, colon, _ = rest[: max(at, 0)].partition(":")
    if at <= 0 or not colon:
        return url
    return f"{url[: match.end()]}{user}:{MASK}@{rest[at + 1 :]}"


def for_display(value: str) -> str:
    """A connection string (URL or DSN of any syntax) with its passwords
    replaced by ``***``, never re-encoded or re-parsed (a misread URL would
    show their pieces as a host or a port)."""
    return mask_passwords(scrub(_mask_userinfo(value), secrets_in(value)))


def scrub_url(text: str, url: str) -> str:
    """``text`` (e.g. a driver error) without the URL's passwords: the URL
    itself shown as ``for_display`` gives it, then every secret scrubbed."""
    return scrub(text.replace(url, for_display(url)), secrets_in(url))


def url_problem(url: str) -> str | None:
    """What makes ``url`` unusable as a Redis URL, saying none of it (the
    password may be what is wrong), or None."""
    scheme = _SCHEME.match(url)
    if scheme is None or scheme[0].lower() not in ("redis://", "rediss://", "unix://"):
        given = f" (it starts with {scheme[0]})" if scheme is not None else ""
        return f"a Redis URL starts with redis://, rediss:// (TLS) or unix://{given}"
    if _cut_short(url):
        return PERCENT_ENCODE
    try:
        urlsplit(url).port  # noqa: B018 - parsed for its refusal only
    except ValueError:
        return "its port is not a number"
    return None


def _cut_short(url: str) -> bool:
    """A '/', '?' or '#' in the userinfo's password ends the URL's authority
    early (Python's and redis-py's parser), so the host, port or path is
    read from the password. A '@' in the query alone is no such case."""
    if not any(c in "/?#" for password in userinfo_passwords(url) for c in password):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed for its refusal only
    except ValueError:
        return True
    return "@" in parts.path or not parts.hostname


MAX_SCANNED_LINE = 8192  # characters


def config_secrets(text: str, environ: Mapping[str, str]) -> list[str]:
    """The secrets a config file may hold: those of each line of its ``text``
    and those of the environment variables it names with ``${VAR}`` (whole
    when the name says password, secret or token). What the config loader
    scrubs out of its messages."""
    # (a comment's "password: ..." is prose, not a value; a line longer than
    # MAX_SCANNED_LINE is no DSN or URL, and the scan's regexes are quadratic in
    # a line's length: a 50 MB value took minutes. The loader cuts such a value
    # to a few dozen characters in its messages anyway.)
    lines = (
        line
        for line in text.splitlines()
        if len(line) <= MAX_SCANNED_LINE and not line.lstrip().startswith("#")
    )
    found = [s for line in lines for s in secrets_in(line)]
    for name in dict.fromkeys(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text)):
        value = environ.get(name, "")
        found += secrets_in(value)
        if _secret_variable(name, value):
            found.append(value)
    return found
