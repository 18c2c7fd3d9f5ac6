# Two commands do everything on a fresh machine:
#   make demo   set up .venv and run omni on the embedded default
#   make test   set up .venv and run lint, types and every test
VENV ?= .venv
BIN := $(VENV)/bin
# vLLM's CPU build pins torch and transformers, so the vLLM stage engine has a venv of its own
VENV_VLLM ?= .venv-vllm
SETUP_INPUTS := pyproject.toml cli/pyproject.toml plugin_template/pyproject.toml \
                $(wildcard omni_plugins/*/pyproject.toml) requirements-dev.txt scripts/bootstrap.sh

.PHONY: setup setup-vllm pytest-vllm demo test lint types pytest tox-core bench bench-serve bench-pipeline clean

setup: $(VENV)/.installed

setup-vllm: $(VENV_VLLM)/.installed

$(VENV_VLLM)/.installed: $(SETUP_INPUTS) scripts/bootstrap-vllm.sh
	VENV_VLLM=$(VENV_VLLM) bash scripts/bootstrap-vllm.sh
	touch $@

$(VENV)/.installed: $(SETUP_INPUTS)
	VENV=$(VENV) bash scripts/bootstrap.sh
	touch $@

demo: setup
	VENV=$(VENV) bash scripts/demo.sh

test: setup setup-vllm lint types pytest pytest-vllm tox-core

lint: setup
	$(BIN)/ruff check .

types: setup
	$(BIN)/mypy

# The core's tests, then each plugin's own suite in its own pytest run (as its authors run it).
pytest: setup
	$(BIN)/pytest tests --durations=25
	@for dir in omni_plugins/*/tests; do \
	  [ "$$dir" = omni_plugins/vllm/tests ] && continue; \
	  echo "== $$dir"; $(BIN)/pytest $$dir || exit 1; done
	@echo "== omni_plugins/vllm/tests/test_probe.py (without vLLM)"; $(BIN)/pytest omni_plugins/vllm/tests/test_probe.py

# The vLLM stage engine's suite, in the venv that has vLLM (its probe's tests run in both)
pytest-vllm: setup-vllm
	$(VENV_VLLM)/bin/pytest omni_plugins/vllm/tests

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
	rm -rf $(VENV) $(VENV_VLLM) .tox .bench
