#!/usr/bin/env bash
# Renders the same N-frame scene three ways and prints wall times and ratios:
#   farm   tessera render --workers 2 (embedded coordinator, two slots)
#   anim   one `blender -b -a` process
#   fresh  one fresh `blender -b -f N` process per frame
# Usage: scripts/bench-farm.sh [FRAMES] [WIDTH HEIGHT SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust

n="${1:-12}"; w="${2:-160}"; h="${3:-120}"; s="${4:-16}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cargo build -q --release -p tessera-cli
tessera=./target/release/tessera
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
  --out "$work/scene.blend" --kind anim --width "$w" --height "$h" --frames "$n" --samples "$s" >/dev/null 2>&1

now() { date +%s.%N; }
t0=$(now); "$tessera" render "$work/scene.blend" --frames "1-$n" --workers 2 -o "$work/farm" >/dev/null 2>&1; t1=$(now)
blender -b "$work/scene.blend" -o "$work/anim/frame_####" -s 1 -e "$n" -a >/dev/null 2>&1; t2=$(now)
for f in $(seq 1 "$n"); do blender -b "$work/scene.blend" -o "$work/fresh/frame_####" -f "$f" >/dev/null 2>&1; done; t3=$(now)

python3 - "$n" "$w" "$h" "$s" "$t0" "$t1" "$t2" "$t3" <<'PY'
import sys
n, w, h, s = sys.argv[1:5]
t0, t1, t2, t3 = map(float, sys.argv[5:9])
farm, anim, fresh = t1 - t0, t2 - t1, t3 - t2
print(f"scene: {n} frames, {w}x{h}, {s} samples, {__import__('os').cpu_count()} cores")
print(f"{'way':<34}{'wall s':>8}{'s/frame':>9}{'vs farm':>9}")
for name, t in [("tessera render --workers 2", farm), ("blender -b -a (one process)", anim), ("blender -b -f N (fresh per frame)", fresh)]:
    print(f"{name:<34}{t:8.2f}{t/int(n):9.2f}{t/farm:9.2f}x")
PY
