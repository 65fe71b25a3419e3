# One task runner for people and CI. `make demo` and `make test` install what
# they need from the project's own files (venv + pip, npm ci) on first use.

PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PIP_STAMP := $(VENV)/.installed
NPM_STAMP := node_modules/.installed

.PHONY: install demo test test-unit lint preflight smoke bench bench-1000 bench-latency bench-shards bench-servicebus bench-supervisor bench-periodic bench-burst capacity up down status clean browser simulate mutate scale

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

## test: every test; local servers are started by the test fixtures and stopped after.
## Among them (tests/deploy, tests/infra): the preflight against stub subscriptions, the smoke
## test against a local stack, the import of the app against the Python worker's own pins
## (a cached venv under the temp directory, WORKER_PINS_CACHE), and the parse of every Bicep file.
# Four workers (pytest-xdist), a file each at a time: most tests wait on servers, timers
# and deadlines (an e2e file keeps a sixth of a core busy), so four fit on two cores; each
# worker starts its own servers. Files are handed out in the order tests/conftest.py sorts
# them, longest first (--no-loadscope-reorder: xdist would sort them by their number of
# tests), so that no worker is left alone with a long file at the end. The log ends with
# the twenty slowest tests (--durations), to keep CI within its budget.
TEST_WORKERS ?= 4
# The resource-type check against Azure's published definitions (tests/infra/test_resource_types.py)
# needs them beside the repository or in BICEP_TYPES_AZ; without them it is deselected, and said so.
AZURE_TYPES := $(or $(BICEP_TYPES_AZ),$(wildcard ../shared/bicep-types-az))
test: install browser lint
	@$(if $(AZURE_TYPES),,echo "test: Azure's resource type definitions are not here (BICEP_TYPES_AZ): their check is deselected")
	REQUIRE_NO_SKIPS=1 $(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 $(if $(AZURE_TYPES),,-m "not azure_types")

## preflight: check the subscription and the azd environment before `azd provision`
## (azure.yaml's preprovision hook runs the same; standard library only, needs az)
preflight:
	$(PY) -m deploy.preflight

## smoke: one order through the deployed app as a client, timed to Processed (azure.yaml's
## postdeploy hook runs the same); SMOKE_TARGET=local for the stack `make up` runs
SMOKE_TARGET ?= azure
smoke: install
	$(BIN)/python -m deploy.smoke --$(SMOKE_TARGET)

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

## lint: ruff (rules and formatting) over everything, mypy over the product packages (pyproject.toml [tool.mypy])
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## up: the whole local stack in the foreground, printing the console's URL (Ctrl-C stops it);
## options through ARGS, e.g. make up ARGS=--free-ports
up: install
	$(BIN)/python -m devstack up $(ARGS)

## down: stop every stack under .devstack/, also one left by a crashed or killed run
down:
	$(BIN)/python -m devstack down

## status: stacks found under .devstack/, their processes and ports
status:
	$(BIN)/python -m devstack status

## browser: Debian's Chromium and its WebDriver for the console's browser test
## (tests/e2e/test_console_browser.py); installed with apt-get (through sudo when not root)
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
		echo "browser: $$(chromium --version 2>/dev/null | head -1), $$(chromedriver --version | head -1)"; \
	else \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver; \
	fi

## bench: per-order costs, throughput and latency of the whole pipeline on the local stack (1 and 2 hosts)
bench: install
	$(BIN)/python bench/pipeline_bench.py --save

## bench-latency: submit-to-Processed latency of lone orders and of 20 posted together
bench-latency: install
	$(BIN)/python bench/latency_bench.py

## bench-1000: 1,000 orders, 50 in flight, one host; first_attempt must be 100%
bench-1000: install
	BENCH_ORDERS=1000 $(BIN)/python bench/pipeline_bench.py --configs 1x50

## bench-shards: throughput of 1, 2 and 4 shards (a local stack and task hub each) in one run
bench-shards: install
	$(BIN)/python bench/shard_bench.py

bench-servicebus: install
	$(BIN)/python bench/servicebus_bench.py

## bench-supervisor: scan cost of the two Supervisor sources at 1k, 10k and 100k records
bench-supervisor: install
	$(BIN)/python bench/supervisor_bench.py

## bench-burst: ORDERS_BURST orders posted at once against a remote service held to RATE_BURST
## calls/s (429 + Retry-After over it); prints goodput per minute, attempts per order and the
## peak of Processing against MAX_PROCESSING (issue 43's figures)
ORDERS_BURST ?= 2000
RATE_BURST ?= 8
bench-burst: install
	$(BIN)/python bench/burst_bench.py --orders $(ORDERS_BURST) --rate $(RATE_BURST)

## bench-periodic: the Starter's and the Supervisor's ticks timed at N records on the local
## Cosmos server (SIZES=10000,100000; ARGS=--count-interval 30 gives the Starter its count_interval)
SIZES ?= 10000,100000
bench-periodic: install
	$(BIN)/python bench/periodic_bench.py --sizes $(SIZES) $(ARGS)

## capacity: load on every component against its documented limit, the first bottleneck and
## $ per million orders, from one measured order (docs/capacity.md); RATE=, PROFILE= (dev,
## production), SHARDS= (default: the profile's; production: the fewest that fit),
## e.g. make capacity RATE=10000 PROFILE=production
RATE ?= 1000
PROFILE ?= dev
SHARDS ?=
capacity: install
	$(BIN)/python -m bench.capacity --rate $(RATE) --profile $(PROFILE) $(if $(SHARDS),--shards $(SHARDS))

clean:
	rm -rf $(VENV) node_modules .devstack

## simulate: the seeded simulation of the whole system (SEEDS schedules; failing seeds join sim/regressions.json)
SEEDS ?= 1000
ORDERS ?= 3
simulate: install
	$(BIN)/python -m sim --seeds $(SEEDS) --orders $(ORDERS) --record

## mutate: the simulation's mutation run: each mutant of sim/mutants.json (a one-line slip in the
## protocol code) on a temporary copy of the tree against MUTATE_SEEDS schedules; prints what killed
## each one and the score (make mutate SEEDS=200, ARGS="--only NAME,NAME" or ARGS=--all)
MUTATE_SEEDS ?= 60
mutate: install
	$(BIN)/python -m sim.mutate --seeds $(if $(filter command line,$(origin SEEDS)),$(SEEDS),$(MUTATE_SEEDS)) --orders $(ORDERS) $(ARGS)

## scale: the simulation at scale on this commit (issue 21: 100,000 short schedules, 1,000 of 50
## orders), in chunks on every core under nice, each chunk a line in .sim-scale/<commit>.jsonl;
## run it again to resume, ARGS=--report for the summary (sim/scale.py). Hours of both cores.
SCALE_RUNS ?= 1:6000001:50000 2:7000001:25000 3:8000001:25000 50:9000001:1000
scale: install
	$(BIN)/python -m sim.scale $(foreach r,$(SCALE_RUNS),--run $(r)) $(ARGS)
