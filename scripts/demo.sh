#!/usr/bin/env bash
# The main job: renders the bundled demo scene through the farm
# (`tessera render`: an embedded coordinator and two local worker slots).
# Installs Blender if missing and builds Tessera first.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
ensure_blender
ensure_rust

out="${1:-out/demo}"
mkdir -p out
echo "== building tessera" >&2
cargo build -q --release -p tessera-cli
echo "== making the demo scene (tests/blender/make_scene.py)" >&2
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
  --out out/demo.blend --kind anim --width 320 --height 240 --frames 12 --samples 16 >out/demo-scene.log 2>&1 \
  || { echo "error: building the demo scene failed; see out/demo-scene.log" >&2; exit 1; }
echo "== rendering 12 frames through the farm" >&2
./target/release/tessera render out/demo.blend --frames 1-12 --workers 2 -o "$out" >/dev/null
echo "frames are in $out/ (frame_0001.png ... frame_0012.png)"
