# cdc-sync: `make demo` runs the sidecar on the embedded default, `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install servers test test-mssql lint actionlint typecheck pytest demo bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	rm -f $(VENV)/.installed-*
	touch $@

# System packages (redis-server, PostgreSQL, unixODBC, FreeTDS) when missing.
servers:
	bash scripts/ensure-servers.sh

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

demo: install servers
	$(BIN)/cdc demo

bench: install servers
	$(BIN)/python -m bench

bench-quick: install servers
	$(BIN)/python -m bench --quick

format: install
	$(BIN)/ruff format cdc publishers tests bench
	$(BIN)/ruff check --fix cdc publishers tests bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .demo
