"""Several sidecars on one host, each with its own health port: the two ways
docs/KUBERNETES.md ("Several sidecars on one host") gives, each run for real."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from cdc.config import load_config
from cdc.devservers import free_port
from tests.deploy.sidecar_process import Sidecar, tracked_config

FROM_ENVIRONMENT = "'${CDC_HEALTH:-127.0.0.1:9478}'"


def cdc_health(config: Path, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`cdc health` as a sidecar's HEALTHCHECK runs it: with that sidecar's environment."""
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "health", "-c", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, **environ},
        timeout=60,
    )


def healthz(address: str) -> int:
    with urllib.request.urlopen(f"http://{address}/healthz", timeout=5) as response:
        return int(response.status)


async def test_one_file_with_the_port_from_the_environment(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    """``health: ${CDC_HEALTH:-127.0.0.1:9478}``: the same file, a port per sidecar
    from its environment (a systemd unit's Environment=, a container's -e)."""
    config = await tracked_config(
        tmp_path / "tables.yaml", postgres_dsn, redis_url, pg_schema, namespace, health=FROM_ENVIRONMENT
    )
    assert load_config(config, environ={}).worker.health == ("127.0.0.1", 9478)  # the default
    ports = [free_port(), free_port()]
    sidecars = [await Sidecar.start(config, {"CDC_HEALTH": f"127.0.0.1:{port}"}) for port in ports]
    try:
        for sidecar, port in zip(sidecars, ports, strict=True):
            listening = await sidecar.wait_for_log("health server listening")
            assert listening["address"] == f"127.0.0.1:{port}"
            await sidecar.wait_for_log("sidecar started")
            assert healthz(f"127.0.0.1:{port}") == 200
        # each sidecar's health check, given its environment, probes its own port
        for port in ports:
            probe = cdc_health(config, {"CDC_HEALTH": f"127.0.0.1:{port}"})
            assert probe.returncode == 0 and f"http://127.0.0.1:{port}/healthz" in probe.stdout, probe.stdout
    finally:
        assert [await sidecar.stop() for sidecar in sidecars] == [0, 0]


async def test_port_0_picks_a_free_port_that_the_log_line_gives(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    """``health: 127.0.0.1:0``: each sidecar of the same file gets a free port,
    which its "health server listening" log line gives (field ``address``)."""
    config = await tracked_config(
        tmp_path / "tables.yaml", postgres_dsn, redis_url, pg_schema, namespace, health="127.0.0.1:0"
    )
    sidecars = [await Sidecar.start(config), await Sidecar.start(config)]
    try:
        addresses = [
            (await sidecar.wait_for_log("health server listening"))["address"] for sidecar in sidecars
        ]
        assert len(set(addresses)) == 2 and not any(a.endswith(":0") for a in addresses), addresses
        for sidecar, address in zip(sidecars, addresses, strict=True):
            await sidecar.wait_for_log("sidecar started")
            assert healthz(address) == 200
    finally:
        assert [await sidecar.stop() for sidecar in sidecars] == [0, 0]
