# Developer entry points. The README documents two: `make run` and `make test`.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
MUTATION_STAMP := $(VENV)/.installed-mutation
ARGS ?=
# Test processes of make test (pytest-xdist): the suite mostly waits on Redis, workers and a browser, so two
# processes cut its time by about two fifths on two cores; TEST_PROCESSES=0 runs it in one. The tests marked
# serial (schemathesis's, which xdist's workers leave out) run in one process of their own at the same time (they
# wait on the API as much as the rest wait on Redis); their output follows the others'.
TEST_PROCESSES ?= 2

.PHONY: help venv dev-venv run test lint bench mutation

help:
	@echo "make run    start the dev stack on http://127.0.0.1:8000 (Ctrl+C stops it)"
	@echo "make test   run the test suite (extra pytest arguments: ARGS=...)"
	@echo "make lint   ruff over the project, mypy (strict) over the engine"
	@echo "make bench  run the benchmarks (ARGS=...)"
	@echo "make mutation  mutation testing of the attempt rules, admission and InFlight (docs/testing.md)"

# The interpreter comes from .python-version under pyenv; elsewhere python3
# must already be 3.12+ (or pass PYTHON=python3.12).
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || { \
		if command -v $(PYTHON) >/dev/null 2>&1; then \
			echo "Chasqui needs Python 3.12 or newer, but '$(PYTHON)' is $$($(PYTHON) --version 2>&1)." >&2; \
		else \
			echo "Chasqui needs Python 3.12 or newer, but '$(PYTHON)' was not found." >&2; \
		fi; \
		echo "Install Python 3.12 (pyenv picks it up from .python-version)" \
			"or run: make PYTHON=/path/to/python3.12 $(MAKECMDGOALS)" >&2; \
		exit 1; }
	$(PYTHON) -m venv $(VENV)

# Re-install whenever requirements.txt changes.
$(STAMP): requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install -r requirements.txt
	@touch $@

# Tests and checks need their tools too (requirements-dev.txt, which includes
# requirements.txt); `make run` installs only what runs.
$(DEV_STAMP): requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/python -m pip install -r requirements-dev.txt
	@touch $(STAMP) $@

venv: $(STAMP)

dev-venv: $(DEV_STAMP)

run: venv
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py ensure_admin
	$(BIN)/python manage.py devstack

# The console's browser tests drive Debian's Chromium (Playwright comes from
# requirements-dev.txt); install it when missing.
test: dev-venv
	@test -x /usr/bin/chromium || { \
		if [ "$$(id -u)" = 0 ]; then echo "Installing Chromium for the browser tests..."; \
			apt-get update && apt-get install -y chromium; \
		else echo "Chromium is missing and this is not root: the browser tests will be skipped" \
			"(sudo apt-get install -y chromium to run them)."; fi; }
	@log=$$(mktemp); $(BIN)/pytest -m serial $(ARGS) > $$log 2>&1 & serial=$$!; \
	trap 'kill $$serial 2>/dev/null' INT TERM; \
	echo "$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile -m \"not serial\" $(ARGS)"; \
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile -m "not serial" $(ARGS); status=$$?; \
	wait $$serial; serial_status=$$?; \
	echo; echo "$(BIN)/pytest -m serial $(ARGS)  (run beside the others; its output:)"; cat $$log; rm -f $$log; \
	if [ $$serial_status -eq 5 ]; then serial_status=0; fi; \
	[ $$status -eq 0 ] && [ $$serial_status -eq 0 ]

lint: dev-venv
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: venv
	$(BIN)/python -m bench $(ARGS)

# Mutation testing of the modules [tool.mutmut] in pyproject.toml names, against their unit tests. One mutant
# at a time: the tests share one Redis database and flush it, so two at once would fail each other's tests.
$(MUTATION_STAMP): requirements-mutation.txt requirements-dev.txt requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install -r requirements-mutation.txt
	@touch $@

mutation: $(MUTATION_STAMP)
	rm -rf mutants
	$(BIN)/mutmut run --max-children 1
	$(BIN)/mutmut results
