#!/usr/bin/env bash
# Warm Blender sessions vs a fresh Blender process per task, on one worker slot,
# in each Blender runtime: Debian's Blender 3.4 (the binary) and the official
# Blender 4.5 (the `bpy` module from PyPI, installed with `tessera blender
# install 4.5` when missing). For each, renders FRAMES frames (default 24) of
# two scenes made by tests/blender/make_scene.py with that Blender
#   (a) anim   a tiny animated scene (64x48, 8 samples)
#   (b) heavy  a scene whose load dominates: 1 M polygons and a packed 4k texture, 1 sample
# and prints the per-frame time of each way and the ratio. Then one 1920x1080
# frame (16 samples) of the same scene, saved by 3.4, on both runtimes.
# Usage: scripts/bench-sessions.sh [FRAMES]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust

n="${1:-24}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cargo build -q --release -p tessera-cli
tessera=./target/release/tessera
ensure_bpy_runtime "$tessera"
bpy=$(ls -d "$TESSERA_RUNTIMES"/bpy-4.5.*/bin/python | sort -V | tail -n 1)
make_34() { blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- --out "$@" >/dev/null 2>&1; }
make_45() { "$bpy" -I blender/bpy_run.py --script tests/blender/make_scene.py -- --out "$@" >/dev/null 2>&1; }
echo "making scenes with both Blenders (the heavy ones take a while)..." >&2
for v in 34 45; do
  "make_$v" "$work/anim$v.blend" --kind anim --width 64 --height 48 --samples 8 --frames "$n"
  "make_$v" "$work/heavy$v.blend" --kind heavy --width 64 --height 48 --samples 1 --frames "$n"
done
make_34 "$work/hd.blend" --kind still --width 1920 --height 1080 --samples 16 --frames 1

now() { date +%s.%N; }
run() { # scene frames [args] -> seconds
  local scene="$1" frames="$2"; shift 2
  local t0; t0=$(now)
  "$tessera" render "$scene" --frames "$frames" --workers 1 "$@" -o "$work/out-$RANDOM" >/dev/null 2>&1
  python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$(now)"
}
# A first render of each runtime pays its one-time capability probe.
run "$work/anim34.blend" 1 >/dev/null
run "$work/anim45.blend" 1 >/dev/null
printf '%-16s %-8s %14s %14s %8s\n' runtime scene "fresh s/frame" "warm s/frame" ratio
for v in 34 45; do
  name=$([ "$v" = 34 ] && echo "3.4 (blender)" || echo "4.5 (bpy)")
  for s in anim heavy; do
    fresh=$(run "$work/$s$v.blend" "1-$n" --fresh-process)
    warm=$(run "$work/$s$v.blend" "1-$n")
    python3 - "$name" "$s" "$n" "$fresh" "$warm" <<'PY'
import sys
r, s, n, fresh, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
print(f"{r:<16} {s:<8} {fresh / n:14.3f} {warm / n:14.3f} {fresh / warm:7.1f}x")
PY
  done
done
echo "($n frames on one slot, wall time of tessera render including its start-up; $(nproc) cores)"
echo
t34=$(run "$work/hd.blend" 1)
t45=$(run "$work/hd.blend" 1 --blender 4.5)
python3 - "$t34" "$t45" <<'PY'
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
print(f"one 1920x1080 frame, 16 samples, the same scene: 3.4 (blender) {a:.2f} s, 4.5 (bpy) {b:.2f} s, ratio 4.5/3.4 {b / a:.2f}")
PY
