# agentsite: `make run` starts the site, `make test` runs the whole suite. Both set up
# everything they need first, from this repository's own files.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: run test lint bench setup system-packages clean

# The virtualenv is rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) not found; set PYTHON=..."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet ".[dev,postgres]"
	@touch $(STAMP)

setup: $(STAMP)

# The demo: SQLite, the offline demo model, demo users, DEBUG on. Stop with Ctrl-C.
run: $(STAMP)
	DEBUG=1 $(BIN)/python manage.py migrate --no-input
	DEBUG=1 $(BIN)/python manage.py seed_demo
	DEBUG=1 $(BIN)/python manage.py recover_runs
	@echo "agentsite on http://127.0.0.1:$(PORT)/"
	DEBUG=1 $(BIN)/daphne -b 127.0.0.1 -p $(PORT) agentsite.asgi:application

system-packages:
	scripts/ensure-system-packages

# The whole suite on SQLite, then again (less the browser tests and the tests of agentsite's
# SQLite backend) on a throwaway PostgreSQL server, where row locks and concurrent
# transactions behave differently.
test: $(STAMP) system-packages
	$(BIN)/python -m pytest
	scripts/with-postgres $(BIN)/python -m pytest -m "not browser and not sqlite" -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DEBUG=1 $(BIN)/mypy .

bench: $(STAMP)
	DEBUG=1 $(BIN)/python -m bench

clean:
	rm -rf $(VENV) staticfiles .pytest_cache .mypy_cache .ruff_cache
