# One command per chore. `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pyrouq-installed
DOCS_STAMP := $(VENV)/.pyrouq-docs-installed

.PHONY: demo test test-slow test-tutorials lint format bench docs install clean

# Create the virtual environment and install pyrouq editable with its dev extra.
# The stamp makes a second call install nothing (until pyproject.toml changes).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The docs extra (Sphinx, myst-nb, furo) on top of the dev install; idempotent like $(STAMP).
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,docs]'
	touch $(DOCS_STAMP)

## The main job.
demo: $(STAMP)
	$(BIN)/pyrouq fit bayesian-lenet --epochs 2

## Lint (ruff, mypy) and the fast test suite (doctests included; slow tests excluded). The
## suite includes tests/docs/test_tutorials.py, which runs the tutorials in smoke mode.
test: $(STAMP) lint
	$(BIN)/python -m pytest -q --doctest-modules pyrouq tests

## Execute every tutorials/*.ipynb in smoke mode (CI=1 in the kernel), nothing written back.
## To store the outputs of a full run instead: $(BIN)/python tutorials/execute.py
test-tutorials: $(STAMP)
	$(BIN)/python -m pytest -q tests/docs/test_tutorials.py

## Convergence and accuracy checks on real data (minutes).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow -s tests/slow

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy pyrouq

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

## The HTML docs (API pages, tutorials from their stored outputs), warnings as errors.
## Always a full build (about 10 s), so no warning hides in a cached page.
docs: $(DOCS_STAMP)
	rm -rf docs/_build
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

## bayesian-torch is timed beside pyrouq (benchmarks/bench_byon.py): installed into the venv for
## the benchmark only, never a dependency of pyrouq.
bench: $(STAMP)
	-$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps bayesian-torch
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache build dist *.egg-info docs/_build docs/api docs/tutorials/*.ipynb docs/tutorials/none.md
