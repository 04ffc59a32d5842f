# Holdfast: `make demo` and `make test` work on a fresh machine (Python 3.11+ with venv).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The demo needs only the core install (no pyspark, pyarrow, linters): a small venv.
CORE_STAMP := $(VENV)/.core-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
# mypy cannot follow setuptools' package-dir mapping, so it checks a tree of links.
TYPES  := .typecheck/holdfast

.PHONY: demo test lint typecheck docs pytest bench chaos mutation proto clean

$(CORE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The distribution was called holdfast before it became holdfast-mq: drop the old one.
	$(BIN)/python -m pip uninstall --quiet --yes holdfast 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e .
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Starts a sqlite broker and the local proxy, and kills each of them mid-stream.
demo: $(CORE_STAMP)
	$(BIN)/python examples/outage_demo.py

test: lint typecheck docs pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

$(TYPES):
	mkdir -p $(TYPES)
	for d in proto server sdk broker proxy admin pool; do ln -sfn ../../$$d $(TYPES)/$$d; done

typecheck: $(STAMP) $(TYPES)
	MYPYPATH=.typecheck $(BIN)/mypy -p holdfast.proto -p holdfast.server -p holdfast.sdk -p holdfast.broker -p holdfast.proxy -p holdfast.admin -p holdfast.pool
	MYPYPATH=.typecheck $(BIN)/mypy tests examples bench mutation

# The documentation site (docs/, MkDocs); strict, so a broken link or reference fails.
docs: $(STAMP) $(TYPES)
	$(BIN)/mkdocs build --strict --quiet

# Real components the tests start themselves: Java for the Spark tests. Installed here
# when missing (Debian's package; CI runs as root), so no test skips for want of it.
JAVA_STAMP := $(VENV)/.java-stamp
$(JAVA_STAMP): $(CORE_STAMP)
	if ! command -v java >/dev/null 2>&1 && [ -z "$$JAVA_HOME" ]; then \
		apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	fi
	touch $(JAVA_STAMP)

# And redis-server (with redis-cli) for the Redis store's tests: Debian's package.
REDIS_STAMP := $(VENV)/.redis-stamp
$(REDIS_STAMP): $(CORE_STAMP)
	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then \
		apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; \
	fi
	touch $(REDIS_STAMP)

# Three workers (pytest-xdist), one test file per worker at a time: most tests wait on
# servers they started, so the two cores sit half idle with two workers (573 s of
# pytest, 8.5 CPU-minutes); three ran the same suite in 463 s (9.2 CPU-minutes) on the
# same quiet 2-core host. Module-scoped fixtures stay in one worker. Files go out in
# collection order, longest first (tests/conftest.py, LONGEST_FIRST), not xdist's
# most-tests-first.
PYTEST_WORKERS ?= 3
pytest: $(STAMP) $(JAVA_STAMP) $(REDIS_STAMP) $(TYPES)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The long randomized fault schedule (HOLDFAST_CHAOS_SECONDS, HOLDFAST_CHAOS_SEED).
chaos: $(STAMP)
	HOLDFAST_CHAOS=1 $(BIN)/pytest -q -s -m chaos tests/faults/test_chaos.py

# The bench extra (nats-py, for the JetStream comparison) only for the bench.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/run.py

# Mutation testing of the broker's rules (cosmic-ray; mutation/targets.toml), not in make test.
# `make mutation TARGETS=lua-delivery` runs the targets named only.
MUTATION_STAMP := $(VENV)/.mutation-stamp
$(MUTATION_STAMP): $(STAMP) $(JAVA_STAMP) $(REDIS_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,mutation]'
	touch $(MUTATION_STAMP)

mutation: $(MUTATION_STAMP)
	$(BIN)/python -m mutation.mutate $(TARGETS)

proto: $(STAMP)
	$(BIN)/python proto/generate.py

clean:
	rm -rf $(VENV) site .typecheck .pytest_cache .mypy_cache .ruff_cache *.egg-info build
