#!/usr/bin/env bash
# Create the development environment: CPU torch, omni (core, template, CLI), the CPU plugin,
# and the dev tools. Idempotent; re-run after changing a pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# setuptools' notes about editable builds are for packagers, not for someone setting up omni
pip() { PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install --quiet --upgrade pip
# torch first and pinned: 2.13.0 is the CPU build this project is tested with; an unpinned
# torch resolves to a multi-GB CUDA build. torchvision/torchaudio are kept out on purpose.
pip install --quiet "torch==2.13.0"
pip install --quiet -e ".[serve]" -e ./plugin_template -e ./cli
# Every plugin of this repository, each its own distribution (vendor plugins stay inactive
# where their hardware is absent: `omni explain platform` says why).
plugins=()
for dir in omni_plugins/*/; do plugins+=(-e "./$dir"); done
pip install --quiet "${plugins[@]}"
# The Piper plugin with its CC0 voice (en_US-joe-medium): `omni speak --model joe` speaks English
pip install --quiet -e "./omni_plugins/piper[voice]"
# Mooncake's transfer engine: its CPU build (the CUDA one needs a GPU driver to import)
pip install --quiet -e "./omni_plugins/mooncake[cpu]"
pip install --quiet -r requirements-dev.txt
# Mooncake's engine links libibverbs (RDMA's user-space library) even for TCP transfers
if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq libibverbs1 >/dev/null
  else
    echo "bootstrap: the mooncake connector's tests need libibverbs: sudo apt-get install -y libibverbs1" >&2
  fi
fi
# The playground's browser test drives the system chromium (playwright's own browser download is
# never used): install it where we can, else say how.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
  else
    echo "bootstrap: the browser test (tests/test_serve_playground.py) needs chromium: sudo apt-get install -y chromium" >&2
  fi
fi
"$VENV/bin/omni" --version
