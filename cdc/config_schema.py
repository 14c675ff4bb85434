"""The config file checked against ``schemas/config.schema.json``, the one
source of truth for what the file may hold, and each error told as
``file:line: field: message``.

Two keywords of our own, for durations (which the file writes as text, so
JSON Schema's ``minimum`` cannot compare them): ``durationMinimum`` and
``durationMaximum`` (``"1s"``, ``"3650d"``), and ``durationOff: true`` where
0 turns the option off and so is allowed below the minimum.

A message quotes the value it is about, cut to a few dozen characters; never
the value of a field that may hold a password (``SECRET_FIELDS``), nor of a
section that holds one when the section itself is of the wrong type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from cdc.config_yaml import SHOWN, Lines, cut, locate, shown
from cdc.durations import parse_duration
from cdc.errors import ConfigError

# Fields that may hold a password: their values are never quoted in a message.
SECRET_FIELDS: tuple[tuple[str, ...], ...] = (
    ("source", "dsn"),
    ("redis", "url"),
    ("redis", "sentinel", "url"),
)
NOT_SHOWN = "the value is not shown: it may hold a password"


@cache
def config_schema() -> dict[str, Any]:
    """The config JSON Schema, from the installed package or the source tree."""
    candidates = [
        resources.files("cdc").joinpath("schemas/config.schema.json"),
        Path(__file__).resolve().parent.parent / "schemas" / "config.schema.json",
    ]
    for candidate in candidates:
        if candidate.is_file():
            schema: dict[str, Any] = json.loads(candidate.read_text(encoding="utf-8"))
            return schema
    raise ConfigError("config.schema.json is missing from the installation")


def validate(data: Any, lines: Lines, name: str) -> None:
    """Raise a ConfigError for the shallowest schema error of ``data``."""
    errors = sorted(
        _validator().iter_errors(data),
        key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))),
    )
    if not errors:
        return
    error = errors[0]
    path = tuple(error.absolute_path)
    message = _message(error, path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        unknown = sorted(set(error.instance) - set(_properties(error)))
        if unknown:
            path = (*path, unknown[0])
    raise ConfigError(locate(name, lines, path, message))


def is_secret(path: tuple[str | int, ...]) -> bool:
    """Whether the value at ``path`` is, or may contain, a password field."""
    return any(path[: len(secret)] == secret or secret[: len(path)] == path for secret in SECRET_FIELDS)


def secret_message(path: tuple[str | int, ...], message: str) -> str:
    """``message`` with NOT_SHOWN added when ``path`` may hold a password."""
    return f"{message} ({NOT_SHOWN})" if is_secret(path) else message


# -- the validator -------------------------------------------------------------


@cache
def _validator() -> Any:
    """The schema with its ``$ref``s replaced by what they name: a reference
    costs a lookup per value, a third of the time of a 20,000-table file."""
    schema = config_schema()
    return _Validator(_inline(schema, schema["$defs"]))


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    inlined = {key: _inline(value, defs) for key, value in node.items() if key not in ("$ref", "$defs")}
    if "$ref" in node:
        return {**_inline(defs[node["$ref"].removeprefix("#/$defs/")], defs), **inlined}
    return inlined


def _ecma_pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` with JSON Schema's (ECMA-262) meaning of a final ``$``: the
    very end of the text. Python's ``$`` also matches before a final newline,
    which would let ``"dbo.Forecasts\\n"`` pass as an identifier."""
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + "\\Z"
    return re.compile(pattern)


def _seconds(instance: Any) -> float | None:
    """``instance`` in seconds, or None when it is no duration (the
    ``$defs/duration`` schema says why)."""
    try:
        return parse_duration(instance)
    except ValueError:
        return None


def _duration_minimum(
    validator: Any, minimum: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    seconds = _seconds(instance)
    off = bool(schema.get("durationOff"))
    if seconds is None or (off and seconds == 0):
        return
    if seconds < parse_duration(minimum):
        turns_off = " (or 0, which turns it off)" if off else ""
        yield jsonschema.ValidationError(
            f"{shown(instance)} is less than the minimum of {minimum}{turns_off}"
        )


def _duration_maximum(
    validator: Any, maximum: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    seconds = _seconds(instance)
    if seconds is not None and seconds > parse_duration(maximum):
        yield jsonschema.ValidationError(f"{shown(instance)} is greater than the maximum of {maximum}")


def _is_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 500.0 as an integer; a count in this config must be an int.
    return isinstance(instance, int) and not isinstance(instance, bool)


_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in the stubs
    jsonschema.Draft202012Validator,
    validators={
        "pattern": _ecma_pattern,
        "durationMinimum": _duration_minimum,
        "durationMaximum": _duration_maximum,
    },
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


# -- messages ------------------------------------------------------------------


def _message(error: jsonschema.ValidationError, path: tuple[str | int, ...]) -> str:
    """What the user reads: the value quoted short, or not at all when it may
    hold a password (then saying so)."""
    secret = is_secret(path)
    message = _schema_message(error, None if secret else shown(error.instance))
    quoted = repr(error.instance)
    if secret:
        hidden = quoted in message or error.validator == "pattern"
        message = message.replace(quoted, "the value")
        return f"{message} ({NOT_SHOWN})" if hidden else message
    if len(quoted) > len(shown(error.instance)):  # jsonschema's own messages quote it whole
        message = message.replace(quoted, shown(error.instance))
    return cut(message, 5 * SHOWN)


def _schema_message(error: jsonschema.ValidationError, value: str | None) -> str:
    """``value``: the instance as it may be quoted, None when it may not."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = ", ".join(sorted(_properties(error)))
        unknown = sorted(set(error.instance) - set(_properties(error)))
        listed = ", ".join(cut(str(key)) for key in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        return f"unknown key {listed}{more} (allowed: {allowed})"
    if error.validator == "pattern":
        if "patternMeaning" in schema:
            return f"expected {schema['patternMeaning']}" + (f", got {value}" if value else "")
        return f"{value or 'the value'} is not valid here (must match {error.validator_value})"
    if (
        error.validator == "type"
        and isinstance(error.instance, dict)
        and "string" in str(error.validator_value)
    ):
        return f'{error.message} (quote a value that starts with {{, e.g. "{{Id}}")'
    if error.validator == "oneOf" and error.validator_value == config_schema()["$defs"]["duration"]["oneOf"]:
        return f"expected a duration such as 50ms, 5s or 7d, got {value}"
    return error.message


def _properties(error: jsonschema.ValidationError) -> list[str]:
    schema = error.schema
    return list(schema.get("properties", {})) if isinstance(schema, dict) else []
