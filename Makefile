# pgsub: `make test` on a fresh machine installs everything and runs the suite.
# Targets are idempotent; each installs only what is missing or out of date.

PYTHON      ?= python3.11
UV_VERSION  := 0.13.8
# The other PostgreSQL majors of the publisher matrix (npm's embedded builds; 15 is Debian's).
PG_EMBEDDED := 14=14.23.0-beta.17 16=16.14.0-beta.17 17=17.10.0-beta.17 18=18.4.0-beta.17

TOOLS := .tools
UV    := $(TOOLS)/bin/uv
VENV  := .venv
BIN   := $(VENV)/bin
SYNCED   := $(VENV)/.synced
JARS     := jars/lib/.resolved
POSTGRES := .setup-postgres
HELM_VERSION := v3.22.0
VERSITYGW_VERSION := v1.8.0
# The single-node cluster tests/deploy/test_kubernetes.py installs the chart on (setup/k8s/).
K8S_VERSION := v1.34.4
DEPLOY_TOOLS := $(TOOLS)/.deploy-tools

export UV_PYTHON_DOWNLOADS := never

.PHONY: setup venv jars postgres tools bytecode k8s demo test test-unit check lint typecheck fmt clean help bench bench-stream bench-apply bench-sync bench-conflicts bench-large bench-soak bench-ceiling bench-tables bench-cold bench-bigtable bench-backlog bench-writes bench-receive bench-far

help:
	@echo "make setup   venv with locked dependencies, Delta jars, PostgreSQL binaries, helm, promtool,"
	@echo "             versitygw, docker, a Kubernetes node's binaries (root)"
	@echo "make demo    the daemon on embedded defaults: demo publisher, local Spark, ./warehouse"
	@echo "make test    the full suite (unit, integration against real PostgreSQL and Delta)"
	@echo "make check   ruff, the import layers, mypy --strict, unit tests (a quick pre-commit)"
	@echo "make fmt     format and fix lint"
	@echo "make bench   every scenario beside PostgreSQL's subscriber and the raw limit, one table with"
	@echo "             pgsub's peak memory in each (python -m benchmarks.suite --report prints it again)"
	@echo "             (ROWS, SYNC_ROWS, RATE, LOAD_SECONDS, LARGE_ROWS, SOAK_MINUTES, SOAK_NATIVE_MINUTES, RATES,"
	@echo "             TABLES, TABLE_ROWS, TABLE_RATE; quick:"
	@echo "             ROWS=100000 SYNC_ROWS=200000 LOAD_SECONDS=15 LARGE_ROWS=500000 SOAK_MINUTES=2)"
	@echo "make bench-stream  receive-only vs receive+decode of a 1M-row transaction, best of 3 (ROWS=...)"
	@echo "make bench-apply   1M-row UPDATE and steady pgbench load, pgsub beside PostgreSQL's subscriber"
	@echo "                   (APPLY_WAREHOUSE=s3: pgsub's warehouse in a bucket of versitygw)"
	@echo "make bench-sync    initial sync of a 2M-row table (SYNC_ROWS=...), beside PostgreSQL's subscriber;"
	@echo "                   SYNC_RANGES=1,2,4 one run per CTID range count, SYNC_MASTER=standalone on a cluster,"
	@echo "                   SYNC_REMOTE=local through a Spark Connect server (or SYNC_REMOTE=sc://...),"
	@echo "                   SYNC_SEES=false the copy by Spark tasks (spark.sees_warehouse)"
	@echo "make bench-large   one 5M-row INSERT with streaming on (LARGE_ROWS=...), beside PostgreSQL's"
	@echo "make bench-conflicts  batch apply time with conflict detection on vs off (1M-row UPDATE)"
	@echo "make bench-soak    RATE/s for MINUTES (default 60): lag per 10-minute window, table files,"
	@echo "                   warehouse size per minute (SOAK_ARGS='--deletion-vectors always --retention-hours 1')"
	@echo "make bench-ceiling the highest steady rate each subscriber keeps up with (RATES=...)"
	@echo "make bench-backlog BACKLOG single-row updates written while each subscriber is down,"
	@echo "                   then drained: seconds, transactions/s, beside PostgreSQL's subscriber"
	@echo "make bench-receive the receiver thread's Python per single-row transaction, no server (seconds)"
	@echo "make bench-far     one table's batch on a bucket ROUND_TRIPS ms away (versitygw behind a delay)"
	@echo "make bench-cold    TABLES tables x TABLE_ROWS rows: from \`pgsub run\` (a cold process) to all READY"
	@echo "make bench-tables  TABLES tables x TABLE_ROWS rows: initial sync, then TABLE_RATE updates/s"
	@echo "                   spread over all of them for TABLE_SECONDS, beside PostgreSQL's subscriber"
	@echo "make bench-writes  bytes each batch writes: WRITE_SIZES rows (comma-separated), WRITE_RATE random"
	@echo "                   updates/s for WRITE_MINUTES, warehouse growth; WRITE_NATIVE=1 beside PostgreSQL's"
	@echo "make bench-bigtable a BIG_ROWS-row table (10M), RATE random updates/s for BIG_MINUTES (10):"
	@echo "                   lag per 2 minutes, bytes each MERGE wrote, warehouse growth an hour"

