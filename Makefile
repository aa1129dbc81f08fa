# One entry point for developers and CI. `make test` creates .venv when it is
# missing (or pyproject.toml changed), installs the project with its dev
# extras, and runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

TYPED = fsm pid_allocator marker_writer raftcoord partition_log spark tests/history_checker.py tests/simulation.py
#: Debian packages the tests use, as binary:package, installed (as root) when
#: the binary is missing: Prometheus's promtool checks the alert rules;
#: Chromium is the browser the console's browser test drives (never one
#: Playwright would download).
DEBIAN_TOOLS := /usr/bin/promtool:prometheus /usr/bin/chromium:chromium

.PHONY: help install debian-tools test test-fast lint typecheck proto demo clean

help:
	@echo "make demo       the main job: local cluster, chaos workload with every fault, Spark audit, verdict"
	@echo "make test       create .venv if needed, install, run the whole test suite"
	@echo "make test-fast  only the fast layer (no multi-process tests)"
	@echo "make lint       ruff + mypy --strict on every package"
	@echo "make proto      regenerate raftcoord/protocol/v1 from proto/"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) debian-tools

debian-tools:
	@missing=$$(for t in $(DEBIAN_TOOLS); do test -x $${t%%:*} || echo $${t##*:}; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages: $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages (install them as root): $$missing"; \
	  fi; \
	fi

test: $(STAMP) debian-tools
	$(PY) -m pytest -n 2 --dist loadscope $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy --strict $(TYPED)

typecheck: $(STAMP)
	$(PY) -m mypy --strict $(TYPED)

proto: $(STAMP)
	$(PY) proto/generate.py

demo: $(STAMP)
	$(VENV)/bin/raftcoord demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
