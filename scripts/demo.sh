#!/usr/bin/env bash
# The main job on the embedded default: what omni sees and chooses on this machine, then
# an image and speech from tiny random-weight models omni creates locally (they check the
# install; they draw noise and make sound, not pictures or a voice), then the same words in
# a real voice: the Piper voice en_US-joe-medium that setup installs.
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
"$OMNI" speak "Hello from omni. This is the embedded default." --seed 0 --out "$OUT/hello.wav"
"$OMNI" speak "Streaming, one sentence at a time. Here is the second." --seed 0 --stream --out "$OUT/stream.wav"
"$OMNI" speak "Hello from omni. This voice is real." --model joe --out "$OUT/joe.wav"
