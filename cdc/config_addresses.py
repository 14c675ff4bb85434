"""The config's two network addresses, checked when the file is loaded:
``worker.health`` (where the health server listens) and the parts of
``redis.url`` that redis-py would otherwise misread in silence.

Both raise ValueError with the message (the loader adds file, line and
field); neither message ever quotes the Redis URL, which may hold a password.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, parse_qsl, urlsplit

from cdc.config_yaml import shown

_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
DEFAULT_HOST = "127.0.0.1"


def parse_health_address(value: str) -> tuple[str, int]:
    """``host:port``, ``[IPv6]:port`` or ``:port`` (on 127.0.0.1) -> (host, port);
    an IPv6 host is returned without its brackets."""
    if value.startswith("["):
        host, bracket, port = value[1:].partition("]:")
        if not bracket:
            raise ValueError(f"expected [IPv6]:port such as [::1]:9478, got {shown(value)}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{shown(host)} is not an IPv6 address") from None
    else:
        host, _, port = value.rpartition(":")
        if ":" in host:
            raise ValueError(f"an IPv6 address goes in brackets, as in [::1]:9478; got {shown(value)}")
        host = host or DEFAULT_HOST
        if not _is_hostname(host):
            raise ValueError(f"{shown(host)} is neither an IP address nor a host name")
    if not _is_number(port):
        raise ValueError(f"expected host:port, [IPv6]:port or :port, got {shown(value)}")
    if int(port) > 65535:
        raise ValueError(f"port {int(port)} is out of range (0-65535)")
    return host, int(port)


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def format_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets: what the config file writes."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_hostname(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)


def _port_readable(parts: SplitResult) -> bool:
    try:
        parts.port  # noqa: B018  # raises ValueError when the port is not a number
    except ValueError:
        return False
    return True


# -- redis.url -------------------------------------------------------------------

_ENCODE = "a password holding / @ # ? or % must be percent-encoded (%2F %40 %23 %3F %25)"


def check_redis_url(url: str, *, cluster: bool) -> None:
    """What redis-py would misread in silence: a database that is not a
    number (``redis://host/abc`` was database 0), a port that is not one, a
    ``#fragment`` (the rest of a password after an unencoded ``#``)."""
    try:
        parts = urlsplit(url)
        port_ok = _port_readable(parts)
    except ValueError:  # e.g. an unclosed [ of an IPv6 host
        parts, port_ok = None, False
    if parts is not None and parts.fragment:
        raise ValueError(f"a Redis URL has no #fragment: {_ENCODE}")
    if parts is None or not port_ok:
        raise ValueError(f"the host or port cannot be read: {_ENCODE}")
    databases = [value for key, value in parse_qsl(parts.query, keep_blank_values=True) if key == "db"]
    if parts.scheme != "unix" and parts.path not in ("", "/"):
        databases.append(parts.path[1:])
    for database in databases:
        if not _is_number(database):
            raise ValueError(
                "the database must be a number, as in redis://host:6379/0 or ?db=0 (redis-py "
                f"would use database 0 instead); {_ENCODE}"
            )
    if len(set(map(int, databases))) > 1:
        raise ValueError("the database is given twice, with two numbers (the path and ?db=)")
    if cluster and any(int(database) != 0 for database in databases):
        raise ValueError("a Redis Cluster has database 0 only (cluster: true)")
