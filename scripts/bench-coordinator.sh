#!/usr/bin/env bash
# The coordinator under load: today's design (BASELINE) and this tree, run
# the same way, side by side with ratios.
#
# For each design and each cell of the sweep (W fake workers x N queued
# tasks) `tessera-load run` starts a fresh coordinator, submits one N-task
# job, registers W workers of SLOTS slots (each worker its own HTTP/2
# connection) that lease, send Progress every second of a RENDER_MS fake
# render, upload a small result and complete, while a client polls
# `ListJobs` + `GetJob` and `/metrics` is scraped every 5 s. After WARMUP
# seconds the window opens for WINDOW seconds (both end early when 10% / 90%
# of the tasks are done). Then `tessera-load recover` times a restart after
# kill -9 with RECOVERY_TASKS tasks on disk, up to the first lease served.
#
# Usage: scripts/bench-coordinator.sh [--store postgres]
#   --store postgres: this tree on PostgreSQL ("new") beside this tree on sled
#                     ("baseline"), on a PostgreSQL 15 server the script starts
#                     (initdb in a temporary directory, fsync and synchronous
#                     commit on, as an unprivileged user), a fresh database per run.
# Environment (defaults in brackets):
#   BASELINE=REV      the design to compare with [4f84794, before the scale work]
#   NEW=REV           measure that commit as "new" instead of this tree (to
#                     measure one change in isolation: NEW=its last commit,
#                     BASELINE=the commit before it); this tree's tessera-load
#                     drives both
#   QUICK=1           W in {10,100} x N in {10k}, recovery with 10k tasks
#   WORKERS="..."     [10 100 1000]          TASKS="..."  [10000 100000 1000000]
#   SLOTS=S [8]       RENDER_MS=MS [1200]    WARMUP=S [5] WINDOW=S [15]
#   JITTER=F [0]      spread of the fake renders, a fraction of RENDER_MS (at
#                     0 the slots that start together stay in step and call
#                     in waves; 0.2 draws each render from 0.8x to 1.2x)
#   SERIAL=1          slots report, then wait for their next task between
#                     renders (`tessera-load run --no-lease-ahead`) instead of
#                     leasing it while they render, as workers do: idle p99
#                     then holds the result's whole round trip
#   ROUNDS=R [1]      runs per design and cell, alternating the designs; the
#                     table shows each column's median (low-load latencies
#                     swing by 2x between runs of one binary: take R >= 3)
#   RECOVERY_TASKS=N [1000000; 0 skips it]
#   SUBMIT_TIMEOUT=S [120] SETUP_TIMEOUT=S [120] RECOVERY_TIMEOUT=S [120]:
#                     a step past its limit prints "timeout" in the table
#   COORD_ARGS="..."  extra `tessera coordinator` arguments for both designs
#   PROFILE=release|dev [release]; OUT=DIR [target/bench-coordinator/DATE]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_rust
ensure_blender

STORE=sled
while [ $# -gt 0 ]; do
  case "$1" in
    --store) STORE="${2:-}"; shift 2 || { echo "error: --store needs a value: postgres" >&2; exit 1; } ;;
    --store=*) STORE="${1#--store=}"; shift ;;
    *) echo "error: unknown argument $1; usage: scripts/bench-coordinator.sh [--store postgres]" >&2; exit 1 ;;
  esac
done
case "$STORE" in
  sled|postgres) ;;
  *) echo "error: --store $STORE; use postgres (or leave it out for this tree beside BASELINE)" >&2; exit 1 ;;
esac

BASELINE="${BASELINE:-4f84794}"
PROFILE="${PROFILE:-release}"
if [ "${QUICK:-0}" = 1 ]; then
  WORKERS="${WORKERS:-10 100}"; TASKS="${TASKS:-10000}"; RECOVERY_TASKS="${RECOVERY_TASKS:-10000}"
else
  WORKERS="${WORKERS:-10 100 1000}"; TASKS="${TASKS:-10000 100000 1000000}"; RECOVERY_TASKS="${RECOVERY_TASKS:-1000000}"
