"""No password in any output, whatever it holds and whatever goes wrong (issue 13).

Passwords are drawn with every character that URL and connection-string
parsers treat specially (/ @ # ? % : ; space, quotes, braces, backslash) and
non-ASCII ones, typed as they are (the drivers then misread the URL and quote
its pieces as a host or a port) or percent-encoded / quoted as they should be.
They go through the command line (each command, against a closed port, a
server refusing the password, and servers accepting it) and through the
Python entry points (a source's connect, ``DataManager.connect``, the log
formatters). No output holds the password or a piece of it of 4 characters
or more, and the exit code is DESIGN.md §6's: 2 for a DSN or URL that cannot
be read as it was meant, 3 for a server that cannot be reached or refuses
the login, 0 when everything answers.

Every 4 characters of a drawn password hold one that no message of ours
holds (Q X Z J or a non-ASCII one): a piece of it found in an output is the
password's, never a word that happens to match.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cdc.config import SourceConfig, parse_config
from cdc.config_addresses import check_redis_url
from cdc.devservers import PostgresServer, RedisServer, ServerUnavailable, free_port
from cdc.errors import CdcError
from cdc.logs import JsonFormatter, RedactedStream, TextFormatter
from cdc.sources import make_source
from cdc.sources.pg_dsn import dsn_problem, redact_dsn
from publishers import redaction
from publishers.manager import DataManager
from publishers.settings import RedisConfig
from tests.conftest import unavailable
from tests.e2e import enable_tracking

RARE = "QXZJéßüΩ漢€"
SPECIAL = "/@#?%:; '\"{}\\0123456789"
# A rare character, then up to two others: every 4 characters hold a rare one.
passwords = (
    st.lists(st.tuples(st.sampled_from(RARE), st.text(SPECIAL, max_size=2)), min_size=2, max_size=8)
    .map(lambda chunks: "".join(rare + rest for rare, rest in chunks))
    .filter(lambda password: len(password) >= 4)
)
# The issue's own: a '/' and an '@' unencoded, a '#', a '?', a space.
ISSUE_PASSWORD = "Q/Z@J#X?Q%Z:J;X é"
RIGHT_PASSWORD = "Right-pw-1"  # what the servers that check passwords accept from user app


def pieces(password: str) -> set[str]:
    """The password and each piece of it of 4 characters or more, as typed,
    percent-encoded and JSON-escaped."""
    raw = {password[i:j] for i in range(len(password)) for j in range(i + 4, len(password) + 1)}
    return {
        form
        for piece in raw
        for form in (piece, quote(piece, safe=""), json.dumps(piece, ensure_ascii=False)[1:-1])
    }


def assert_no_leak(output: str, password: str) -> None:
    found = sorted((p for p in pieces(password) if p in output), key=len, reverse=True)
    assert not found, f"the output holds {found[:3]} of the password {password!r}:\n{output}"


def libpq_misreads(password: str) -> bool:
    """A password typed unencoded in a URL that libpq cannot read as meant: it
    ends the userinfo at a '/' or '@', refuses a space or a bad '%' escape."""
    return any(c in password for c in "/@ ") or re.search(r"%(?![0-9A-Fa-f]{2})", password) is not None


def pg_url(password: str, host_port: str, *, encoded: bool, user: str = "app", database: str = "cdc") -> str:
    shown = quote(password, safe="") if encoded else password
    return f"postgresql://{user}:{shown}@{host_port}/{database}"


def pg_key_value(password: str, host_port: str, *, quoted: bool) -> str:
    host, port = host_port.split(":")
    if quoted:
        password = "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return f"host={host} port={port} user=app dbname=cdc password={password}"


def _loader_refuses(url: str) -> bool:
    try:
        check_redis_url(url, cluster=False)
    except ValueError:
        return True
    return False


def redis_at(password: str, host_port: str, *, encoded: bool, user: str = "app") -> str:
    shown = quote(password, safe="") if encoded else password
    return f"redis://{user}:{shown}@{host_port}/0"


# -- servers that check passwords -------------------------------------------------------


@pytest.fixture(scope="module")
def checking_postgres() -> Iterator[str]:
    """host:port of a PostgreSQL of its own that checks passwords (the session
    one trusts everyone): user app, password RIGHT_PASSWORD."""
    hba_dir = Path(tempfile.mkdtemp(prefix="cdc-hba-"))
    hba_dir.chmod(0o755)  # read by the server's own user
    hba = hba_dir / "pg_hba.conf"
    hba.write_text(
        "local all all trust\nhost all cdc 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
    )
    hba.chmod(0o644)
    server = PostgresServer(settings=(f"hba_file={hba}",))
    try:
        server.start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f"create role app login password '{RIGHT_PASSWORD}'")
        yield f"127.0.0.1:{server.port}"
    finally:
        server.cleanup()
        shutil.rmtree(hba_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def checking_redis() -> Iterator[RedisServer]:
    """A Redis whose user app has the password RIGHT_PASSWORD (the default
    user, without one, sets up more users)."""
    acl = ("--user", "app", "on", f">{RIGHT_PASSWORD}", "~*", "&*", "+@all")
    try:
        server = RedisServer(extra=acl).start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
    yield server
    server.cleanup()


def closed_port() -> str:
    return f"127.0.0.1:{free_port()}"


# -- the Python entry points ----------------------------------------------------------------

PG_FORMS = ["url", "url-encoded", "key-value", "key-value-quoted", "redis-url", "http-url"]


def pg_dsn(form: str, password: str, host_port: str) -> tuple[str, set[int]]:
    """A DSN of ``form`` holding ``password``, and the exit codes it may give."""
    if form == "url":
        return pg_url(password, host_port, encoded=False), {2} if libpq_misreads(password) else {3}
    if form == "url-encoded":
        return pg_url(password, host_port, encoded=True), {3}
    if form == "key-value":  # unquoted: a space or a quote makes it unreadable
        return pg_key_value(password, host_port, quoted=False), {2, 3}
    if form == "key-value-quoted":
        return pg_key_value(password, host_port, quoted=True), {3}
    if form == "redis-url":  # CDC_SOURCE_DSN and CDC_REDIS_URL swapped
        return redis_at(password, host_port, encoded=True), {2}
    return f"http://app:{quote(password, safe='')}@{host_port}/cdc", {2}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=passwords, form=st.sampled_from(PG_FORMS), refusing=st.booleans())
@example(password=ISSUE_PASSWORD, form="url", refusing=True)
@example(password=ISSUE_PASSWORD, form="url", refusing=False)
@example(password="QQ0 ", form="url", refusing=False)  # libpq drops a blank at either end: exit 2, never 3
async def test_postgres_connect_errors_never_hold_the_password(
    checking_postgres: str, password: str, form: str, refusing: bool
) -> None:
    dsn, codes = pg_dsn(form, password, checking_postgres if refusing else closed_port())
    source = make_source(SourceConfig(kind="postgres", dsn=dsn, connect_timeout=5))
    try:
        with pytest.raises(CdcError) as raised:
            await source.connect()
    finally:
        await source.close()
    assert_no_leak(str(raised.value), password)
    assert raised.value.exit_code in codes, str(raised.value)
    if refusing and codes == {3}:
        assert 'password authentication failed for user "app"' in str(raised.value)


REDIS_FORMS = ["url", "url-encoded", "query", "tls", "unix", "postgres-dsn", "http-url"]


def redis_settings(form: str, password: str, host_port: str) -> str:
    encoded = quote(password, safe="")
    if form in ("url", "url-encoded"):
        return redis_at(password, host_port, encoded=form == "url-encoded")
    if form == "query":
        return f"redis://{host_port}/0?username=app&password={encoded}"
    if form == "tls":
        return f"rediss://app:{password}@{host_port}/0"
    if form == "unix":
        return f"unix://app:{password}@/nonexistent/redis.sock?db=0"
    if form == "postgres-dsn":  # CDC_REDIS_URL and CDC_SOURCE_DSN swapped
        return pg_url(password, host_port, encoded=False)
    return f"http://app:{encoded}@{host_port}/0"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=passwords, form=st.sampled_from(REDIS_FORMS), refusing=st.booleans(), cluster=st.booleans())
@example(password=ISSUE_PASSWORD, form="url", refusing=True, cluster=False)
@example(password=ISSUE_PASSWORD, form="unix", refusing=False, cluster=False)
async def test_redis_connect_errors_never_hold_the_password(
    checking_redis: RedisServer, password: str, form: str, refusing: bool, cluster: bool
) -> None:
    # (a TLS handshake with a server that speaks plain RESP waits out the connect timeout)
    host_port = f"127.0.0.1:{checking_redis.port}" if refusing and form != "tls" else closed_port()
    url = redis_settings(form, password, host_port)
    with pytest.raises(CdcError) as raised:
        manager = await DataManager.connect(RedisConfig(url=url, cluster=cluster))
        await manager.close()
    assert_no_leak(str(raised.value), password)
    assert raised.value.exit_code == 3, str(raised.value)


@pytest.mark.skipif(
    "FreeTDS" not in __import__("pyodbc").drivers(), reason="the FreeTDS ODBC driver is not installed"
)
@settings(max_examples=10, deadline=None)
@given(password=passwords, braced=st.booleans())
@example(password=ISSUE_PASSWORD, braced=False)
async def test_sqlserver_connect_errors_never_hold_the_password(password: str, braced: bool) -> None:
    pwd = "{" + password.replace("}", "}}") + "}" if braced else password
    host, port = closed_port().split(":")
    dsn = f"DRIVER={{FreeTDS}};SERVER={host};PORT={port};UID=sa;PWD={pwd};TDS_Version=7.4"
    source = make_source(SourceConfig(kind="mssql", dsn=dsn, connect_timeout=1))
    try:
        with pytest.raises(CdcError) as raised:
            await source.connect()
    finally:
        await source.close()
    assert_no_leak(str(raised.value), password)
    assert raised.value.exit_code == 3, str(raised.value)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=passwords, encoded=st.booleans())
@example(password=ISSUE_PASSWORD, encoded=False)
@example(password="Q\\\\Q0", encoded=False)  # a 3-character tail whose JSON escape is 4 characters of it
def test_log_lines_never_hold_a_remembered_password(
    monkeypatch: pytest.MonkeyPatch, password: str, encoded: bool
) -> None:
    """What the command line remembers (its config's DSN and URL) is scrubbed
    out of every log line: the message, its fields, its traceback, even where
    a driver quoted only a piece of the password."""
    monkeypatch.setattr(redaction, "_KNOWN", redaction.Secrets())
    dsn = pg_url(password, "127.0.0.1:5432", encoded=encoded)
    redaction.remember(dsn)
    half = password[len(password) // 2 :]
    try:
        raise ValueError(f"invalid port '{password[:2]}' in {dsn}; rest {half}")
    except ValueError as exc:
        record = logging.LogRecord(
            "cdc.t", logging.ERROR, "f", 1, "failed %s", (dsn,), (ValueError, exc, None)
        )
    record.error = f"connect {password} refused"
    for formatter in (JsonFormatter(), TextFormatter()):
        assert_no_leak(shown(formatter.format(record), formatter), password)


def shown(line: str, formatter: logging.Formatter) -> str:
    """What a reader of the line sees: a JSON line's values decoded (its raw
    text escapes a short piece of the password into a longer one: the tail
    "\\Q0" of "Q\\\\Q0" is written "\\\\Q0", four of the password's characters
    that the line does not hold)."""
    if not isinstance(formatter, JsonFormatter):
        return line
    return "\n".join(str(value) for value in json.loads(line).values())


@pytest.mark.parametrize(
    ("dsn", "password", "problem"),
    [
        ("postgresql://u:Qb/cZ@eX@h:5432/db", "Qb/cZ@eX", "percent-encoded"),  # read as host u, port Qb
        (
            "postgresql://u:91/QZ@h:5432/db",
            "91/QZ",
            "percent-encoded",
        ),  # a port that parses, the rest in dbname
        ("postgresql://u:Q@Z@h/db", "Q@Z", "percent-encoded"),  # read as host Z@h
        ("postgresql://u:Q Z@h/db", "Q Z", "percent-encoded"),  # libpq refuses the space
        ("postgresql://u:Q%ZZ@h/db", "Q%ZZ", "percent-encoded"),  # and a '%' that escapes nothing
        ("host=h password=QZ XJ dbname=d", "QZ XJ", "single quotes"),
        ("redis://u:QZXJ@h/0", "QZXJ", "swapped"),
        ("postgresql://u:Q%2FZ%40X@h/db", "Q/Z@X", None),
        ("host=h password='QZ XJ' dbname=d", "QZ XJ", None),
        ("postgresql://u:QZXJ@h/db?sslrootcert=/x@y", "QZXJ", None),  # a '@' in the query is no password's
        ("postgresql://u@h/my@db", "", None),
    ],
)
def test_a_dsn_libpq_misreads_is_named_with_its_fix(dsn: str, password: str, problem: str | None) -> None:
    """Named without quoting the password, nor any piece of it (even the 2
    characters libpq read as a port)."""
    found = dsn_problem(dsn)
    assert (found is None) == (problem is None), found
    if problem is not None:
        assert found is not None and problem in found
    for shown in (found or "", redact_dsn(dsn)):
        for piece in {password[i : i + 2] for i in range(len(password) - 1)}:
            assert piece not in shown, shown


def test_output_streams_pass_on_whole_lines_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret written in two pieces (click, rich and print write a line in
    several calls) is still found: a line is held until it ends or is flushed."""
    monkeypatch.setattr(redaction, "_KNOWN", redaction.Secrets())
    redaction.remember("redis://:QSplit/Z-9@h/0")
    out = io.StringIO()
    stream = RedactedStream(out)
    stream.write("error: QSplit/")
    assert out.getvalue() == ""
    stream.write("Z-9 refused\nnext QSplit")
    assert out.getvalue() == "error: *** refused\n"
    stream.flush()
    assert out.getvalue() == "error: *** refused\nnext ***"
    with pytest.raises(TypeError):  # what click probes a binary stream with
        stream.write(b"")  # type: ignore[arg-type]


