#!/usr/bin/env bash
# Renders the same N-frame scene several ways and prints wall times and ratios:
#   farm    tessera render --workers 2 (embedded coordinator, two slots)
#   farm1   tessera render --workers 1
#   fresh1  tessera render --workers 1 --fresh-process (one Blender per task)
#   anim    one `blender -b -a` process
#   fresh   one fresh `blender -b -f N` process per frame
# With BASELINE=REV, the farm rows run with that commit's binary too, each
# right after this tree's, with the ratio this tree / baseline.
# With ROUNDS=R [1], every way runs R times, round after round, and each
# figure is the median of its R runs; each ratio to `blender -b -a` is
# taken within a round, and its median and range across the rounds are
# printed (one run of the same way varies by several per cent here).
# Usage: [BASELINE=REV] [ROUNDS=R] scripts/bench-farm.sh [FRAMES] [WIDTH HEIGHT SAMPLES]
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
rounds="${ROUNDS:-1}"
farm2=(); base2=(); farm1=(); base1=(); fresh1=(); basef=(); anim=(); fresh=()
for _ in $(seq "$rounds"); do
  farm2+=("$(farm "$tessera" 2 farm2)"); [ -n "$base" ] && base2+=("$(farm "$base" 2 base2)")
  farm1+=("$(farm "$tessera" 1 farm1)"); [ -n "$base" ] && base1+=("$(farm "$base" 1 base1)")
  fresh1+=("$(farm "$tessera" 1 fresh1 --fresh-process)"); [ -n "$base" ] && basef+=("$(farm "$base" 1 basef --fresh-process)")
  t0=$(now); blender -b "$work/scene.blend" -o "$work/anim/frame_####" -s 1 -e "$n" -a >/dev/null 2>&1; t1=$(now)
  for f in $(seq 1 "$n"); do blender -b "$work/scene.blend" -o "$work/fresh/frame_####" -f "$f" >/dev/null 2>&1; done; t2=$(now)
  anim+=("$(python3 -c "print($t1 - $t0)")"); fresh+=("$(python3 -c "print($t2 - $t1)")")
  rm -rf "$work"/farm2 "$work"/base2 "$work"/farm1 "$work"/base1 "$work"/fresh1 "$work"/basef "$work"/anim "$work"/fresh
done

# Each measure's runs, one argument each: "1.97 2.01 1.95".
python3 - "$n" "$w" "$h" "$s" "${BASELINE:-}" "${farm2[*]}" "${farm1[*]}" "${fresh1[*]}" \
  "${base2[*]:-}" "${base1[*]:-}" "${basef[*]:-}" "${anim[*]}" "${fresh[*]}" <<'PY'
import os, statistics, sys
n, w, h, s, baseline = sys.argv[1:6]
runs = [[float(v) for v in a.split()] for a in sys.argv[6:14]]
farm2, farm1, fresh1, base2, base1, basef, anim, fresh = runs
med = lambda xs: statistics.median(xs) if xs else 0.0
n = int(n)
rounds = len(anim)
print(f"scene: {n} frames, {w}x{h}, {s} samples, {os.cpu_count()} cores"
      + (f"; median of {rounds} rounds" if rounds > 1 else ""))
print(f"{'way':<36}{'wall s':>8}{'s/frame':>9}{'/ anim':>8}")
rows = [("tessera render --workers 2", farm2), ("tessera render --workers 1", farm1),
        ("  --workers 1 --fresh-process", fresh1)]
if baseline:
    rows += [(f"  baseline {baseline} --workers 2", base2), (f"  baseline {baseline} --workers 1", base1),
             (f"  baseline {baseline} --fresh-process", basef)]
rows += [("blender -b -a (one process)", anim), ("blender -b -f N (fresh per frame)", fresh)]
for name, ts in rows:
    # The ratio within each round, then its median.
    ratios = [t / a for t, a in zip(ts, anim)]
    spread = f"  ({min(ratios):.2f}-{max(ratios):.2f}x)" if rounds > 1 else ""
    print(f"{name:<36}{med(ts):8.2f}{med(ts)/n:9.2f}{med(ratios):7.2f}x{spread}")
faster = [f / t for f, t in zip(fresh, farm2)]
spread = f" ({min(faster):.2f}-{max(faster):.2f}x)" if rounds > 1 else ""
print(f"farm (2 workers) is {med(faster):.2f}x faster than a fresh Blender per frame{spread}")
# What the farm adds to each frame over one Blender rendering them all.
print(f"farm cost per frame over blender -a: --workers 1 "
      f"{med([(f - a) / n * 1000 for f, a in zip(farm1, anim)]):.0f} ms")
if baseline:
    ratio = lambda new, old: med([a / b for a, b in zip(new, old)])
    print(f"this tree / baseline: --workers 2 {ratio(farm2, base2):.2f}, --workers 1 {ratio(farm1, base1):.2f}, "
          f"--fresh-process {ratio(fresh1, basef):.2f} (below 1 is faster)")
PY