fi
SLOT_ARGS=(); [ "${SERIAL:-0}" = 1 ] && SLOT_ARGS=(--no-lease-ahead)
ROUNDS="${ROUNDS:-1}"; SLOTS="${SLOTS:-8}"; RENDER_MS="${RENDER_MS:-1200}"; JITTER="${JITTER:-0}"; WARMUP="${WARMUP:-5}"; WINDOW="${WINDOW:-15}"
SUBMIT_TIMEOUT="${SUBMIT_TIMEOUT:-120}"; SETUP_TIMEOUT="${SETUP_TIMEOUT:-120}"; RECOVERY_TIMEOUT="${RECOVERY_TIMEOUT:-120}"
OUT="${OUT:-target/bench-coordinator/$(date +%Y%m%d-%H%M%S)}"
case "$PROFILE" in
  release) dir=release ;;
  dev) dir=debug ;;
  *) echo "error: PROFILE=$PROFILE; use release or dev" >&2; exit 1 ;;
esac
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

if [ "$STORE" = postgres ]; then BASELINE=HEAD; fi
echo "== building this tree ($PROFILE)" >&2
cargo build -q --profile "$PROFILE" -p tessera-cli --bin tessera -p tessera-tests --bin tessera-load
new_bin="$PWD/target/$dir/tessera"
load="$PWD/target/$dir/tessera-load"
new_name="this tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ", uncommitted changes"))"
if [ -n "${NEW:-}" ]; then
  build_baseline "$NEW" "$PROFILE"
  new_bin="$BASELINE_BIN"; new_name="$NEW ($BASELINE_SHORT)"
fi

if [ "$STORE" = postgres ]; then
  # The baseline is this very tree on sled.
  base_bin="$new_bin"
else
# The baseline: the revision's files (git archive, so no worktree is
# registered) built into a target directory of its own, kept between runs.
build_baseline "$BASELINE" "$PROFILE"
base_bin="$BASELINE_BIN"; short="$BASELINE_SHORT"
fi

# --store postgres: one durable server for the whole sweep; each run of the
# new design gets a fresh database (pg_db prints its URL).
if [ "$STORE" = postgres ]; then
  ensure_postgres || { echo "error: PostgreSQL is needed for --store postgres" >&2; exit 1; }
  pg_bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
  pg_dir="$(mktemp -d /tmp/tessera-bench-pg.XXXXXX)"
  pg_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  pg_as=()
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$pg_dir"; pg_as=(runuser -u postgres --); fi
  "${pg_as[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -U tessera --auth=trust -E UTF8 >/dev/null
  "${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w \
    -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=256MB" start >/dev/null
  trap '"${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w stop >/dev/null 2>&1; rm -rf "$pg_dir"' EXIT
  echo "== PostgreSQL $("$pg_bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$pg_port (fsync on, synchronous_commit on)" >&2
fi
pg_db() {
  local name="bench_$(date +%s%N)"
  "$pg_bin/psql" -X -q -h 127.0.0.1 -p "$pg_port" -U tessera -d postgres -c "CREATE DATABASE $name" >/dev/null
  echo "postgres://tessera@127.0.0.1:$pg_port/$name"
}

scene="$OUT/scene.blend"
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
  --out "$scene" --kind still --frames 1 >/dev/null 2>&1 || { echo "error: make_scene.py failed" >&2; exit 1; }

coord_args=()
for a in ${COORD_ARGS:-}; do coord_args+=("--coordinator-arg=$a"); done

