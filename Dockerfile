# syntax=docker/dockerfile:1
# The cdc-sync sidecar.
#
#   docker build -t cdc-sync .
#   docker run --rm -v "$PWD/tables.yaml:/etc/cdc/tables.yaml:ro" \
#       -e CDC_SOURCE_DSN=... -e CDC_REDIS_URL=... cdc-sync
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
RUN apt-get update \
    && apt-get install -y --no-install-recommends unixodbc tdsodbc \
    && (odbcinst -q -d -n FreeTDS >/dev/null 2>&1 || odbcinst -i -d -f /usr/share/tdsodbc/odbcinst.ini) \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels cdc-sync
RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin cdc
USER 10001:10001
EXPOSE 9478
# /healthz is served on worker.health (127.0.0.1:9478 by default); python's urllib, no curl in the image
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9478/healthz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["cdc"]
CMD ["run", "-c", "/etc/cdc/tables.yaml"]
