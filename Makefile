# fairseq-residual: the two commands are `make test` and `make demo` (`make test-fast`: the tests that start
# no process, see tests/process_guard.py).
# Both create the virtual environment in .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers: the suite's fairseq runs are single-threaded, so one worker per core; tests go one by
# one to whichever worker is free, those sharing a module-scoped fixture to one worker (--dist loadgroup, the
# groups made in tests/conftest.py), so that a module's trained fixtures are built once
PYTEST_WORKERS ?= 2

.PHONY: venv test test-fast demo demo-long clean-venv

venv: $(STAMP)

# fairseq 0.12.2 does not import on Python 3.11; fairseq-fixed is its source release with the fix.
# It must be built without build isolation against the CPU torch installed first, otherwise pip
# pulls a multi-GB CUDA torch into the build environment (see README, "Install").
$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 cython numpy setuptools wheel
	$(PY) -c "import fairseq" 2>/dev/null || $(PIP) install --no-build-isolation fairseq-fixed==0.12.3.1
	$(PIP) install -q --no-build-isolation -e ".[test]"
	touch $(STAMP)

# the whole suite: what CI runs (.ci/run)
test: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup tests $(PYTEST_ARGS)

# the fast lane: every test not marked slow, i.e. every test that starts no process (a test that does and is
# not marked fails, saying so: tests/process_guard.py); fairseq's tools only in-process, in one smoke test
test-fast: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow" tests $(PYTEST_ARGS)

demo: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH bash scripts/run_demo.sh $(DEMO_ARGS)

demo-long: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH bash scripts/run_demo.sh --long $(DEMO_ARGS)

clean-venv:
	rm -rf $(VENV)
