#!/usr/bin/env bash
# The main job on the embedded default: what omni sees and chooses on this machine, then
# speech from a tiny random-weight model omni creates locally (it checks the install; it is
# not a voice).
set -euo pipefail
cd "$(dirname "$0")/.."
OMNI=${VENV:-.venv}/bin/omni
OUT=.omni-demo
mkdir -p "$OUT"
set -x
"$OMNI" --version
"$OMNI" plugins list
"$OMNI" explain platform
"$OMNI" explain attention
"$OMNI" doctor
"$OMNI" speak "Hello from omni. This is the embedded default." --seed 0 --out "$OUT/hello.wav"
"$OMNI" speak "Streaming, one sentence at a time. Here is the second." --seed 0 --stream --out "$OUT/stream.wav"
