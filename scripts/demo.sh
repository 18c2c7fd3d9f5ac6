#!/usr/bin/env bash
# The main job on the embedded defaults: what omni sees and chooses on this machine, then an
# image from a tiny random-weight model omni creates locally (it checks the install; it draws
# noise, not pictures), then speech in the default voice: the Piper voice en_US-joe-medium
# that setup installs (without it, omni falls back to a tiny random VITS, and says so).
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
"$OMNI" generate "a red fox in snow" --seed 0 --out "$OUT/fox.png"
"$OMNI" speak "Hello from omni. This is the default voice." --out "$OUT/hello.wav"
"$OMNI" speak "Streaming, one sentence at a time. Here is the second." --stream --out "$OUT/stream.wav"