# -- the command line --------------------------------------------------------------------

CONFIG = """\
source:
  kind: postgres
  dsn: ${{CDC_SOURCE_DSN}}
  tracking_schema: {schema}_trk
  connect_timeout: 5s
redis:
  url: ${{CDC_REDIS_URL}}
  namespace: {namespace}
worker:
  health: null
tables:
  - table: {schema}.items
"""


@pytest.fixture(scope="module")
async def tracked_schema(postgres_dsn: str) -> Any:
    """A schema with one tracked table of one row, for the whole module."""
    schema = "sec" + uuid.uuid4().hex[:8]
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f"create schema {schema}")
        await conn.execute(f"create table {schema}.items (id int primary key, v text)")
        await conn.execute(f"insert into {schema}.items values (1, 'a')")
    config = parse_config(
        CONFIG.format(schema=schema, namespace="x"),
        "<test>",
        {"CDC_SOURCE_DSN": postgres_dsn, "CDC_REDIS_URL": "redis://h"},
    )
    await enable_tracking(config)
    yield schema
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f"drop schema {schema} cascade")
        await conn.execute(f"drop schema if exists {schema}_trk cascade")


COMMANDS = {
    "validate": ["validate"],
    "run --once": ["run", "--once"],
    "doctor": ["doctor"],
    "status": ["status"],
    "tracking status": ["tracking", "status"],
}
SCENARIOS = ["source closed", "source refuses", "redis closed", "redis refuses", "both accept"]


