# The two set-up commands: `make demo` and `make test`. Both create .venv and install if needed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install demo test lint ui bench clean system-deps

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	$(BIN)/stage2 demo --out .demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

system-deps:
	@bash scripts/system-deps.sh

test: lint system-deps
	$(BIN)/python -m pytest -q

ui: $(STAMP)
	$(BIN)/python -m pipelines.ui

bench: $(STAMP)
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.readme

clean:
	rm -rf .demo .dagster_home
