#!/usr/bin/env bash
# Installs from the system's packages what cdc-sync's make targets need and a
# fresh Debian/Ubuntu machine lacks. Does nothing when everything is there;
# needs root (or sudo) otherwise.
#
#   scripts/ensure-servers.sh python   the venv module (python3-venv): `make install`
#   scripts/ensure-servers.sh demo     python + redis-server and PostgreSQL: `make demo`
#   scripts/ensure-servers.sh [test]   demo + unixODBC and FreeTDS (pyodbc's libodbc.so.2, the
#                                      FreeTDS driver) and promtool (the prometheus package:
#                                      tests/cdc/test_operations_docs.py checks the alert rules)
#
# PYTHON (default python3) is the interpreter whose venv module is checked.
set -euo pipefail

what="${1:-test}"
PYTHON="${PYTHON:-python3}"

have_postgres() {
  command -v postgres >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null
}

have_libodbc() {
  [ -e /usr/lib/x86_64-linux-gnu/libodbc.so.2 ] || [ -e /usr/lib/aarch64-linux-gnu/libodbc.so.2 ] \
    || ldconfig -p 2>/dev/null | grep -q 'libodbc.so.2'
}

have_freetds() {
  ldconfig -p 2>/dev/null | grep -q 'libtdsodbc' || compgen -G "/usr/lib/*/odbc/libtdsodbc.so" >/dev/null
}

# Debian and Ubuntu ship the venv module without ensurepip (python3-venv): `python3 -m venv`
# then fails, and leaves a venv without pip behind.
have_venv() {
  "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1
}

venv_package() {
  if [ "$PYTHON" = python3 ]; then
    echo python3-venv
  else
    echo "$(basename "$PYTHON")-venv" # python3.12 -> python3.12-venv
  fi
}

missing=()
case "$what" in
  python | demo | test) ;;
  *)
    echo "usage: $0 [python|demo|test]" >&2
    exit 2
    ;;
esac
command -v "$PYTHON" >/dev/null 2>&1 || missing+=(python3)
have_venv || missing+=("$(venv_package)")
if [ "$what" != python ]; then
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  have_postgres || missing+=(postgresql)
fi
if [ "$what" = test ]; then
  have_libodbc || missing+=(unixodbc)
  have_freetds || missing+=(tdsodbc)
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
fi

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
  command -v sudo >/dev/null 2>&1 || { echo "need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
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
