# Quick start: `make demo` and `make test` on a machine with only Python 3.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The venv's interpreter, so pyright sees the installed dependencies; no check for a
# newer pyright (a network call).
PYRIGHT := PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(BIN)/pyright --pythonpath $(BIN)/python

.PHONY: demo test test-slow bench-smoke smoke-lowest peer lint format bench gpu-kernels docs clean

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
	$(PYRIGHT)
	$(BIN)/python -m pytest -n 2 -m "not slow"

# The tests marked `slow` (several processes, 8 devices, the NUTS example, the
# conformance matrix's other half, the longer second checks of a kind): out of
# `make test` to keep it at five minutes on two cores; CI runs them (.ci/run).
test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 2 -m slow

# The benchmark scripts run (--quick) and their variants agree; not timed, and out of
# `make test` (CI runs it once, in .ci/run).
bench-smoke: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 2 benchmarks/test_smoke.py

# Proves the dependency floors in pyproject.toml: resolves the lowest versions of
# the direct dependencies, numpyro's extra included (`uv pip compile
# --resolution lowest-direct --extra numpyro`), installs
# exactly those in a fresh throwaway venv, eqxprob itself with --no-deps, and runs
# .ci/lowest_smoke.py (a quick pass over the core). uv comes from PyPI into a venv
# of its own there, so this needs only $(PYTHON), the lowest Python supported.
smoke-lowest:
	@set -eu; start=$$(date +%s); \
	tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/eqxprob-lowest.XXXXXX"); \
	trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/uv"; \
	"$$tmp/uv/bin/python" -m pip install --quiet --disable-pip-version-check uv; \
	uv="$$tmp/uv/bin/uv"; \
	$(PYTHON) -m venv --without-pip "$$tmp/env"; \
	py="$$tmp/env/bin/python"; \
	"$$uv" pip compile --quiet --no-config --resolution lowest-direct \
		--extra numpyro --python "$$py" pyproject.toml -o "$$tmp/lowest.txt"; \
	echo "smoke-lowest: lowest-direct pins:"; grep -v '^ *#' "$$tmp/lowest.txt"; \
	"$$uv" pip install --quiet --no-config --python "$$py" -r "$$tmp/lowest.txt"; \
	"$$uv" pip install --quiet --no-config --python "$$py" --no-deps .; \
	(cd "$$tmp" && "$$py" -I "$(CURDIR)/.ci/lowest_smoke.py"); \
	echo "smoke-lowest: passed in $$(( $$(date +%s) - start ))s (install included)"

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(VENV)/.installed-bench
	for f in benchmarks/[!_]*.py; do \
		[ $$f = benchmarks/gpu_kernels.py ] || $(BIN)/python $$f || exit 1; done

# Kernels per step of benchmarks/peers.py's programs on an NVIDIA H100, compiled
# without one (benchmarks/gpu_kernels.py). A venv of its own, .venv-gpu, holds the
# CUDA plugin matching its jaxlib and NVIDIA's ptxas (about 450 MB), so that the
# plugin never loads in `make test`.
GPU_VENV := .venv-gpu
gpu-kernels:
	[ -x $(GPU_VENV)/bin/python ] || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet -e ".[bench,numpyro]"
	$(GPU_VENV)/bin/python -m pip install --quiet "nvidia-cuda-nvcc>=13.0.48,<14" \
		"jax-cuda13-plugin==$$($(GPU_VENV)/bin/python -c 'import jaxlib; print(jaxlib.__version__)')"
	JAX_PLATFORMS=cpu $(GPU_VENV)/bin/python benchmarks/gpu_kernels.py

docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(GPU_VENV) site .pytest_cache .ruff_cache

# numpyro's and distrax's own test files (downloaded at run time), run raw and with
# the class under test wrapped; prints a table (peer/run.py). Not part of make test.
peer: $(VENV)/.installed-test
	$(BIN)/python peer/run.py
