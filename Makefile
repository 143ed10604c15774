# agentsite: `make run` starts the site, `make cluster` starts it on several processes as
# deployed, `make test` runs the whole suite. Each sets up everything it needs first, from this
# repository's own files.

# Python 3.13: the first of these that runs (pyenv's shim answers "command not found" for a
# version it does not have active, so each candidate is tried, not just looked up).
PYTHON ?= $(shell for p in python3.13 $$HOME/.pyenv/versions/3.13*/bin/python3.13 \
	/usr/local/bin/python3.13 /usr/bin/python3.13; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null && { echo $$p; break; }; \
	done)
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
WEB_PROCESSES ?= 2
WORKERS ?= 2
STAMP := $(VENV)/.installed

.PHONY: run cluster test lint bench bench-check setup system-packages clean

# The virtualenv is rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.13 not found; set PYTHON=/path/to/python3.13"; exit 1; }
	@# A virtualenv of another Python (an older checkout's) is rebuilt, not reused.
	$(BIN)/python -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null \
		|| { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
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
	DEBUG=1 $(BIN)/python -m agentsite.serve -b 127.0.0.1 -p $(PORT) agentsite.asgi:application

# The site as deployed: PostgreSQL, Redis, WEB_PROCESSES web processes and WORKERS workers
# behind nginx on PORT, from deploy/ (agentsite/cluster.py; data kept in .cluster/). Stop with
# Ctrl-C.
cluster: $(STAMP) system-packages
	$(BIN)/python -m agentsite.cluster --port $(PORT) --web-processes $(WEB_PROCESSES) \
		--workers $(WORKERS)

system-packages:
	scripts/ensure-system-packages

# The whole suite on SQLite, then again (less the browser tests, the tests of agentsite's
# SQLite backend, and the cluster's tests, which bring their own PostgreSQL) on a throwaway
# PostgreSQL server, where row locks and concurrent transactions behave differently. Each pass
# spreads its tests over TEST_PROCESSES processes (pytest-xdist; most tests wait on servers,
# browsers and workers they start), each with its own test database; the cluster's tests stay
# on one of them (tests/conftest.py).
TEST_PROCESSES ?= 2
test: $(STAMP) system-packages
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadscope
	scripts/with-postgres $(BIN)/python -m pytest -m "not browser and not sqlite and not cluster" \
		-p no:cacheprovider -n $(TEST_PROCESSES) --dist loadscope

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DEBUG=1 $(BIN)/mypy .

bench: $(STAMP)
	DEBUG=1 $(BIN)/python -m bench

# The rows with goals, briefly (about a minute): fails when one is worse than its goal by more
# than its run-to-run spread (bench/check.py; docs/benchmarks.md says how that was measured).
bench-check: $(STAMP)
	DEBUG=1 $(BIN)/python -m bench --check

clean:
	rm -rf $(VENV) staticfiles .cluster .pytest_cache .mypy_cache .ruff_cache
