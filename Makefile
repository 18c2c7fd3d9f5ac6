# Two commands do everything on a fresh machine:
#   make demo   set up .venv and run omni on the embedded default
#   make test   set up .venv and run lint, types and every test
VENV ?= .venv
BIN := $(VENV)/bin
SETUP_INPUTS := pyproject.toml cli/pyproject.toml plugin_template/pyproject.toml \
                $(wildcard omni_plugins/*/pyproject.toml) requirements-dev.txt scripts/bootstrap.sh

.PHONY: setup demo test lint types pytest tox-core bench bench-serve bench-pipeline clean

setup: $(VENV)/.installed

$(VENV)/.installed: $(SETUP_INPUTS)
	VENV=$(VENV) bash scripts/bootstrap.sh
	touch $@

demo: setup
	VENV=$(VENV) bash scripts/demo.sh

test: setup lint types pytest tox-core

lint: setup
	$(BIN)/ruff check .

types: setup
	$(BIN)/mypy

# The core's tests, then each plugin's own suite in its own pytest run (as its authors run it).
pytest: setup
	$(BIN)/pytest tests --durations=25
	@for dir in omni_plugins/*/tests; do echo "== $$dir"; $(BIN)/pytest $$dir || exit 1; done

# The core's tests again in an environment without torch (tox.ini, env "core").
tox-core: setup
	$(BIN)/tox -e core -q

bench: setup
	$(BIN)/python benchmarks/cli_startup.py

# omni serve on the embedded defaults: overhead per request, batching throughput, /health under load
bench-serve: setup
	$(BIN)/python benchmarks/serve.py

# the pipeline runtime: connector throughput against memcpy, orchestrator overhead per hop, streaming edges
bench-pipeline: setup
	$(BIN)/python benchmarks/pipeline.py

clean:
	rm -rf $(VENV) .tox .bench
