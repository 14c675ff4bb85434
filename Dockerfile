# syntax=docker/dockerfile:1
# The cdc-sync sidecar.
#
#   docker build -t cdc-sync:0.5.0 .
#   docker run --rm -v "$PWD/tables.yaml:/etc/cdc/tables.yaml:ro" \
#       -e CDC_SOURCE_DSN=... -e CDC_REDIS_URL=... cdc-sync:0.5.0
#
# ODBC driver: FreeTDS (Debian's tdsodbc), registered with unixODBC as "FreeTDS"
# (DSN: DRIVER=FreeTDS;SERVER=host;PORT=1433;...;TDS_Version=7.4). Microsoft ODBC
# Driver 18 is not in Debian: docs/SQLSERVER.md shows a derived image that adds it.

# -- build: the project's wheel and every dependency's wheel ---------------------
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cdc ./cdc
COPY publishers ./publishers
COPY schemas ./schemas
RUN pip wheel --wheel-dir /wheels .

# -- run ---------------------------------------------------------------------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends unixodbc tdsodbc \
    && (odbcinst -q -d -n FreeTDS >/dev/null 2>&1 || odbcinst -i -d -f /usr/share/tdsodbc/odbcinst.ini) \
    && rm -rf /var/lib/apt/lists/*
# The wheels are this source's, built in the stage above: nothing to pin from an index.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels cdc-sync
RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin cdc
USER 10001:10001
# The config every command reads when no -c is given: `cdc run` and the HEALTHCHECK's
# `cdc health` alike, so `docker run -e CDC_CONFIG=/etc/cdc/other.yaml` moves both.
ENV CDC_CONFIG=/etc/cdc/tables.yaml
EXPOSE 9478
# Probes /healthz where the config's worker.health listens (a wildcard bind such
# as 0.0.0.0:9478 on loopback). `cdc health` exits 2 when the config cannot say
# where; Docker reserves 2, so every failure is reported to it as 1.
# Kubernetes ignores HEALTHCHECK: deploy/kubernetes/ has the httpGet probes.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["sh", "-c", "cdc health --timeout 4 || exit 1"]
ENTRYPOINT ["cdc"]
CMD ["run"]
