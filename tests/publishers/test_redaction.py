"""publishers.redaction: passwords never reach a message, whatever they hold."""

from __future__ import annotations

import logging

import pytest

from publishers import redaction
from publishers.redaction import (
    PERCENT_ENCODE,
    Secrets,
    config_secrets,
    for_display,
    mask_passwords,
    scrub,
    scrub_url,
    secrets_in,
    url_problem,
    url_secrets,
)

TRICKY = ["hunter2", "pa/ss", "p@ss", "pa;ss", "pa}ss", "p%40ss", "a/b@c;d}e%f"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:hunter2@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://alice:hunter2@h:6380/1", "rediss://alice:***@h:6380/1"),
        ("redis://alice@h/0", "redis://alice@h/0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("unix://alice:hunter2@/tmp/redis.sock?db=2", "unix://alice:***@/tmp/redis.sock?db=2"),
        ("redis://h/0?password=hunter2&db=1", "redis://h/0?password=***&db=1"),
    ],
)
def test_for_display(url: str, expected: str) -> None:
    assert for_display(url) == expected


@pytest.mark.parametrize("password", TRICKY)
def test_url_passwords_with_special_characters(password: str) -> None:
    url = f"redis://alice:{password}@h:6379/0"
    shown = for_display(url)
    assert password not in shown
    assert shown.startswith("redis://alice:***@")
    assert password in url_secrets(url)
    message = scrub_url(f"cannot connect to {url}: auth {password} refused", url)
    assert password not in message


