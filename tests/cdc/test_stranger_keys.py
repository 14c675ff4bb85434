"""Issue 13, tried as a stranger would: every row of a table is its own
document, whatever its key values hold and however the key is templated.

Found on main: a composite primary key whose text values hold the default
key's separator (``('x:y', 'z')`` and ``('x', 'y:z')``) mirrored two rows into
one document, ``x:y:z``, each write replacing the other; a ``key:`` template
that leaves out a primary-key column did the same for every pair of rows that
differ only there.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import psycopg
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from cdc.templates import Template

# -- rendering: two rows never render to one key -------------------------------------------------

# values made of the templates' literal characters, so that collisions are there to be found
values = st.one_of(st.text(alphabet="xy:-%;=/!ü5A", max_size=4), st.text(max_size=4), st.integers(-5, 5))


def read_back(template: Template, key: str) -> list[str] | None:
    """The values a key was rendered from: each runs up to the next literal text
    (no value holds a character of it: those, and '%', are percent-encoded),
    then is percent-decoded."""
    reserved = re.escape("".join(text for is_column, text in template.parts if not is_column))
    value = f"((?:[^%{reserved}]|%[0-9A-F]{{2}})*)"  # characters, or '%' and two hex digits
    pattern = "".join(value if is_column else re.escape(text) for is_column, text in template.parts)
    found = re.fullmatch(pattern, key)
    return None if found is None else [urllib.parse.unquote(value) for value in found.groups()]


@given(
    st.sampled_from(
        ["{a}:{b}", "{a}-{b}:{c}", "k={a};{b}", "{a}5{b}", "{a}::{b}/{c}!", "{a}ü{b}", "{a}A{b}"]
    ),
    st.tuples(values, values, values),
)
def test_a_key_of_several_columns_reads_back_to_its_values(text: str, row: tuple[object, ...]) -> None:
    """So two rows with different key values never share a document."""
    template = Template.parse(text)
    named = dict(zip("abc", row, strict=True))
    assert read_back(template, template.render(named)) == [str(named[c]) for c in template.columns]


def test_the_separator_inside_a_value_is_percent_encoded_and_one_column_keys_are_unchanged() -> None:
    assert Template.join(("a", "b")).render({"a": "x:y", "b": "z"}) == "x%3Ay:z"
    assert Template.join(("a", "b")).render({"a": "x", "b": "y:z"}) == "x:y%3Az"
    assert Template.join(("a", "b")).render({"a": "100%", "b": 7}) == "100%25:7"
    assert Template.parse("{a}ü{b}").render({"a": "ü", "b": 1}) == "%C3%BCü1"
    # one column: its value as it is, ':' in a timestamp key included (keys of existing mirrors kept)
    assert Template.parse("{ts}").render({"ts": "2024-01-01T10:00:00"}) == "2024-01-01T10:00:00"
    assert Template.parse("order-{id}").render({"id": "a:b%"}) == "order-a:b%"


def test_two_columns_with_nothing_or_a_percent_sign_between_them_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\{a\} and \{b\} have no text between them.*\{a\}:\{b\}"):
        Template.parse("x{a}{b}")
    with pytest.raises(ValueError, match="'%' cannot be literal text"):
        Template.parse("{a}%{b}")
    assert Template.parse("{a}%").render({"a": "%"}) == "%%"  # one column: nothing to tell apart


# -- end to end: what a user reads in Redis ------------------------------------------------------


def cdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "--text-logs", *args], capture_output=True, text=True, timeout=90
    )


def write_config(path: Path, dsn: str, redis_url: str, namespace: str, schema: str, extra: str = "") -> Path:
    path.write_text(
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n"
        f"tables:\n  - table: {schema}.pairs\n{extra}",
        encoding="utf-8",
    )
    return path


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def documents(client: redis.Redis, namespace: str) -> dict[str, dict[str, str]]:
    """data key -> the document's fields (@ fields left out), for every live key of the section."""
    found = {}
    for key in client.smembers(f"{namespace}:{{pairs}}:@index:pairs"):
        fields = client.hgetall(f"{namespace}:{{pairs}}:pairs:{key.decode()}")
        found[key.decode()] = {k.decode(): v.decode() for k, v in fields.items() if not k.startswith(b"@")}
    return found


@pytest.mark.timeout(120)
def test_rows_whose_key_values_hold_the_separator_are_two_documents(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    s = pg_schema
    execute(
        postgres_dsn,
        f'create table "{s}".pairs (a text, b text, v int, primary key (a, b))',
        f"""insert into "{s}".pairs values ('x:y', 'z', 1), ('x', 'y:z', 2), ('50%', '', 3)""",
    )
    path = write_config(tmp_path / "cdc.yaml", postgres_dsn, redis_url, namespace, s)
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    client = redis.Redis.from_url(redis_url)
    try:
        run = cdc("run", "--once", "-c", str(path))  # the snapshot
        assert run.returncode == 0, run.stderr
        assert documents(client, namespace) == {
            "x%3Ay:z": {"a": '"x:y"', "b": '"z"', "v": "1"},
            "x:y%3Az": {"a": '"x"', "b": '"y:z"', "v": "2"},
            "50%25:": {"a": '"50%"', "b": '""', "v": "3"},
        }
        execute(
            postgres_dsn,
            f"""update "{s}".pairs set v = 20 where a = 'x'""",
            f"""delete from "{s}".pairs where a = 'x:y'""",
        )
        run = cdc("run", "--once", "-c", str(path))  # the changes
        assert run.returncode == 0, run.stderr
        assert documents(client, namespace) == {
            "x:y%3Az": {"a": '"x"', "b": '"y:z"', "v": "20"},
            "50%25:": {"a": '"50%"', "b": '""', "v": "3"},
        }
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_key_template_that_leaves_out_a_primary_key_column_is_refused(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    s = pg_schema
    execute(postgres_dsn, f'create table "{s}".pairs (a int, b int, v int, primary key (a, b))')
    path = write_config(tmp_path / "cdc.yaml", postgres_dsn, redis_url, namespace, s, '    key: "{a}"\n')
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0

    for command in ("validate", "run --once"):
        result = cdc(*command.split(), "-c", str(path))
        output = result.stdout + result.stderr
        assert result.returncode == 2, output
        assert "cdc.yaml:12: tables[0].key: template '{a}'" in output
        assert "leaves out primary-key column(s) b" in output and "key: '{a}:{b}'" in output
        assert "Traceback" not in output

    # with the partition carrying the other column, every row still has its own document
    path = write_config(
        tmp_path / "cdc.yaml", postgres_dsn, redis_url, namespace, s, '    key: "{a}"\n    partition: "{b}"\n'
    )
    result = cdc("validate", "-c", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