def cdc(
    args: list[str], config: Path, env: dict[str, str], json_logs: bool
) -> subprocess.CompletedProcess[str]:
    logs = "--json-logs" if json_logs else "--text-logs"
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", logs, *args, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def with_password(dsn: str, password: str) -> str:
    """The session's DSN (a server that trusts everyone) with a password in it."""
    return dsn.replace("://cdc@", f"://cdc:{quote(password, safe='')}@", 1)


def _everything_answers(command: str) -> example:
    return example(
        password=ISSUE_PASSWORD, command=command, scenario="both accept", encoded=True, json_logs=True
    )


# Subprocesses are slow: a few drawn cases, and each command once on the path
# where everything answers (its whole output: ok lines, findings, the status
# table, a run's logs), once on a URL that the drivers misread.
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    password=passwords,
    command=st.sampled_from(list(COMMANDS)),
    scenario=st.sampled_from(SCENARIOS),
    encoded=st.booleans(),
    json_logs=st.booleans(),
)
@_everything_answers("validate")
@_everything_answers("run --once")
@_everything_answers("doctor")
@_everything_answers("status")
@_everything_answers("tracking status")
@example(
    password=ISSUE_PASSWORD, command="validate", scenario="source refuses", encoded=False, json_logs=False
)
@example(password=ISSUE_PASSWORD, command="status", scenario="redis refuses", encoded=False, json_logs=False)
async def test_commands_never_print_the_password(
    postgres_dsn: str,
    redis_url: str,
    checking_postgres: str,
    checking_redis: RedisServer,
    tracked_schema: str,
    tmp_path_factory: pytest.TempPathFactory,
    password: str,
    command: str,
    scenario: str,
    encoded: bool,
    json_logs: bool,
) -> None:
    namespace = "t" + uuid.uuid4().hex[:10]
    config = tmp_path_factory.mktemp("secrets") / "cdc.yaml"
    config.write_text(CONFIG.format(schema=tracked_schema, namespace=namespace), encoding="utf-8")
    checking = f"127.0.0.1:{checking_redis.port}"
    if scenario.startswith("source"):
        host_port = checking_postgres if scenario == "source refuses" else closed_port()
        env = {"CDC_SOURCE_DSN": pg_url(password, host_port, encoded=encoded), "CDC_REDIS_URL": redis_url}
        expected = 2 if not encoded and libpq_misreads(password) else 3
    elif scenario.startswith("redis"):
        host_port = checking if scenario == "redis refuses" else closed_port()
        env = {
            "CDC_SOURCE_DSN": with_password(postgres_dsn, password),
            "CDC_REDIS_URL": redis_at(password, host_port, encoded=encoded),
        }
        # a URL the loader can tell is misread (an unencoded # / ?) is bad config, refused at
        # load for every command; any other is tried: "tracking status" alone needs no Redis
        expected = 2 if _loader_refuses(env["CDC_REDIS_URL"]) else 0 if command == "tracking status" else 3
    else:
        user = "u" + uuid.uuid4().hex[:8]
        admin = aioredis.Redis.from_url(checking_redis.url)
        try:
            await admin.acl_setuser(
                user,
                enabled=True,
                passwords=[f"+{password}"],
                keys=["*"],
                channels=["*"],
                categories=["+@all"],
            )
        finally:
            await admin.aclose()
        env = {
            "CDC_SOURCE_DSN": with_password(postgres_dsn, password),
            "CDC_REDIS_URL": redis_at(password, checking, encoded=True, user=user),
        }
        expected = 0

    done = cdc(COMMANDS[command], config, env, json_logs)

    assert_no_leak(done.stdout + done.stderr, password)
    assert done.returncode == expected, f"{scenario}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"