@pytest.mark.parametrize("password", TRICKY)
def test_mask_passwords_in_urls_and_queries(password: str) -> None:
    assert password not in mask_passwords(f"url redis://u:{password}@h/0 failed")
    masked = mask_passwords(f"redis://h/0?db=1&password={password}&x=1")
    assert masked == "redis://h/0?db=1&password=***&x=1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DRIVER=x;UID=sa;PWD=hunter2;Encrypt=no", "DRIVER=x;UID=sa;PWD=***;Encrypt=no"),
        ("UID=sa;PWD={pa;ss}}word};Encrypt=no", "UID=sa;PWD=***;Encrypt=no"),
        ("uid=sa;pwd = {a/b@c;d}}e%f}", "uid=sa;pwd = ***"),
        ("host=h user=u password=hunter2 dbname=d", "host=h user=u password=*** dbname=d"),
        ("host=h password='pa ss\\'wo;rd' dbname=d", "host=h password=*** dbname=d"),
        ("redis://h/0?password=hunter2&db=1", "redis://h/0?password=***&db=1"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_mask_passwords_in_connection_strings(text: str, expected: str) -> None:
    assert mask_passwords(text) == expected


def test_scrub_replaces_each_secret_longest_first() -> None:
    assert scrub("a pa;ss and pa;ss}x", ["pa;ss", "pa;ss}x"]) == "a *** and ***"
    assert scrub("nothing", ["", "zz"]) == "nothing"


# -- secrets found by syntax, in values that need not parse --------------------------


@pytest.mark.parametrize(
    ("value", "password"),
    [
        # the userinfo runs to the LAST '@': drivers cut it at the first '/', '?', '#' or '@'
        ("postgresql://u:ab/cd@ef@h:5432/db", "ab/cd@ef"),
        ("redis://:que?stion#1@h/0", "que?stion#1"),
        ("unix://u:p w/x@/tmp/redis.sock?db=0", "p w/x"),
        ("http://u:p@ss@h/0", "p@ss"),
        # ?password= runs to the next '&' ('#' is no fragment in a password)
        ("redis://h/0?db=1&password=ha sh#tag&x=1", "ha sh#tag"),
        # key=value: a bare value holding a space or a ';' runs to the next key
        ("host=h password=se cret;x dbname=d", "se cret;x"),
        ("host=h password='it''s' dbname=d", "'it''s'"),
        ("DRIVER={x};UID=sa;PWD=ab;cd;Encrypt=no", "ab;cd"),
        ("UID=sa;PWD={a}}b;c};Encrypt=no", "a}}b;c"),
    ],
)
def test_secrets_are_found_in_values_that_do_not_parse(value: str, password: str) -> None:
    assert password in secrets_in(value)
    shown = for_display(value)
    assert password not in shown and "***" in shown


@pytest.mark.parametrize(
    ("text", "password"),
    [
        ("  dsn: {host: h, password: se cret}", "se cret"),  # a line of the config file
        ('    password: "se,c}ret"', "se,c}ret"),
        ("{'host': 'h', 'password': 'se cret'} is not of type 'string'", "se cret"),  # a schema message
    ],
)
def test_secrets_in_mappings_as_text(text: str, password: str) -> None:
    assert password in secrets_in(text)


def test_a_dict_repr_shows_no_password() -> None:
    assert (
        mask_passwords("{'host': 'h', 'password': 'a b'} is bad") == "{'host': 'h', 'password': '***'} is bad"
    )
    assert mask_passwords('{"pwd": "a\\"b", "x": 1}') == '{"pwd": "***", "x": 1}'


def test_json_escapes_are_forms_of_a_secret() -> None:
    """A YAML double-quoted password ("\\u00e9") is "é" once loaded."""
    assert Secrets(["Q\\u00e9Z1"]).scrub("token QéZ1 refused") == "token *** refused"


def test_secrets_in_lists_and_mappings() -> None:
    assert "pw/1" in secrets_in(["postgresql://u:pw/1@h/db"])
    assert {"s3cret", "pw2"} <= set(secrets_in({"host": "h", "password": "s3cret", "url": "redis://:pw2@h"}))
    assert secrets_in({"host": "h", "port": 5432}) == []


def test_pieces_of_a_secret_are_scrubbed_wherever_they_appear() -> None:
    secrets = Secrets(["tail/frag1234"])
    # what psycopg prints of a URL whose password holds an unencoded '/'
    assert (
        secrets.scrub("dbname=frag1234@127.0.0.1:5432/db host=u port=tail")
        == "dbname=***@127.0.0.1:5432/db host=u port=***"
    )
    # a quoted token that is part of a secret goes whatever its length
    assert Secrets(["ab/cd@ef"]).scrub("Port could not be cast to integer value as 'ab'") == (
        "Port could not be cast to integer value as '***'"
    )
    # a short secret goes as a word of its own, not inside other words
    assert Secrets(["abc"]).scrub("auth abc failed for abcdef") == "auth *** failed for abcdef"
    # masks next to each other (or a blank apart) are one: the shape tells nothing
    assert Secrets(["spa ce"]).scrub("password=spa ce;x") == "password=***;x"


def test_a_quoted_token_goes_only_as_a_piece_a_parser_cuts_the_secret_into() -> None:
    """A data key '4' in a dead letter's listing stays readable although the
    configured password's encoding ("%40") holds a 4; the pieces of the
    password between its delimiters still go, however short."""
    secrets = Secrets(["rt%2Fpa%40ss"])
    assert secrets.scrub("key='4' id \"40\" at '2F'") == "key='4' id \"40\" at '2F'"
    assert secrets.scrub("invalid port 'rt' host 'pa@ss'") == "invalid port '***' host '***'"
    # where libpq cuts: an IPv6 host's brackets, and any whitespace of a key=value string
    assert Secrets(["Q@[Z]J"]).scrub('unexpected character "J" at position 21') == (
        'unexpected character "***" at position 21'
    )
    assert Secrets(["QZ\tXJ"]).scrub('missing "=" after "XJ"') == 'missing "=" after "***"'


def test_a_public_name_shows_unless_a_parser_could_cut_it_from_the_secret() -> None:
    secrets = Secrets(["weakpw", "rt/pa@ss"], public=["weak", "rt", "shop"])
    # "weak" is only a 4-character piece of "weakpw": a name, shown
    assert secrets.scrub('GRANT USAGE ON SCHEMA "shop" TO "weak"') == 'GRANT USAGE ON SCHEMA "shop" TO "weak"'
    # "rt" is what a driver quotes of "rt/pa@ss" typed unencoded: still masked
    assert secrets.scrub('invalid port "rt"') == 'invalid port "***"'
    # the secret itself, and a word holding a piece of it, still go
    assert secrets.scrub("password weakpw, weakp") == "password ***, ***"
    # a name at the start of the secret, where the secret is whole: no piece of it shows
    assert Secrets(["ab.cdef"], public=["ab"]).scrub("pw ab.cdef, schema ab") == "pw ***, schema ab"


@pytest.mark.parametrize("form", ["a%2Fb%40c%3Fd", "a/b@c?d", "a\\/b@c?d", '"a/b@c?d"'])
def test_every_form_of_a_secret_is_scrubbed(form: str) -> None:
    """Configured percent-encoded, a message may give it decoded, and the
    other way round; a JSON log or a repr() escapes it."""
    secrets = Secrets(["a%2Fb%40c%3Fd"])
    assert "b@c" not in secrets.scrub(f"x {form} y") and "b%40c" not in secrets.scrub(f"x {form} y")
    assert secrets.scrub("x a/b@c?d y") == "x *** y"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://u:tail/frag@h:6379/0", PERCENT_ENCODE),
        ("redis://:hash#tag@h/0", PERCENT_ENCODE),
        ("redis://:1234/x@h/0", PERCENT_ENCODE),  # a port that parses, a path that holds the rest
        ("unix://u:a?b@/tmp/redis.sock", PERCENT_ENCODE),
        (
            "postgresql://u:pw@h/db",
            "a Redis URL starts with redis://, rediss:// (TLS) or unix:// (it starts with postgresql://)",
        ),
        ("host=h password=pw", "a Redis URL starts with redis://, rediss:// (TLS) or unix://"),
        ("redis://h:port/0", "its port is not a number"),
        ("redis://u:p@ss@h:6379/0", None),  # Python's parser takes the last '@'
        ("redis://h:6379/0?ssl_ca_certs=/x@y", None),  # a '@' in the query is no password
        ("rediss://u:a%2Fb@h:6380/0", None),
    ],
)
def test_url_problem_says_what_is_wrong_without_quoting_it(url: str, problem: str | None) -> None:
    assert url_problem(url) == problem


