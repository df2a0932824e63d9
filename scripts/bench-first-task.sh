#!/usr/bin/env bash
# A job's first task on a worker that is already up: the time from
# `tessera submit --wait` starting to its end, for one-frame jobs sent one at a
# time to one worker (one slot) of a running coordinator, with the farm idle
# for GAP seconds between jobs (as jobs reach a farm). Each such task needs a
# Blender for its scene:
#   spare      the worker as it starts by default: a spare Blender waits on
#              the idle slot, and the task only loads its scene in it
#   no spare   the same worker with --no-spare-blender: Blender starts when
#              the task arrives
# The two workers alternate, round after round, on the same coordinator and
# scene; prints each job's time, the medians and the ratio.
# Usage: [JOBS=6] [ROUNDS=2] [GAP=3] scripts/bench-first-task.sh [WIDTH HEIGHT SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust

w="${1:-160}"; h="${2:-120}"; s="${3:-16}"
jobs="${JOBS:-6}"; rounds="${ROUNDS:-2}"; gap="${GAP:-3}"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cargo build -q --release -p tessera-cli
tessera="$PWD/target/release/tessera"
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
  --out "$work/scene.blend" --kind still --width "$w" --height "$h" --samples "$s" >/dev/null 2>&1

"$tessera" coordinator --listen 127.0.0.1:0 --data "$work/data" >"$work/coord.out" 2>"$work/coord.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$work/coord.out" 2>/dev/null && break; sleep 0.1; done
addr=$(sed -n 's/tessera coordinator listening on //p' "$work/coord.out" | head -1)
export TESSERA_COORDINATOR="http://$addr" TESSERA_TOKEN="$(cat "$work/data/admin.token")"
worker_token=$("$tessera" users add workers --role worker 2>/dev/null)

now() { date +%s.%N; }
n=0
round() { # KIND [worker flags...]: appends "KIND seconds" per job to $work/times
  local kind="$1"; shift
  n=$((n + 1)); local name="$kind-$n"
  TESSERA_TOKEN="$worker_token" "$tessera" worker --name "$name" --slots 1 --cache "$work/cache-$kind" \
    "$@" >"$work/worker-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do "$tessera" workers 2>/dev/null | grep -q "$name" && break; sleep 0.1; done
  sleep "$gap"
  for _ in $(seq "$jobs"); do
    local t0 t1
    t0=$(now); "$tessera" submit "$work/scene.blend" --frames 1 --wait >/dev/null 2>&1; t1=$(now)
    echo "$kind $(python3 -c "print($t1 - $t0)")" >>"$work/times"
    sleep "$gap"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
# Untimed: the coordinator's first job, and each worker's first scene fetch.
round spare; round none --no-spare-blender; : >"$work/times"
for _ in $(seq "$rounds"); do
  round spare
  round none --no-spare-blender
done
python3 - "$work/times" "$jobs" "$rounds" "$gap" "$w" "$h" "$s" <<'PY'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    name, t = line.split()
    times.setdefault(name, []).append(float(t))
jobs, rounds, gap, w, h, s = sys.argv[2:]
print(f"one-frame jobs ({w}x{h}, {s} samples), one at a time, {gap} s apart, one worker slot: "
      f"{jobs} jobs x {rounds} rounds each way")
for name, label in [("spare", "spare Blender (default)"), ("none", "--no-spare-blender")]:
    ts = times.get(name, [])
    print(f"  {label:<26} median {statistics.median(ts):.3f} s   "
          f"(min {min(ts):.3f}, max {max(ts):.3f})")
a, b = statistics.median(times["spare"]), statistics.median(times["none"])
print(f"spare / no spare: {a / b:.2f} (below 1 is faster); {1000 * (b - a):.0f} ms less per job")
PY
