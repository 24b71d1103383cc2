# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

STAMP_BENCH := $(VENV)/.installed-bench

.PHONY: demo test bench lint typecheck clean mutate fuzz

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned to the CPU build that installs from local disk (see pyproject).
$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[ort]'
	touch $@

$(STAMP_DEV): pyproject.toml $(STAMP_RUN)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

$(STAMP_BENCH): pyproject.toml $(STAMP_RUN)
	$(BIN)/pip install -q -e '.[bench]'
	touch $@

# Every model in ../shared/models (override: make bench MODELS=dir); writes bench/results/DATE.{md,png,json} (BENCH_FLAGS=--resume keeps models already measured today)
MODELS ?= ../shared/models
bench: $(STAMP_BENCH)
	$(BIN)/python bench/run_all.py --models $(MODELS) --compare-layouts $(BENCH_FLAGS)

demo: $(STAMP_RUN)
	$(BIN)/kernorch demo

# On demand: does the suite catch broken code? (a fixed list of mutants; prints which survive)
mutate: $(STAMP_DEV)
	$(BIN)/python -m kernorch.devtools.mutate

# On demand: 10 000 malformed ONNX inputs through `kernorch check`; prints the exit-code histogram
fuzz: $(STAMP_DEV)
	$(BIN)/python -m kernorch.devtools.fuzz --count 10000

lint: $(STAMP_DEV)
	$(BIN)/ruff check kernorch tests

typecheck: $(STAMP_DEV)
	$(BIN)/mypy kernorch

test: $(STAMP_DEV) lint typecheck
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