def test_config_secrets_are_those_of_its_lines_and_of_the_variables_it_names() -> None:
    text = 'source:\n  dsn: ${CDC_SOURCE_DSN}\nredis:\n  url: "redis://:in-file-pw@h/0"\n  x: ${TOKEN}\n'
    environ = {
        "CDC_SOURCE_DSN": "postgresql://u:env/pw@h/db",
        "TOKEN": "plain-token",
        "OTHER": "redis://:o@h",
    }
    found = set(config_secrets(text, environ))
    assert {"in-file-pw", "env/pw", "plain-token"} <= found and "o" not in found
    assert config_secrets("# the password: comes from the environment\n", {}) == []


def test_remembered_secrets_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "_KNOWN", Secrets())
    assert redaction.redact("auth tail/frag1234 refused") == "auth tail/frag1234 refused"
    redaction.remember("postgresql://u:tail/frag1234@h/db")
    redaction.remember_environment({"PGPASSWORD": "env-secret-1", "PWD": "/work/here"})
    assert redaction.redact("auth tail/frag1234 refused, port=frag1234") == "auth *** refused, port=***"
    assert redaction.redact("env-secret-1 in /work/here") == "*** in /work/here"


def test_log_lines_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc.logs import JsonFormatter, TextFormatter

    monkeypatch.setattr(redaction, "_KNOWN", Secrets())
    redaction.remember("redis://u:Log/Secret-1@h/0")
    try:
        raise ValueError("Port could not be cast to integer value as 'Log'; rest Secret-1@h")
    except ValueError as exc:
        record = logging.LogRecord(
            "t", logging.ERROR, "f", 1, "failed: %s", (exc,), exc_info=(ValueError, exc, None)
        )
    record.error = "Log/Secret-1"
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(record)
        assert "Secret-1" not in line and "'Log'" not in line and "***" in line
