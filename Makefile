# cat-edge: the two commands of the Quick start, and a few for developers.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo demo-misconfigured test test-fast lint typecheck bench bench-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# MQTT=1: through a private Mosquitto; KEEP=1: the aggregator (dashboard) stays up after the
# summary until Ctrl-C, and the run directory is kept.
demo: $(STAMP)
	$(BIN)/python deploy/demo.py $(if $(MQTT),--mqtt,) $(if $(KEEP),--keep,)

# The demo plus one agent whose feedback does not fit the job: its refusal, its WARNING
# line and exit code 2, while the others train to the target.
demo-misconfigured: $(STAMP)
	$(BIN)/python deploy/demo.py --misconfigured $(if $(MQTT),--mqtt,) $(if $(KEEP),--keep,)

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The unit tier for the edit-test loop: no real servers (Mosquitto, uvicorn, ZeroMQ
# sockets, a browser) and nothing marked slow; under 40 s on two cores.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration and not slow"

# What CI runs before the tests (.ci/run): style, format, types, then the size and
# complexity gate (no function above complexity 20, no module above 700 lines), the
# layering contracts ([tool.importlinter] in pyproject.toml), no import cycles and no
# use of another module's _private names (.ci/imports.py: none allowed), and
# the module table of docs/architecture.md up to date (.ci/architecture.py).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/python .ci/gate.py edge_agent aggregator
	$(BIN)/lint-imports --no-cache
	$(BIN)/python .ci/imports.py edge_agent aggregator
	$(BIN)/python .ci/architecture.py --check docs/architecture.md

# Strict everywhere: the packages ([tool.mypy] packages), and the code that drives them.
typecheck: $(STAMP)
	$(BIN)/mypy --strict
	$(BIN)/mypy --strict tests benchmarks deploy .ci

bench: $(STAMP)
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

# Quick runs of the selection, codec, footprint and ingest benchmarks, each ratio against
# its target in benchmarks/targets.json: one met/missed line per target, then the run's
# JSON; exit 1 if a target is missed, 2 if a benchmark failed (benchmarks/README.md).
bench-check: $(STAMP)
	$(BIN)/python benchmarks/check.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
