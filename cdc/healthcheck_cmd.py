"""``cdc health``: probe the running sidecar's health server where its config
says it listens, for a container's HEALTHCHECK (Docker runs a command inside
the container; it cannot be given an address that the config decides).

Exit codes: 0 healthy (HTTP 200), 1 not (any other status, nothing listening,
a timeout), 2 the config cannot say where to probe (a config error, the
health server turned off, or port 0, which picks a free port at start that
only the sidecar's log line "health server listening" tells).

One line on stdout says what was probed and what came back.
"""

from __future__ import annotations

import http.client
import ipaddress
import urllib.error
import urllib.request
from dataclasses import dataclass

from cdc.config import Config
from cdc.config_addresses import format_address
from cdc.errors import ConfigError

# The body of a 503 says what is wrong ({"ok": false, "redis": "..."}): enough
# of it to read on one line, not a page.
BODY_SHOWN = 300


@dataclass(frozen=True)
class Outcome:
    healthy: bool
    line: str

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else 1


def probe_host(host: str) -> str:
    """Where to connect for a server bound to ``host``: a wildcard address
    (0.0.0.0, ::) listens on every interface of the host, loopback included,
    and the probe runs on that same host (inside the container); any other
    host is probed as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host  # a host name: the server bound what it resolves to
    if address.is_unspecified:
        return "::1" if address.version == 6 else "127.0.0.1"
    return host


def probe_url(config: Config, ready: bool) -> str:
    """The URL to probe for ``config``; ConfigError when the config cannot say."""
    where = f"{config.path}: worker.health"
    if config.worker.health is None:
        raise ConfigError(f"{where} is null: the health server is off, there is nothing to probe")
    host, port = config.worker.health
    if port == 0:
        raise ConfigError(
            f"{where} has port 0: the sidecar picks a free port at start (its log line "
            '"health server listening" gives it), so there is no fixed port to probe: '
            "give a port, e.g. ${CDC_HEALTH:-127.0.0.1:9478}"
        )
    path = "/readyz" if ready else "/healthz"
    return f"http://{format_address(probe_host(host), port)}{path}"


def probe(url: str, timeout: float) -> Outcome:
    """GET ``url``: healthy when it answers 200; the line is what came back.
    Never through a proxy: the environment's HTTP_PROXY is for the
    application's traffic, not for the container's own loopback."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return Outcome(response.status == 200, f"{response.status} {_body(response.read())}")
    except urllib.error.HTTPError as exc:  # 503 and friends: the body says why
        return Outcome(False, f"{exc.code} {_body(exc.read())}")
    except urllib.error.URLError as exc:
        return Outcome(False, _reason(exc.reason))
    except (OSError, http.client.HTTPException) as exc:  # a timeout while reading, a reset
        return Outcome(False, _reason(exc))


def check(config: Config, *, ready: bool, timeout: float) -> Outcome:
    """Probe the sidecar of ``config``: one line saying what was probed, for
    which configured address, and what came back. ConfigError when the
    config cannot say where to probe."""
    url = probe_url(config, ready)
    outcome = probe(url, timeout)
    assert config.worker.health is not None  # probe_url refused it otherwise
    configured = format_address(*config.worker.health)
    state = "healthy" if outcome.healthy else "unhealthy"
    return Outcome(
        outcome.healthy, f"{state}: {url} (worker.health {configured} in {config.path}): {outcome.line}"
    )


def _body(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip().replace("\n", " ")
    return text if len(text) <= BODY_SHOWN else text[:BODY_SHOWN] + "..."


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused: nothing listens there (is the sidecar running, with this config?)"
    if isinstance(reason, TimeoutError):
        return "no answer within the timeout"
    return str(reason)