setup: venv jars postgres tools bytecode

venv: $(SYNCED)
jars: $(JARS)
postgres: $(POSTGRES)
tools: $(DEPLOY_TOOLS) k8s

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# The image (deploy/Dockerfile) runs `make venv jars bytecode UV_SYNC_FLAGS=--no-dev`.
# --compile-bytecode, and `bytecode` for pgsub's own packages (installed editable): where
# bytecode cannot be written at run time (the image's user; PYTHONDONTWRITEBYTECODE, which
# this project's machines set), every process would compile its ~1,000 modules again at start,
# about 3 s of CPU against 1 s to import them compiled (docs/performance.md, "A cold start").
UV_SYNC_FLAGS ?=
$(SYNCED): pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked --compile-bytecode --python $(PYTHON) $(UV_SYNC_FLAGS)
	touch $@

# Only what changed is compiled again: a second or so.
bytecode: venv
	$(BIN)/python -m compileall -q -j 0 subscriber apply tablesync conflicts $(wildcard benchmarks tests)

$(JARS): jars/pom.xml
	rm -rf jars/lib
	mvn --quiet --batch-mode -f jars/pom.xml dependency:copy-dependencies \
	    -DincludeScope=runtime -DoutputDirectory=lib \
	    -DincludeGroupIds=io.delta,org.apache.hadoop,software.amazon.awssdk,software.amazon.eventstream,software.amazon.s3.analyticsaccelerator,org.reactivestreams
	touch $@

$(POSTGRES): setup/postgres.sh Makefile
	bash setup/postgres.sh $(PG_EMBEDDED)
	touch $@

# helm and promtool, for the checks of deploy/ (tests/deploy/).
$(DEPLOY_TOOLS): setup/tools.sh Makefile
	bash setup/tools.sh $(HELM_VERSION) $(TOOLS)/bin $(VERSITYGW_VERSION)
	touch $@

# Kubernetes built from the Go module proxy, once (about 11 minutes cold on 2 cores; cached in
# .tools/k8s), with Debian's containerd, runc, etcd and CNI plugins. Root only: as a user it
# says so and the cluster test skips.
k8s:
	K8S_VERSION=$(K8S_VERSION) bash setup/k8s/build.sh

# DEMO_SECONDS=60 make demo stops by itself after a minute; otherwise Ctrl-C.
demo: setup
	$(BIN)/pgsub demo $(if $(DEMO_SECONDS),--seconds $(DEMO_SECONDS))

# Two processes (pytest-xdist), each test file whole in one of them: a test waits on
# PostgreSQL, a stream or a JVM's start for a third of its time, the other runs meanwhile.
# Files in collection order (e2e first: the longest), not xdist's most-tests-first,
# which left the long e2e files for last, one process idle.
TEST_WORKERS ?= 2
test: setup lint typecheck
	$(BIN)/pytest tests --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-unit: venv
	$(BIN)/pytest tests/unit

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo --no-cache   # the layers of docs/architecture.md

typecheck: venv
	$(BIN)/mypy

check: lint typecheck test-unit

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

ROWS ?= 1000000
bench-stream: setup
	$(BIN)/python -m benchmarks.stream_decode --rows $(ROWS)

