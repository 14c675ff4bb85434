"""An operator's mistakes at the command line, as a user meets them: a real
``cdc`` process each, exit code 2, the file, line and field (or the option)
named, no secret and never a traceback. The loader's own cases, message by
message, are in test_config_limits.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e import cdc

PASSWORD = "Zr8/kk@2p#x"
HEAD = "source:\n  kind: postgres\n  dsn: postgresql://cdc@127.0.0.1:1/planning\n"
TABLE = "tables:\n  - table: public.forecasts\n"


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """stderr of a command that must have exited 2 without a traceback."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    return result.stderr


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return tmp_path / "tables.yaml"


def bomb() -> str:
    levels = ['  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n']
    for level in range(1, 9):
        name, previous = chr(ord("a") + level), chr(ord("a") + level - 1)
        levels.append(f"  {name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n")
    return "worker:\n" + "".join(levels)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        # a recursive alias (a RecursionError traceback before)
        (HEAD + "tables: &t [*t]\n", ":4: tables[0]: the alias *t refers to a value that contains it"),
        # an alias bomb (grew to 9.4 GB before)
        (HEAD + bomb() + TABLE, ":13: worker.i[0]: YAML aliases repeat 490,329,036 values"),
        # nesting past the recursion limit (past libyaml's own 1,000 levels: the same words)
        (HEAD + "tables: " + "[" * 500 + "]" * 500 + "\n", ":4: tables[0][0]"),
        (HEAD + "tables: " + "[" * 3000 + "]" * 3000 + "\n", ":4: tables"),
        # nonsense that passed before
        (
            HEAD + "worker:\n  lease_ttl: 0\n" + TABLE,
            ":5: worker.lease_ttl: 0 is less than the minimum of 500ms",
        ),
        (
            HEAD + "worker:\n  page_size: 100000000000000000000\n" + TABLE,
            ":5: worker.page_size: 100000000000000000000 is greater than the maximum of 100000",
        ),
        (
            HEAD + "redis:\n  tombstone_ttl: 200000000000d\n" + TABLE,
            ":5: redis.tombstone_ttl: '200000000000d' is greater than the maximum of 3650d",
        ),
        (HEAD + "redis:\n  url: redis://cache/abc\n" + TABLE, ":5: redis.url: the database must be a number"),
        (
            HEAD + "worker:\n  health: '::1:9478'\n" + TABLE,
            ":5: worker.health: an IPv6 address goes in brackets",
        ),
    ],
    ids=[
        "recursive-alias",
        "alias-bomb",
        "deep",
        "deeper-than-libyaml",
        "lease_ttl-0",
        "page_size-1e20",
        "tombstone_ttl",
        "redis-db",
        "ipv6",
    ],
)
def test_validate_and_run_refuse_the_file_with_its_line_and_field(
    config: Path, body: str, where: str
) -> None:
    config.write_text(body, encoding="utf-8")
    for command in ("validate", "run"):
        started = time.monotonic()
        stderr = refused(cdc(command, "-c", str(config)))
        assert f"error: {config}{where}" in stderr
        assert time.monotonic() - started < 30


def test_a_50_mb_value_is_not_echoed_whole(config: Path) -> None:
    config.write_text(HEAD + f"redis:\n  namespace: '@{'x' * 50_000_000}'\n" + TABLE, encoding="utf-8")
    stderr = refused(cdc("validate", "-c", str(config)))
    assert f"{config}:5: redis.namespace: '@xxx" in stderr and "…" in stderr
    assert len(stderr) < 500


@pytest.mark.parametrize(
    "body",
    [
        f"source:\n  kind: postgres\n  dsn: redis://:{PASSWORD}@cache:6379/0\nredis:\n  url: postgresql://cdc:{PASSWORD}@db1/planning\n"
        + TABLE,
        HEAD + f"redis:\n  url: http://cdc:{PASSWORD}@cache:6379/0\n" + TABLE,
        f"source:\n  kind: postgres\n  dsn: [postgresql://cdc:{PASSWORD}@db1/planning]\n" + TABLE,
        HEAD + f"redis:\n  url: redis://cdc:{PASSWORD}@cache:6379/0\n" + TABLE,
    ],
    ids=["swapped", "http-scheme", "dsn-as-list", "unencoded-slash"],
)
def test_a_dsn_or_url_in_error_is_never_printed(config: Path, body: str) -> None:
    config.write_text(body, encoding="utf-8")
    result = cdc("validate", "-c", str(config))
    stderr = refused(result)
    assert "the value is not shown: it may hold a password" in stderr
    for piece in (PASSWORD, "Zr8", "kk@2p"):
        assert piece not in result.stdout + stderr


def test_a_bad_log_level_lists_the_choices(config: Path) -> None:
    config.write_text(HEAD + TABLE, encoding="utf-8")
    stderr = refused(cdc("--log-level", "VERBOSE", "validate", "-c", str(config)))
    assert "Invalid value for '--log-level': 'VERBOSE' is not one of" in stderr
    for level in ("debug", "info", "warning", "error"):
        assert f"'{level}'" in stderr.lower()


@pytest.mark.parametrize(
    ("args", "option", "why"),
    [
        (("--partition", ""), "--partition", "a partition value cannot be empty"),
        (("--partition", "app1", "--from-seq", "-5"), "--from-seq", "-5 is not in the range x>=1"),
        (("--partition", "app1", "--from-seq", "0"), "--from-seq", "0 is not in the range x>=1"),
        (("--partition", "app1", "--section", ".hidden"), "--section", "a section is letters, digits"),
    ],
)
def test_subscribe_refuses_bad_arguments_naming_the_option(
    config: Path, args: tuple[str, ...], option: str, why: str
) -> None:
    config.write_text(HEAD + TABLE, encoding="utf-8")
    stderr = refused(cdc("subscribe", "-c", str(config), *args))
    assert f"Invalid value for '{option}': {why}" in stderr


def test_a_health_host_that_does_not_resolve_stops_the_start(config: Path) -> None:
    """Before anything connects: the source of this file does not even exist."""
    config.write_text(HEAD + "worker:\n  health: nosuch.invalid:9478\n" + TABLE, encoding="utf-8")
    stderr = refused(cdc("run", "-c", str(config)))
    assert f"error: {config}: worker.health: the host 'nosuch.invalid' does not resolve" in stderr
