#!/usr/bin/env bash
# One frame whose sampling dominates, one render thread per worker slot:
#   whole  one slot renders the whole frame         (tessera render --workers 1 --tiles 1x1)
#   tiles  two slots render 2x2 tiles, then stitch  (tessera render --workers 2 --tiles 2x2)
# Prints both wall times and the speed-up. Both go through the same farm code,
# so the difference is the tiling alone (including overscan and stitching),
# then each run's phases (scripts/phases.py): set-up, Blender's start and
# scene load, renders, results, stitch, shutdown, and each slot's idle time.
# Usage: [ROUNDS=R] [KEEP=DIR] [OVERSCAN=N] scripts/bench-tiles.sh [WIDTH HEIGHT SAMPLES]
#   ROUNDS=R [1] runs both R times, alternating, and prints each round's
#   speed-up and the median: on a shared virtual machine one render of the
#   same frame varies by several per cent from run to run (measured: the
#   whole frame 44.2-46.7 s), as much as the gap between 1.9x and 2.0x.
#   Phases are shown for the last round.
#   KEEP=DIR keeps the scene, the logs and both frames (whole/, tiles/) in DIR.
#   OVERSCAN=N passes --overscan N to the tiled render; without it the
#   submit chooses from the scene (none for this one: no adaptive sampling,
#   denoising or compositing), and OVERSCAN=16 is the margin every tiled
#   job had before that choice.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust

w="${1:-1920}"; h="${2:-1080}"; s="${3:-32}"
work="${KEEP:-$(mktemp -d)}"; [ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
cargo build -q --release -p tessera-cli
tessera=./target/release/tessera
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
  --out "$work/scene.blend" --kind still --width "$w" --height "$h" --samples "$s" --frames 1 >/dev/null 2>&1

now() { date +%s.%N; }
# Untimed: Blender's read of the new scene (its trace), remembered for both
# runs, so the first does not pay a Blender start that the second does not
# (`tessera deps` traces it; whether a coordinator answers does not matter).
"$tessera" deps "$work/scene.blend" >/dev/null 2>&1 || true
# Logged as JSON at info level: scripts/phases.py says where each run's time went.
export RUST_LOG=info
overscan=(); [ -z "${OVERSCAN:-}" ] || overscan=(--overscan "$OVERSCAN")
rounds="${ROUNDS:-1}"; times=()
for r in $(seq "$rounds"); do
  rm -rf "$work/whole" "$work/tiles"
  t0=$(now); "$tessera" --log-format json render "$work/scene.blend" --frames 1 --workers 1 --threads 1 -o "$work/whole" >/dev/null 2>"$work/whole.log"; t1=$(now)
  "$tessera" --log-format json render "$work/scene.blend" --frames 1 --workers 2 --threads 1 --tiles 2x2 "${overscan[@]}" -o "$work/tiles" >/dev/null 2>"$work/tiles.log"; t2=$(now)
  times+=("$(python3 -c "print($t1 - $t0, $t2 - $t1)")")
done

margin="${OVERSCAN:+$OVERSCAN px overscan (--overscan)}"
[ -n "$margin" ] || margin="$(grep -ao '^tiles: [^{]*' "$work/tiles.log" | head -1)"
python3 - "$w" "$h" "$s" "$margin" "${times[@]}" <<'PY'
import statistics, sys
w, h, s, margin = sys.argv[1:5]
runs = [tuple(map(float, t.split())) for t in sys.argv[5:]]
print(f"one frame {w}x{h}, {s} samples, 1 thread per slot; {margin}")
for i, (whole, tiles) in enumerate(runs, 1):
    label = f"round {i}: " if len(runs) > 1 else ""
    print(f"{label}{'1 slot, whole frame':<30}{whole:8.2f} s")
    print(f"{label}{'2 slots, 2x2 tiles + stitch':<30}{tiles:8.2f} s")
    print(f"{label}speed-up: {whole / tiles:.2f}x")
if len(runs) > 1:
    ratios = [whole / tiles for whole, tiles in runs]
    print(f"median speed-up of {len(runs)} rounds: {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}x)")
PY
read -r whole tiles <<<"${times[-1]}"
echo "where the time went, 1 slot, whole frame:"
python3 scripts/phases.py "$work/whole.log" "$whole"
echo "where the time went, 2 slots, 2x2 tiles:"
python3 scripts/phases.py "$work/tiles.log" "$tiles"