# (the source's dsn line, the redis url line, the environment): <raw>, <encoded>
# and <json> stand for the password as typed, percent-encoded, JSON-escaped.
SETTINGS_MISTAKES = {
    "swapped": (
        "dsn: ${CDC_SOURCE_DSN}",
        "url: ${CDC_REDIS_URL}",
        {"CDC_SOURCE_DSN": "redis://app:<raw>@h:6379/0", "CDC_REDIS_URL": "postgresql://app:<encoded>@h/db"},
    ),
    "http scheme": ("dsn: host=h", "url: ${CDC_REDIS_URL}", {"CDC_REDIS_URL": "http://app:<encoded>@h/0"}),
    "dsn as a list": (
        'dsn: ["${CDC_SOURCE_DSN}"]',
        "url: redis://h/0",
        {"CDC_SOURCE_DSN": "postgresql://app:<raw>@h/db"},
    ),
    "dsn as a mapping": ("dsn: {host: h, password: '${PGPASS}'}", "url: redis://h/0", {"PGPASS": "<raw>"}),
    "password in the file": ('dsn: "postgresql://app:<json>@h/db"', 'url: ["redis://app:<json>@h/0"]', {}),
    "mapping in the file": ('dsn:\n    host: h\n    password: "<json>"', "url: redis://h/0", {}),
}


