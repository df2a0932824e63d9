#!/usr/bin/env bash
# A chaos run: a farm on PostgreSQL and S3 (two coordinators, four workers)
# renders a 200-frame job and a tiled one while random faults hit it for
# five minutes (kills of workers and coordinators, database and object-store
# restarts, partitions, latency). Then every frame must be exact and every
# acknowledged completion stored once; it prints the figures.
#
#   scripts/chaos.sh                      # 5 minutes, seed 1
#   scripts/chaos.sh --seconds 900 --seed 42 --faults kill-worker,kill-coordinator
#   scripts/chaos.sh --dir /tmp/chaos     # keep the logs and outputs
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust
ensure_s3_server
ensure_postgres
ensure_iptables
cargo build -q -p tessera-cli --features test-hooks
cargo run -q -p tessera-tests --bin tessera-chaos -- "$@"
