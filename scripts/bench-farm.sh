#!/usr/bin/env bash
# Renders the same N-frame scene several ways and prints wall times and ratios:
#   farm    tessera render --workers 2 (embedded coordinator, two slots)
#   farm1   tessera render --workers 1
#   fresh1  tessera render --workers 1 --fresh-process (one Blender per task)
#   anim    one `blender -b -a` process
#   fresh   one fresh `blender -b -f N` process per frame
# With BASELINE=REV, the farm rows run with that commit's binary too, each
# right after this tree's, with the ratio this tree / baseline.
# Usage: [BASELINE=REV] scripts/bench-farm.sh [FRAMES] [WIDTH HEIGHT SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust

n="${1:-12}"; w="${2:-160}"; h="${3:-120}"; s="${4:-16}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cargo build -q --release -p tessera-cli
tessera=./target/release/tessera
base=""
if [ -n "${BASELINE:-}" ]; then build_baseline "$BASELINE" release; base="$BASELINE_BIN"; fi
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
  --out "$work/scene.blend" --kind anim --width "$w" --height "$h" --frames "$n" --samples "$s" >/dev/null 2>&1

now() { date +%s.%N; }
farm() { # BIN WORKERS OUT [ARGS...]: prints the wall time
  local t0 t1 bin="$1" workers="$2" out="$3"; shift 3
  t0=$(now); "$bin" render "$work/scene.blend" --frames "1-$n" --workers "$workers" -o "$work/$out" "$@" >/dev/null 2>&1; t1=$(now)
  python3 -c "print($t1 - $t0)"
}
# Untimed warm-up: the first render after the scene is made runs about
# 0.5 s slower whichever binary runs it (measured), and would fall on one side.
"$tessera" render "$work/scene.blend" --frames 1 --workers 2 -o "$work/warm" >/dev/null 2>&1
[ -n "$base" ] && "$base" render "$work/scene.blend" --frames 1 --workers 2 -o "$work/warm" >/dev/null 2>&1
farm2=$(farm "$tessera" 2 farm2); base2=""; [ -n "$base" ] && base2=$(farm "$base" 2 base2)
farm1=$(farm "$tessera" 1 farm1); base1=""; [ -n "$base" ] && base1=$(farm "$base" 1 base1)
fresh1=$(farm "$tessera" 1 fresh1 --fresh-process); basef=""; [ -n "$base" ] && basef=$(farm "$base" 1 basef --fresh-process)
t0=$(now); blender -b "$work/scene.blend" -o "$work/anim/frame_####" -s 1 -e "$n" -a >/dev/null 2>&1; t1=$(now)
for f in $(seq 1 "$n"); do blender -b "$work/scene.blend" -o "$work/fresh/frame_####" -f "$f" >/dev/null 2>&1; done; t2=$(now)

python3 - "$n" "$w" "$h" "$s" "$farm2" "$farm1" "$t0" "$t1" "$t2" "${base2:-0}" "${base1:-0}" "$fresh1" "${basef:-0}" "${BASELINE:-}" <<'PY'
import sys, os
n, w, h, s = sys.argv[1:5]
farm2, farm1, t0, t1, t2, base2, base1, fresh1, basef = map(float, sys.argv[5:14])
baseline = sys.argv[14]
anim, fresh = t1 - t0, t2 - t1
n = int(n)
print(f"scene: {n} frames, {w}x{h}, {s} samples, {os.cpu_count()} cores")
print(f"{'way':<36}{'wall s':>8}{'s/frame':>9}{'/ anim':>8}")
rows = [("tessera render --workers 2", farm2), ("tessera render --workers 1", farm1),
        ("  --workers 1 --fresh-process", fresh1)]
if baseline:
    rows += [(f"  baseline {baseline} --workers 2", base2), (f"  baseline {baseline} --workers 1", base1),
             (f"  baseline {baseline} --fresh-process", basef)]
rows += [("blender -b -a (one process)", anim), ("blender -b -f N (fresh per frame)", fresh)]
for name, t in rows:
    print(f"{name:<36}{t:8.2f}{t/n:9.2f}{t/anim:7.2f}x")
print(f"farm (2 workers) is {fresh/farm2:.2f}x faster than a fresh Blender per frame")
# What the farm adds to each frame over one Blender rendering them all.
print(f"farm cost per frame over blender -a: --workers 1 {(farm1 - anim) / n * 1000:.0f} ms")
if baseline:
    print(f"this tree / baseline: --workers 2 {farm2/base2:.2f}, --workers 1 {farm1/base1:.2f}, "
          f"--fresh-process {fresh1/basef:.2f} (below 1 is faster)")
PY
