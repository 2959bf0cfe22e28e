# The two set-up commands: `make demo` and `make test`. Both create .venv and install what they need:
# `make demo` the `pipeline` extra only (Dagster: what the demo runs), `make test` the `dev` extras
# (tests, lint, every optional backend) on top of it, so `make test` after `make demo` only adds those.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# pip's own progress: a line per package it collects, a bar per download and one while installing.
PIP_FLAGS ?= --progress-bar on
# A pip config that lists extra file:// indexes holding only some projects makes pip warn once per
# project it looks up there ("WARNING: Location 'file:///…/simple/<name>/' is ignored: it is neither a
# file nor a directory"): dozens of lines that hide the progress. Only those lines are dropped.
PIP_NOISE := ^WARNING: Location 'file:.*' is ignored: it is neither a file nor a directory\.$$
# $(call pip_install,ARGS): shows the pip command, runs it with progress and without that noise.
pip_install = @echo '$(PIP) install $(PIP_FLAGS) $(1)'; \
	$(PIP) install $(PIP_FLAGS) $(1) 2> >(grep --line-buffered -v "$(PIP_NOISE)" >&2)
PIP_STAMP := $(VENV)/.pip-upgraded
DEMO_STAMP := $(VENV)/.installed-pipeline
DEV_STAMP := $(VENV)/.installed-dev
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install install-demo demo test test-fast lint ui bench clean system-deps soak docs

# A current pip: the one venv bundles has no install progress bar.
$(PIP_STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "== upgrading pip in $(VENV)"
	$(call pip_install,--upgrade pip)
	@touch $@

$(DEMO_STAMP): pyproject.toml | $(PIP_STAMP)
	@echo "== installing stage2-data with the pipeline extra (Dagster): what make demo and make ui need"
	$(call pip_install,-e ".[pipeline]")
	@touch $@

# dev includes pipeline, so the demo's install is up to date afterwards too.
$(DEV_STAMP): pyproject.toml | $(PIP_STAMP)
	@echo "== installing stage2-data with the dev extras (tests, lint, postgres, dask, k8s, s3)"
	$(call pip_install,-e ".[dev]")
	@touch $@ $(DEMO_STAMP)

install-demo: $(DEMO_STAMP)

install: $(DEV_STAMP)

demo: $(DEMO_STAMP)
	@mkdir -p $(DAGSTER_HOME)
	$(BIN)/stage2 demo --out "$${STAGE2_DEMO_ROOT:-.demo}"

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

system-deps:
	@bash scripts/system-deps.sh

# Tests run in one process a core, at most four (pytest-xdist): every test makes its own folders,
# ports, hub and Dagster instance, so none depends on another's process. The tests that share an
# expensive fixture (a whole build, a web server) run in one worker, which makes it once
# (tests/_groups.py, --dist loadgroup); the others are handed out one by one. PYTEST_WORKERS=0
# runs them in this process, one after another.
PYTEST_WORKERS ?= auto
XDIST = -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadgroup

# The whole suite (what CI runs): lint, then every tier; 23-70 minutes on 2 cores, as fast as the
# machine is that day (docs/benchmarks.md, "The test suite").
test: lint system-deps
	$(BIN)/python -m pytest -q $(XDIST)

# The fast tier (tests/_tiers.py): no browser, database, cluster, S3 server or whole build; about 8
# minutes on 2 cores (docs/benchmarks.md).
test-fast: $(DEV_STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not system"

# The mutation test (tests/test_mutation.py) with N random mutations instead of CI's 100: each a
# random file of the built demo mutated, then `stage2 build`, in LANES lanes side by side (default:
# one a core, at most two). A fresh seed each run (printed with its lanes);
# `make soak N=1000 SEED=<seed> LANES=<lanes>` replays one.
N ?= 1000
soak: $(DEV_STAMP)
	STAGE2_MUTATIONS=$(N) STAGE2_MUTATION_SEED=$(SEED) STAGE2_MUTATION_LANES=$(LANES) \
		$(BIN)/python -m pytest -q -s -p no:cacheprovider \
		tests/test_mutation.py -k test_random_mutations

ui: $(DEMO_STAMP)
	$(BIN)/python -m stage2_pipelines.ui

bench: $(DEV_STAMP)
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.readme

# The documentation site (mkdocs.yml, docs/) on http://127.0.0.1:8000, rebuilt when a page changes.
# CI builds it with --strict (.ci/run): a broken link, page or API reference fails.
# The documentation site on 127.0.0.1:$(DOCS_PORT); a port in use is named with the way to pick another.
DOCS_PORT ?= 8000
docs: $(DEV_STAMP)
	@$(BIN)/python -c 'import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", $(DOCS_PORT)))' 2>/dev/null \
	  || { echo "make docs: port $(DOCS_PORT) on 127.0.0.1 is in use. Fix: stop what serves it, or make docs DOCS_PORT=8001" >&2; exit 2; }
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:$(DOCS_PORT)

clean:
	rm -rf .demo .dagster_home