RATE ?= 3000
LOAD_SECONDS ?= 60
APPLY_WAREHOUSE ?= disk
bench-apply: setup
	$(BIN)/python -m benchmarks.apply_bench --rows $(ROWS) --rate $(RATE) --seconds $(LOAD_SECONDS) \
		--warehouse-in $(APPLY_WAREHOUSE)

SYNC_ROWS ?= 2000000
SYNC_RANGES ?= auto
SYNC_MASTER ?= local[*]
SYNC_REMOTE ?=
SYNC_SEES ?= auto
bench-sync: setup
	$(BIN)/python -m benchmarks.sync_bench --rows $(SYNC_ROWS) --ranges $(SYNC_RANGES) \
		--master '$(SYNC_MASTER)' $(if $(SYNC_REMOTE),--remote '$(SYNC_REMOTE)') \
		--sees-warehouse $(SYNC_SEES)


LARGE_ROWS ?= 5000000
bench-large: setup
	$(BIN)/python -m benchmarks.large_tx --rows $(LARGE_ROWS)

SOAK_MINUTES ?= 10
SOAK_NATIVE_MINUTES ?= $(SOAK_MINUTES)
bench: setup
	$(BIN)/python -m benchmarks.suite --rows $(ROWS) --sync-rows $(SYNC_ROWS) --rate $(RATE) \
	    --seconds $(LOAD_SECONDS) --large-rows $(LARGE_ROWS) --soak-minutes $(SOAK_MINUTES) \
	    --soak-native-minutes $(SOAK_NATIVE_MINUTES) \
	    --ceiling-rates $(RATES) --tables $(TABLES) --table-rows $(TABLE_ROWS) \
	    --table-rate $(TABLE_RATE)

bench-conflicts: setup
	$(BIN)/python -m benchmarks.conflict_cost --rows $(ROWS)

MINUTES ?= 60
SOAK_ARGS ?=
bench-soak: setup
	$(BIN)/python -m benchmarks.soak --minutes $(MINUTES) --rate $(RATE) $(SOAK_ARGS)

TABLES ?= 200
TABLE_ROWS ?= 2000
TABLE_RATE ?= 1000
TABLE_SECONDS ?= 120
bench-tables: setup
	$(BIN)/python -m benchmarks.tables_bench --tables $(TABLES) --rows $(TABLE_ROWS) \
		--rate $(TABLE_RATE) --seconds $(TABLE_SECONDS)

# From `pgsub run` - a cold process, as a user starts it - to every table READY.
bench-cold: setup
	$(BIN)/python -m benchmarks.cold_start --tables $(TABLES) --rows $(TABLE_ROWS)

BIG_ROWS ?= 10000000
BIG_MINUTES ?= 10
BIG_NATIVE_MINUTES ?= 5
# What a batch writes at every table size (docs/performance.md, "What a batch writes").
WRITE_RATE ?= 10
WRITE_MINUTES ?= 10
WRITE_SIZES ?= 1000000
bench-writes: setup
	$(BIN)/python -m benchmarks.writes --sizes $(WRITE_SIZES) --rate $(WRITE_RATE) \
		--minutes $(WRITE_MINUTES) $(if $(WRITE_NATIVE),--native) --out bench-results/writes.json

bench-bigtable: setup
	$(BIN)/python -m benchmarks.soak --rows $(BIG_ROWS) --minutes $(BIG_MINUTES) --rate $(RATE) \
		--native-minutes $(BIG_NATIVE_MINUTES) --window 2 --maintenance-interval 60 \
		--out bench-results/bigtable.json

RATES ?= 1000,2000,4000,8000
bench-ceiling: setup
	$(BIN)/python -m benchmarks.ceiling --rates $(RATES) --seconds $(LOAD_SECONDS)

BACKLOG ?= 200000
bench-backlog: setup
	$(BIN)/python -m benchmarks.backlog --rows $(ROWS) --transactions $(BACKLOG)

bench-receive: setup
	$(BIN)/python -m benchmarks.receive_path --transactions $(BACKLOG)

ROUND_TRIPS ?= 20,40
FAR_ROWS ?= 20000,50
bench-far: setup
	$(BIN)/python -m benchmarks.far_store --round-trips $(ROUND_TRIPS) --rows $(FAR_ROWS)

clean:
	rm -rf $(VENV) $(TOOLS) jars/lib $(POSTGRES) .pytest_cache .mypy_cache .ruff_cache