def _fill(text: str, password: str) -> str:
    forms = {"<raw>": password, "<encoded>": quote(password, safe=""), "<json>": json.dumps(password)[1:-1]}
    for mark, form in forms.items():
        text = text.replace(mark, form)
    return text


@pytest.mark.parametrize("mistake", list(SETTINGS_MISTAKES))
def test_a_config_mistake_never_echoes_the_password(mistake: str, tmp_path: Path) -> None:
    """Exit 2 naming the field; the schema's message quotes the value, never its password."""
    dsn, url, env = SETTINGS_MISTAKES[mistake]
    config = tmp_path / "cdc.yaml"
    config.write_text(
        _fill(
            f"source:\n  kind: postgres\n  {dsn}\nredis:\n  {url}\ntables:\n  - table: s.t\n", ISSUE_PASSWORD
        ),
        encoding="utf-8",
    )
    done = cdc(["validate"], config, {k: _fill(v, ISSUE_PASSWORD) for k, v in env.items()}, json_logs=False)
    assert_no_leak(done.stdout + done.stderr, ISSUE_PASSWORD)
    assert done.returncode == 2, done.stderr
    assert re.search(r"cdc\.yaml:\d+: (source\.dsn|redis\.url)", done.stderr), done.stderr


@pytest.mark.parametrize("mistake", list(SETTINGS_MISTAKES))
def test_the_config_loader_never_echoes_the_password(mistake: str) -> None:
    """What ``load_config`` raises to a program that loads a config itself."""
    dsn, url, env = SETTINGS_MISTAKES[mistake]
    text = _fill(
        f"source:\n  kind: postgres\n  {dsn}\nredis:\n  {url}\ntables:\n  - table: s.t\n", ISSUE_PASSWORD
    )
    with pytest.raises(CdcError) as raised:
        parse_config(text, "cdc.yaml", {k: _fill(v, ISSUE_PASSWORD) for k, v in env.items()})
    assert raised.value.exit_code == 2
    assert_no_leak(str(raised.value), ISSUE_PASSWORD)
