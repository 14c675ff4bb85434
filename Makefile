# cdc-sync: `make demo` runs the sidecar on the embedded default, `make test` runs every check.
# Each installs first what a fresh Debian/Ubuntu machine lacks (scripts/ensure-servers.sh: the
# system packages, as root or with sudo), then the venv and the project, then runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install system-python servers demo-servers test test-mssql lint actionlint typecheck pytest demo bench bench-quick clean

install: system-python $(STAMP)

# The venv module first: Debian ships python3 without it (python3-venv).
system-python:
	PYTHON=$(PYTHON) bash scripts/ensure-servers.sh python

# A venv that a failed `python3 -m venv` left without pip (no python3-venv then) is made again.
$(STAMP): pyproject.toml | system-python
	$(BIN)/python -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	rm -f $(VENV)/.installed-*
	touch $@

# System packages when missing: the tests' (redis-server, PostgreSQL, unixODBC, FreeTDS,
# promtool) and the demo's (redis-server, PostgreSQL).
servers:
	PYTHON=$(PYTHON) bash scripts/ensure-servers.sh test

demo-servers:
	PYTHON=$(PYTHON) bash scripts/ensure-servers.sh demo

lint: install actionlint
	$(BIN)/ruff check cdc publishers tests bench
	$(BIN)/ruff format --check cdc publishers tests bench
	$(BIN)/python scripts/code_shape.py

# The CI workflows (.github/workflows), checked by actionlint (the test extra installs it).
actionlint: install
	$(BIN)/actionlint -no-color -oneline -shellcheck= -pyflakes= .github/workflows/*.yml

typecheck: install
	$(BIN)/mypy

pytest: install servers
	$(BIN)/pytest; status=$$?; if [ $$status -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$status

test: lint typecheck pytest

# The SQL Server proof: CDC_TEST_MSSQL_DSN, or a SQL Server 2022 container where Docker
# answers; through every installed ODBC driver. Without a server: exit 2 with the reason.
test-mssql: install servers
	$(BIN)/python scripts/test_mssql.py

# DEMO_ARGS bounds or tunes it, e.g. make demo DEMO_ARGS='--duration 20'.
demo: install demo-servers
	$(BIN)/cdc demo $(DEMO_ARGS)

bench: install servers
	$(BIN)/python -m bench

bench-quick: install servers
	$(BIN)/python -m bench --quick

format: install
	$(BIN)/ruff format cdc publishers tests bench
	$(BIN)/ruff check --fix cdc publishers tests bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .demo
