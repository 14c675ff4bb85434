"""Issue 13, tried as a stranger would: a DSN that is only spaces (an
environment variable set to " ") is refused at load, naming the field.

Found on main: libpq read it as "every default" and the command exited 3
("cannot connect to PostgreSQL (): ... socket /var/run/postgresql/...") about
a server nobody configured.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_blank_dsn_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "cdc.yaml"
    path.write_text(
        "source:\n  kind: postgres\n  dsn: ${CDC_SOURCE_DSN}\nworker:\n  health: null\n"
        "tables:\n  - table: s.t\n",
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CDC_SOURCE_DSN": "   "},
    )
    assert result.returncode == 2, result.stderr
    assert f"{path}:3: source.dsn: the value is blank" in result.stderr
    assert "Traceback" not in result.stderr
