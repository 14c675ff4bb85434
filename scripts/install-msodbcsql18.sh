#!/usr/bin/env bash
# Installs Microsoft ODBC Driver 18 for SQL Server (msodbcsql18) from Microsoft's apt
# repository on Debian or Ubuntu, as "Install the Microsoft ODBC driver for SQL Server
# (Linux)" on learn.microsoft.com describes; ACCEPT_EULA=Y accepts Microsoft's license.
# Does nothing when the driver is installed; needs root. Needs the network to reach
# packages.microsoft.com (it cannot on the machines this project is developed on).
set -euo pipefail

if odbcinst -q -d 2>/dev/null | grep -q '^\[ODBC Driver 18 for SQL Server\]$'; then
  exit 0
fi
. /etc/os-release
case "${ID}" in
  debian) release="debian/${VERSION_ID%%.*}" ;;
  ubuntu) release="ubuntu/${VERSION_ID}" ;;
  *) echo "install-msodbcsql18: ${ID} is neither Debian nor Ubuntu: see learn.microsoft.com for ${PRETTY_NAME}" >&2; exit 1 ;;
esac
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends curl gnupg ca-certificates unixodbc >/dev/null
curl -fsSL https://packages.microsoft.com/keys/microsoft.asc | gpg --dearmor --yes -o /usr/share/keyrings/microsoft-prod.gpg
curl -fsSL "https://packages.microsoft.com/config/${release}/prod.list" -o /etc/apt/sources.list.d/mssql-release.list
apt-get update -qq
ACCEPT_EULA=Y apt-get install -y -qq --no-install-recommends msodbcsql18 >/dev/null
odbcinst -q -d | grep -q '^\[ODBC Driver 18 for SQL Server\]$'
