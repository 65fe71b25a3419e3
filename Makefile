# One task runner for people and CI. `make demo` and `make test` install what
# they need from the project's own files (venv + pip, npm ci) on first use.

PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PIP_STAMP := $(VENV)/.installed
NPM_STAMP := node_modules/.installed

.PHONY: install demo test test-unit lint bench bench-servicebus bench-supervisor up clean simulate

install: $(PIP_STAMP) $(NPM_STAMP)

$(PIP_STAMP): requirements.txt requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

$(NPM_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

## demo: the main job, a real end-to-end run on the local stack
demo: install
	$(BIN)/python -m devstack.demo

## test: every test; local servers are started by the test fixtures and stopped after
test: install lint
	REQUIRE_NO_SKIPS=1 $(BIN)/python -m pytest -q -rs

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

lint: install
	$(BIN)/ruff check .

## up: the whole local stack in the foreground (Ctrl-C stops it)
up: install
	$(BIN)/python -m devstack up

## bench: per-order costs, throughput and latency of the whole pipeline on the local stack
bench: install
	$(BIN)/python bench/pipeline_bench.py

bench-servicebus: install
	$(BIN)/python bench/servicebus_bench.py

## bench-supervisor: scan cost of the two Supervisor sources at 1k, 10k and 100k records
bench-supervisor: install
	$(BIN)/python bench/supervisor_bench.py

clean:
	rm -rf $(VENV) node_modules .devstack

## simulate: the seeded simulation of the whole system (SEEDS schedules; failing seeds join sim/regressions.json)
SEEDS ?= 1000
ORDERS ?= 3
simulate: install
	$(BIN)/python -m sim --seeds $(SEEDS) --orders $(ORDERS) --record
