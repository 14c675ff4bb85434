#!/usr/bin/env bash
# Installs what cdc-sync needs from the system's packages when it is missing:
# redis-server, PostgreSQL server binaries, unixODBC and FreeTDS, and promtool
# (the prometheus package: tests/cdc/test_operations_docs.py checks the alert rules).
# Does nothing when everything is there; needs root (or sudo) otherwise.
set -euo pipefail

have_postgres() {
  command -v postgres >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null
}

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
have_postgres || missing+=(postgresql)
[ -e /usr/lib/x86_64-linux-gnu/libodbc.so.2 ] || [ -e /usr/lib/aarch64-linux-gnu/libodbc.so.2 ] \
  || ldconfig -p 2>/dev/null | grep -q 'libodbc.so.2' || missing+=(unixodbc)
ldconfig -p 2>/dev/null | grep -q 'libtdsodbc' || compgen -G "/usr/lib/*/odbc/libtdsodbc.so" >/dev/null \
  || missing+=(tdsodbc)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "installing missing system packages: ${missing[*]}" >&2
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get is not available: install ${missing[*]} with your package manager" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "need root to install ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian packages start system-wide services we do not use: the tests and
# the demo start their own servers on free loopback ports.
$SUDO service redis-server stop >/dev/null 2>&1 || true
$SUDO service postgresql stop >/dev/null 2>&1 || true
$SUDO service prometheus stop >/dev/null 2>&1 || true
