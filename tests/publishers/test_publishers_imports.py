"""publishers/ is usable alone by applications: it imports nothing from cdc/,
and the subscriber pulls in none of the daemon's heavy dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cdc.errors
import publishers.errors

ROOT = Path(__file__).resolve().parents[2]
_PROBE = """
import json, sys
import publishers.subscriber, publishers.manager, publishers.control, publishers.leases
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by_publishers() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(out.stdout))


def test_publishers_loads_no_cdc_and_no_daemon_dependencies() -> None:
    loaded = _loaded_by_publishers()
    forbidden = {"cdc", "yaml", "jsonschema", "psycopg", "pyodbc"}
    assert not {name for name in loaded if name.partition(".")[0] in forbidden}


def test_cdc_errors_are_the_publishers_classes() -> None:
    assert cdc.errors.CdcError is publishers.errors.CdcError
    assert cdc.errors.TransientError is publishers.errors.TransientError
    assert issubclass(cdc.errors.SourceUnavailable, publishers.errors.TransientError)
    assert issubclass(cdc.errors.ConfigError, publishers.errors.CdcError)
