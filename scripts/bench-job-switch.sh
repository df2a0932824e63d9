#!/usr/bin/env bash
# A slot moving from job to job: JOBS one-frame jobs (each its own scene,
# so each needs a Blender of its own) wait on a coordinator, then one
# worker of SLOTS slots (1 by default) renders them all; the time from the worker's start to
# the last job's end, this tree's worker against BASELINE's, alternating
# round by round, each round on a fresh coordinator. Also the median of the
# worker log's "Blender session started ... ms=" and how many of those
# sessions were a Blender started before their task came (spare=true).
# KIND=heavy makes each scene a load-heavy one (1 M polygons, a packed 4k
# texture: a 175 MiB file to download and load) instead of a small still.
# Usage: BASELINE=REV [JOBS=6] [ROUNDS=3] [SLOTS=1] [KIND=still|heavy] scripts/bench-job-switch.sh [WIDTH HEIGHT SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust

need_baseline
w="${1:-160}"; h="${2:-120}"; s="${3:-16}"
jobs="${JOBS:-6}"; rounds="${ROUNDS:-3}"; slots="${SLOTS:-1}"; kind="${KIND:-still}"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cargo build -q --release -p tessera-cli
tessera="$PWD/target/release/tessera"
build_baseline "$BASELINE" release
base="$BASELINE_BIN"
for i in $(seq "$jobs"); do
  # Scenes that differ (their sample counts), so that no two jobs share a scene.
  blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
    --out "$work/scene$i.blend" --kind "$kind" --width "$w" --height "$h" --samples "$((s + i))" >/dev/null 2>&1
done

now() { date +%s.%N; }
n=0
round() { # NAME BIN: appends its line (see scripts/session_starts.py) to $work/times
  local name="$1" bin="$2"
  n=$((n + 1)); local dir="$work/run$n"; mkdir -p "$dir"
  "$tessera" coordinator --listen 127.0.0.1:0 --data "$dir/data" >"$dir/coord.out" 2>"$dir/coord.log" &
  local coord=$!; pids+=("$coord")
  for _ in $(seq 100); do grep -q "listening on" "$dir/coord.out" 2>/dev/null && break; sleep 0.1; done
  local addr; addr=$(sed -n 's/tessera coordinator listening on //p' "$dir/coord.out" | head -1)
  export TESSERA_COORDINATOR="http://$addr" TESSERA_TOKEN; TESSERA_TOKEN="$(cat "$dir/data/admin.token")"
  local worker_token ids=() i
  worker_token=$("$tessera" users add workers --role worker 2>/dev/null)
  for i in $(seq "$jobs"); do ids+=("$("$tessera" submit "$work/scene$i.blend" --frames 1 2>/dev/null)"); done
  local t0 t1
  t0=$(now)
  TESSERA_TOKEN="$worker_token" "$bin" worker --name "$name" --slots "$slots" --cache "$dir/cache" >"$dir/worker.log" 2>&1 &
  local worker=$!
  for i in "${ids[@]}"; do "$tessera" watch "$i" >/dev/null 2>&1; done
  t1=$(now)
  kill "$worker" "$coord"; wait "$worker" "$coord" 2>/dev/null || true
  python3 scripts/session_starts.py record "$name" "$(python3 -c "print($t1 - $t0)")" "$dir/worker.log" >>"$work/times"
}
# Each binary's first run is untimed.
alternate "$rounds" "$work/times" round "$tessera" "$base"
python3 scripts/session_starts.py table "$work/times" \
  "$jobs one-frame $kind jobs (${w}x$h), waiting, then one worker of $slots slot(s) renders them all; baseline $BASELINE_SHORT"
