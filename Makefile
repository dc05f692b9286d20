# One command per chore. `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pyrouq-installed

.PHONY: demo test test-slow lint format bench install clean

# Create the virtual environment and install pyrouq editable with its dev extra.
# The stamp makes a second call install nothing (until pyproject.toml changes).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## The main job.
demo: $(STAMP)
	$(BIN)/pyrouq data

## Lint (ruff, mypy) and the fast test suite (doctests included; slow tests excluded).
test: $(STAMP) lint
	$(BIN)/python -m pytest -q --doctest-modules pyrouq tests

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

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache build dist *.egg-info
