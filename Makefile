# Quick start: `make demo` and `make test` on a machine with only Python 3.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint format bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# One stamp per set of extras; re-installs when pyproject.toml changes.
$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-examples
	$(BIN)/python examples/gp_regression.py

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(VENV)/.installed-bench
	for f in benchmarks/[!_]*.py; do $(BIN)/python $$f || exit 1; done

docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) site .pytest_cache .ruff_cache
