#!/usr/bin/env bash
# `tessera render` of a short job, this tree against BASELINE, alternating
# run by run: the wall time of the whole command, from its start to the
# frames on disk, and the first task's Blender session start (read from the
# worker's log line "Blender session started ... ms=", with spare=true when
# the slot's spare Blender took the scene). What it measures is the render's
# first moments: the scene's header and trace, the spare Blender's boot, the
# embedded coordinator's start.
#
# The scene is saved by the Blender LINE names, so that the farm must pick
# that runtime among this machine's: 3.4 (Debian's `blender`, the first
# runtime `tessera render` lists) or 4.5 (the `bpy` module from PyPI,
# installed into $TESSERA_RUNTIMES by `tessera blender install 4.5` when
# missing, as `scripts/test.sh` does). ARGS="..." adds `tessera render`
# arguments to both (e.g. ARGS=--scene-python).
# Usage: BASELINE=REV [LINE=4.5] [ROUNDS=6] [FRAMES=2] [WORKERS=1] [ARGS=...] scripts/bench-render-start.sh [WIDTH HEIGHT SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust

need_baseline
w="${1:-160}"; h="${2:-120}"; s="${3:-16}"
line="${LINE:-4.5}"; rounds="${ROUNDS:-6}"; frames="${FRAMES:-2}"; workers="${WORKERS:-1}"
read -r -a extra <<<"${ARGS:-}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cargo build -q --release -p tessera-cli
tessera="$PWD/target/release/tessera"
build_baseline "$BASELINE" release
base="$BASELINE_BIN"
make=(--factory-startup --python-exit-code 2 --python tests/blender/make_scene.py --)
case "$line" in
  3.4)
    blender -b "${make[@]}" --out "$work/scene.blend" --kind anim --width "$w" --height "$h" \
      --frames "$frames" --samples "$s" >/dev/null 2>&1 ;;
  4.5)
    ensure_bpy_runtime "$tessera"
    python=$(ls -d "$TESSERA_RUNTIMES"/bpy-4.5.*/bin/python | head -1)
    "$python" -I blender/bpy_run.py --script tests/blender/make_scene.py -- --out "$work/scene.blend" \
      --kind anim --width "$w" --height "$h" --frames "$frames" --samples "$s" >/dev/null 2>&1 ;;
  *) echo "error: LINE=$line; use 3.4 or 4.5" >&2; exit 1 ;;
esac
[ -f "$work/scene.blend" ] || { echo "error: the $line scene was not made" >&2; exit 1; }

now() { date +%s.%N; }
one() { # NAME BIN: appends its line (see scripts/session_starts.py) to $work/times
  local name="$1" bin="$2" t0 t1 log="$work/$1.log"
  rm -rf "$work/out"
  t0=$(now)
  RUST_LOG=tessera_worker=info "$bin" render "$work/scene.blend" --frames "1-$frames" --workers "$workers" \
    -o "$work/out" ${extra[@]+"${extra[@]}"} >/dev/null 2>"$log" || { echo "error: $name's render failed; its log:" >&2; cat "$log" >&2; exit 1; }
  t1=$(now)
  python3 scripts/session_starts.py record "$name" "$(python3 -c "print($t1 - $t0)")" "$log" >>"$work/times"
}
# Each binary's first run is untimed (the scene's trace is cached from then on).
alternate "$rounds" "$work/times" one "$tessera" "$base"
python3 scripts/session_starts.py table "$work/times" \
  "tessera render, a $frames-frame scene saved by Blender $line, --workers $workers${ARGS:+ $ARGS}; baseline $BASELINE_SHORT"
