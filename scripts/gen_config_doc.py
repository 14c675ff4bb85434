"""Render docs/CONFIG.md, the config file reference, from schemas/config.schema.json.

The schema is the one source of truth for what the file may hold; this page is
derived from it, and tests/cdc/test_config.py fails when the two disagree.

    python scripts/gen_config_doc.py          # rewrite docs/CONFIG.md
    python scripts/gen_config_doc.py --check  # exit 1 if docs/CONFIG.md is out of date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "config.schema.json"
DOC = ROOT / "docs" / "CONFIG.md"

Schema = dict[str, Any]

# How a $defs entry is named in the tables; its description goes to "Value types".
TYPE_NAMES = {
    "identifier": "identifier",
    "column": "column",
    "segment": "name",
    "template": "template",
    "duration": "duration",
}


def render(schema: Schema) -> str:
    """The whole page, as markdown."""
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from schemas/config.schema.json by scripts/gen_config_doc.py. Do not edit by hand:",
        "     change the schema, then run `python scripts/gen_config_doc.py`. -->",
        "",
        schema["description"],
        "",
        "A complete file with every option at its default is "
        "[examples/tables.yaml](../examples/tables.yaml).",
        "",
    ]
    required = set(schema.get("required", ()))
    for name, section in schema["properties"].items():
        out += _section(schema, name, section, name in required)
    out += [ENVIRONMENT]
    out += _value_types(schema)
    return "\n".join(out)


def _section(schema: Schema, name: str, section: Schema, required: bool) -> list[str]:
    title = f"## `{name}`" + (" (required)" if required else "")
    out = [title, "", section["description"]]
    if section.get("type") == "array":
        extra = [f"at least {section['minItems']} entry"] if "minItems" in section else []
        out[-1] += f" A list{' (' + ', '.join(extra) + ')' if extra else ''}; each entry:"
        section, prefix = section["items"], f"{name}[]."
    else:
        prefix = f"{name}."
    out += ["", "| key | type | default | meaning |", "|---|---|---|---|"]
    out += _rows(schema, section, prefix)
    return [*out, ""]


def _rows(schema: Schema, section: Schema, prefix: str) -> list[str]:
    """A row per key; an object's own keys follow it (``redis.sentinel.master``)."""
    out = []
    needed = set(section.get("required", ()))
    for key, prop in section["properties"].items():
        default = _default(prop, key in needed)
        meaning = prop.get("description", "")
        out.append(f"| `{prefix}{key}` | {_cell(_type(schema, prop))} | {default} | {_cell(meaning)} |")
        if "properties" in prop:  # an object, or an object or null
            out += _rows(schema, prop, f"{prefix}{key}.")
    return out


def _value_types(schema: Schema) -> list[str]:
    out = ["## Value types", "", "| type | what it accepts |", "|---|---|"]
    for ref, name in TYPE_NAMES.items():
        out.append(f"| {name} | {_cell(schema['$defs'][ref]['description'])} |")
    out += [
        "",
        "Unknown keys are errors, and every error names the file, the line and the key, e.g. "
        "`tables.yaml:12: tables[0].sections: unknown key sections (allowed: backoff, columns, key, "
        "operations, partition, section, table)`. A value outside its bounds is refused the same way "
        "(`tables.yaml:9: worker.lease_ttl: '0s' is less than the minimum of 500ms`), by `cdc validate` "
        "and `cdc run` alike, exit code 2.",
        "",
        "An error quotes the value it is about cut to 80 characters, and never the value of "
        "`source.dsn` or `redis.url` (it says \"the value is not shown: it may hold a password\").",
        "",
        YAML_LIMITS,
    ]
    return out


def _type(schema: Schema, prop: Schema) -> str:
    if "$ref" in prop:
        name = TYPE_NAMES[prop["$ref"].rsplit("/", 1)[-1]]
        if "durationMinimum" in prop:
            name += f" {prop['durationMinimum']}–{prop['durationMaximum']}"
            name += " or 0 (off)" if prop.get("durationOff") else ""
        return name
    if "enum" in prop:
        return " or ".join(f"`{json.dumps(v)}`" if not isinstance(v, str) else f"`{v}`" for v in prop["enum"])
    kinds = prop.get("type")
    if isinstance(kinds, list):
        return " or ".join(_type(schema, {**prop, "type": kind}) for kind in kinds)
    if kinds == "array":
        if "prefixItems" in prop:
            return "[" + ", ".join(_type(schema, item) for item in prop["prefixItems"]) + "]"
        return f"list of {_type(schema, prop['items'])}"
    if kinds == "integer" and ("minimum" in prop or "maximum" in prop):
        low, high = prop.get("minimum"), prop.get("maximum")
        return f"integer {low}–{high:,}" if high is not None else f"integer ≥ {low}"
    if kinds == "string" and "patternMeaning" in prop:
        return str(prop["patternMeaning"])
    if kinds == "string" and "pattern" in prop:
        return f"string matching `{prop['pattern']}`"
    return str(kinds)


def _default(prop: Schema, required: bool) -> str:
    if "default" in prop:
        value = prop["default"]
        if isinstance(value, list):
            return "`[" + ", ".join(str(v) for v in value) + "]`"
        return f"`{json.dumps(value) if not isinstance(value, str) else value}`"
    return "**required**" if required else "see meaning"


ENVIRONMENT = """## Environment variables

`${VAR}` and `${VAR:-default}` are expanded in string values, after the YAML is
parsed and before it is validated:

- `${VAR}` is the value of `VAR`; unset or empty is an error naming the line.
- `${VAR:-default}` is `default` when `VAR` is unset or empty.
- The result is always a string: a value such as `a: [b]` in the environment is
  text, never YAML, so it cannot add keys or list items, and it is validated like
  any other value (an identifier from the environment is still checked). The
  result is not expanded again.
- Anything else that starts with `${` (`${VAR:default}`, `${VAR`) is an error.
"""


YAML_LIMITS = """## YAML anchors and aliases

An alias (`*name`) repeats the value its anchor (`&name`) names, e.g. one
`backoff` list shared by many tables. The loader refuses, naming the file,
the line and the field (exit code 2):

- an alias inside the value it refers to (`tables: &t [*t]`: the value would
  be infinite);
- aliases that together repeat more values than the file itself writes, and
  more than 100,000 (a "billion laughs" of a few lines would grow to
  gigabytes);
- nesting deeper than 64 levels (the deepest valid config has 5).

Loading takes time in proportion to the file: 20,000 one-line table entries
load in about 2 s, 20,000 entries of five keys each (columns, key, backoff) in
about 12 s.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv: list[str]) -> int:
    text = render(json.loads(SCHEMA.read_text(encoding="utf-8")))
    if "--check" in argv:
        if DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC.relative_to(ROOT)} is out of date: run python scripts/gen_config_doc.py")
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
