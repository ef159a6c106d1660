# The same targets locally and in CI. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-smoke lint typecheck bench venv clean docs

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel on this machine's disk; a looser pin lets pip fetch a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m torchbucket demo

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(PY) -m mypy

# Everything but the benchmark smokes, which take as long again: `make test-smoke`
# runs those, and CI (.ci/run) runs both. Three pytest-xdist workers on two
# cores: most of a test's time is spent waiting (modelled latency, DataLoader
# workers starting), and each worker starts its own emulators.
PYTEST_WORKERS ?= 3
# With bytecode caching on, even where the environment turns it off: the
# suite starts some 300 Python processes (emulators, DataLoader workers,
# torchrun ranks, CLI calls), and without __pycache__ (git ignores it) each
# compiles torchbucket and pytest rewrites every test module again in each
# xdist worker (about 20 s of make test on this 2-core VM).
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest

test: lint typecheck
	$(PYTEST) -q tests -m "not bench_smoke" -n $(PYTEST_WORKERS)

test-smoke: $(STAMP)
	$(PYTEST) -q tests -m bench_smoke

# The user guide and the API reference (mkdocs.yml) into site/; --strict makes
# every warning (a broken link, a docstring the reference cannot render) an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# The contenders (gcs-torch-dataflux, google-cloud-storage<3) live in their own
# environment, .venv-bench, so they never change what torchbucket runs on.
bench: $(STAMP)
	bash benchmarks/setup_bench_env.sh
	$(PY) benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) site build dist *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
