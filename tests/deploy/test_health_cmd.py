"""`cdc health`: the image's HEALTHCHECK probes where the config says the
health server listens, against a real sidecar and against nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cdc.devservers import free_port
from cdc.healthcheck_cmd import probe_host
from tests.deploy.sidecar_process import Sidecar, docker_healthcheck, tracked_config
from tests.e2e import cdc, wait_for

ROOT = Path(__file__).resolve().parents[2]


def healthcheck_command() -> list[str]:
    """The Dockerfile's HEALTHCHECK command, its program ``cdc`` (pyproject.toml's
    script: cdc.cli:main) run from this checkout."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    found = re.search(r"(?m)^HEALTHCHECK .*\\\n\s+CMD (\[.*\])$", text)
    assert found, "the Dockerfile has no HEALTHCHECK ... CMD [...] (exec form)"
    program, *args = docker_healthcheck(json.loads(found.group(1)))
    assert program == "cdc"
    return [sys.executable, "-m", "cdc.cli", *args]


def image_environment() -> dict[str, str]:
    """The variables the Dockerfile's ENV lines set (KEY=VALUE form)."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    last_stage = text.rsplit("\nFROM ", 1)[1]
    return dict(re.findall(r"(?m)^ENV (CDC_\w+)=(\S+)$", last_stage))


async def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_probe_host_follows_a_wildcard_bind_to_loopback() -> None:
    assert probe_host("0.0.0.0") == "127.0.0.1"
    assert probe_host("::") == "::1"
    assert probe_host("10.1.2.3") == "10.1.2.3"
    assert probe_host("sidecar.internal") == "sidecar.internal"


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    return tmp_path / "tables.yaml"


def write(path: Path, health: str) -> Path:
    path.write_text(
        "source:\n  kind: postgres\n  dsn: postgresql://u@127.0.0.1:1/db\n"
        f"worker:\n  health: {health}\ntables:\n  - table: public.t\n",
        encoding="utf-8",
    )
    return path


def test_nothing_listening_is_unhealthy_exit_1(config_file: Path) -> None:
    port = free_port()
    result = cdc("health", "-c", str(write(config_file, f"0.0.0.0:{port}")))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"unhealthy: http://127.0.0.1:{port}/healthz (worker.health 0.0.0.0:{port} in {config_file}): "
        "connection refused: nothing listens there (is the sidecar running, with this config?)"
    ]


@pytest.mark.parametrize(
    ("health", "says"),
    [
        ("null", "worker.health is null: the health server is off, there is nothing to probe"),
        ("127.0.0.1:0", "worker.health has port 0: the sidecar picks a free port at start"),
        ("'[::1]:99999'", "port 99999 is out of range"),
    ],
)
def test_a_config_that_cannot_say_where_to_probe_is_exit_2(config_file: Path, health: str, says: str) -> None:
    result = cdc("health", "-c", str(write(config_file, health)))
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr and result.stdout == ""


async def test_a_running_sidecar_is_probed_where_its_config_listens(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    """Bound to 0.0.0.0 as in a container: `cdc health` (the HEALTHCHECK, run
    exactly as the Dockerfile writes it) probes it on loopback; a table that
    cannot be followed makes /readyz 503 (`--ready` exit 1, saying why) while
    /healthz stays 200; stopped, it is unhealthy."""
    port = free_port()
    config = await tracked_config(
        tmp_path / "tables.yaml", postgres_dsn, redis_url, pg_schema, namespace, health=f"0.0.0.0:{port}"
    )
    config.write_text(config.read_text() + f"  - table: {pg_schema}.missing\n")
    sidecar = await Sidecar.start(config)
    try:
        listening = await sidecar.wait_for_log("health server listening")
        assert listening["address"] == f"0.0.0.0:{port}"
        await sidecar.wait_for_log("sidecar started")

        environ = {**os.environ, **image_environment()}
        assert environ["CDC_CONFIG"] == "/etc/cdc/tables.yaml"
        environ["CDC_CONFIG"] = str(config)  # where this test's config is, as a mount would put it
        probe = subprocess.run(healthcheck_command(), capture_output=True, text=True, env=environ, timeout=30)
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert probe.stdout.startswith(
            f"healthy: http://127.0.0.1:{port}/healthz (worker.health 0.0.0.0:{port} in "
        )

        async def degraded() -> bool:
            return await status(port, "/readyz") == 503 and await status(port, "/healthz") == 200

        await wait_for(degraded, 30, "the missing table to make /readyz 503")
        ready = cdc("health", "-c", str(config), "--ready")
        assert ready.returncode == 1, ready.stdout + ready.stderr
        assert ready.stdout.startswith(f"unhealthy: http://127.0.0.1:{port}/readyz (worker.health ")
        assert ": 503 " in ready.stdout and f"{pg_schema}.missing" in ready.stdout
    finally:
        assert await sidecar.stop() == 0
    gone = cdc("health", "-c", str(config))
    assert gone.returncode == 1 and "connection refused" in gone.stdout
