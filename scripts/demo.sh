#!/usr/bin/env bash
# The main job on the embedded default: what omni sees, what is installed, and which
# platform it runs on, with the reasons.
set -euo pipefail
cd "$(dirname "$0")/.."
OMNI=${VENV:-.venv}/bin/omni
set -x
"$OMNI" --version
"$OMNI" plugins list
"$OMNI" explain platform
"$OMNI" doctor
