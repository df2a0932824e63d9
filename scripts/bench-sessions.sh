#!/usr/bin/env bash
# Warm Blender sessions vs a fresh Blender process per task, on one worker slot:
# renders FRAMES frames (default 24) of two scenes made by blender/make_scene.py
#   (a) anim   a tiny animated scene (64x48, 8 samples)
#   (b) heavy  a scene whose load dominates: 1 M polygons and a packed 4k texture, 1 sample
# and prints the per-frame time of each way and the ratio.
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
make_scene() { blender -b --factory-startup --python-exit-code 2 --python blender/make_scene.py -- --out "$@" >/dev/null 2>&1; }
echo "making scenes (the heavy one takes a while)..." >&2
make_scene "$work/anim.blend" --kind anim --width 64 --height 48 --samples 8 --frames "$n"
make_scene "$work/heavy.blend" --kind heavy --width 64 --height 48 --samples 1 --frames "$n"

now() { date +%s.%N; }
run() { # scene mode -> seconds
  local scene="$1"; shift
  local t0; t0=$(now)
  "$tessera" render "$scene" --frames "1-$n" --workers 1 "$@" -o "$work/out-$RANDOM" >/dev/null 2>&1
  python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$(now)"
}
printf '%-8s %14s %14s %8s\n' scene "fresh s/frame" "warm s/frame" ratio
for s in anim heavy; do
  fresh=$(run "$work/$s.blend" --fresh-process)
  warm=$(run "$work/$s.blend")
  python3 - "$s" "$n" "$fresh" "$warm" <<'PY'
import sys
s, n, fresh, warm = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(f"{s:<8} {fresh / n:14.3f} {warm / n:14.3f} {fresh / warm:7.1f}x")
PY
done
echo "($n frames on one slot, wall time of tessera render including its start-up; $(nproc) cores)"