# Every run's files stay until the sweep ends: nothing is deleted while one
# runs. On an ext4 volume without a journal (this kind of machine) the kernel
# skips inodes freed in the last 60 s (300 s while their table block is
# unwritten) when it allocates one, checking each: a run whose new files land
# in the inode group the previous run just freed paid milliseconds per file
# created, which doubled the coordinator's CPU and tripled lease p99 in some
# runs of one binary and not others (`perf`: find_inode_bit/recently_deleted
# under the blob store's file creation).
runs="$OUT/runs"; run_n=0
remove_runs() { rm -rf "$runs"; }
# Runs one tessera-load command with a hard cap; appends its JSON line, or
# one saying why there is none.
measure() { # DESIGN CAP JSONL FALLBACK_FIELDS ARGS...
  local design="$1" cap="$2" jsonl="$3" fields="$4"; shift 4
  run_n=$((run_n + 1))
  local tmp="$runs/$run_n" line rc=0
  mkdir -p "$tmp"
  local store_args=()
  if [ "$STORE" = postgres ] && [ "$design" = new ]; then
    store_args=("--coordinator-arg=--store" "--coordinator-arg=$(pg_db)")
  fi
  line="$(TMPDIR="$tmp" timeout -k 10 "$cap" "$load" "$@" --data "$tmp/data" --design "$design" --scene "$scene" \
    "${coord_args[@]}" "${store_args[@]}" --json 2> >(tee -a "$OUT/$design.log" >&2))" || rc=$?
  if [ -z "$line" ]; then
    local why="error: tessera-load exited with $rc; see $OUT/$design.log"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then why="timeout: the run passed its cap of $cap s"; fi
    line="{\"design\":\"$design\",$fields,\"outcome\":\"$why\"}"
    echo "$design: $why" >&2
  fi
  echo "$line" >>"$jsonl"
}

: >"$OUT/new.jsonl"; : >"$OUT/baseline.jsonl"
cap=$(( SUBMIT_TIMEOUT + SETUP_TIMEOUT + ${WARMUP%.*} + ${WINDOW%.*} + 60 ))
echo "== sweep: W in {$WORKERS} x N in {$TASKS}, $SLOTS slots$([ "${SERIAL:-0}" = 1 ] && echo " (serial)"), ${RENDER_MS} ms renders (jitter $JITTER), ${WARMUP} s warm-up, ${WINDOW} s window, $ROUNDS round(s)" >&2
for n in $TASKS; do
  for w in $WORKERS; do
    # The two designs back to back, so a busy moment of the machine falls on both.
    for _ in $(seq "$ROUNDS"); do for design in new baseline; do
      bin="$new_bin"; [ "$design" = baseline ] && bin="$base_bin"
      measure "$design" "$cap" "$OUT/$design.jsonl" "\"workers\":$w,\"slots\":$SLOTS,\"tasks\":$n" \
        run --tessera "$bin" -w "$w" -s "$SLOTS" -n "$n" --render-ms "$RENDER_MS" --render-jitter "$JITTER" \
        --warmup "$WARMUP" --window "$WINDOW" --submit-timeout "$SUBMIT_TIMEOUT" --setup-timeout "$SETUP_TIMEOUT" \
        ${SLOT_ARGS[@]+"${SLOT_ARGS[@]}"}
    done; done
  done
done

if [ "$RECOVERY_TASKS" -gt 0 ]; then
  echo "== recovery: kill -9 with $RECOVERY_TASKS tasks on disk, restart to first lease" >&2
  rcap=$(( SUBMIT_TIMEOUT + RECOVERY_TIMEOUT + 120 ))
  for design in new baseline; do
    bin="$new_bin"; [ "$design" = baseline ] && bin="$base_bin"
    measure "$design" "$rcap" "$OUT/$design.jsonl" "\"tasks\":$RECOVERY_TASKS,\"first_lease_s\":null" \
      recover --tessera "$bin" -n "$RECOVERY_TASKS" --submit-timeout "$SUBMIT_TIMEOUT" --recovery-timeout "$RECOVERY_TIMEOUT"
  done
fi

{
  if [ "$STORE" = postgres ]; then
    echo "coordinator load benchmark: new = this tree on PostgreSQL, baseline = this tree on sled ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ", uncommitted changes"))"
  else
    echo "coordinator load benchmark: new = $new_name, baseline = $BASELINE ($short)"
  fi
  echo "$PROFILE build, $(nproc) cores, $ROUNDS round(s) per cell, $SLOTS slots per worker, ${RENDER_MS} ms renders (jitter $JITTER), window ${WINDOW} s after ${WARMUP} s warm-up; latencies in ms"
  echo "lease: Lease calls that returned a task (long-poll waits that ended empty are left out); status: GetJob with the first 1,000 tasks"
  echo
  "$load" table --new "$OUT/new.jsonl" --baseline "$OUT/baseline.jsonl"
} | tee "$OUT/table.txt"
remove_runs
echo "JSON lines and logs: $OUT" >&2
