#!/usr/bin/env bash
# Shows that every acknowledged change is fsync'ed: renders a tiny job through
# a coordinator running under strace and counts, per file, the sync calls
# against the store commits the coordinator reports (tessera_store_commits_total).
# Result blobs wait under blobs/tmp until their Complete asks for the
# results' group sync (one thread, one pass for every Complete waiting), which
# syncs each new blob's bytes (fdatasync) and their names under blobs/tmp
# (fsync of the folder, with the shards the call before linked into), then
# links them into place, or, for more than 64 blobs or while the machine
# has under 8 MiB left to write back (Dirty + Writeback in /proc/meminfo),
# takes one syncfs of the blob volume instead (Linux 5.8 and later,
# where syncfs reports failed writes); only then is the result's change queued for
# the group commit, which does the same for any other new blob (a scene, a
# stitched frame) before it writes the records. Uploads themselves sync nothing.
# sled's own flush only calls sync_file_range; the store's fsync of sled's log
# after each group commit is what makes an acknowledgement survive a power cut.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust
command -v strace >/dev/null 2>&1 || {
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq strace >/dev/null
}
cargo build -q -p tessera-cli
T="$PWD/target/debug/tessera"
dir="$(mktemp -d)"
trap 'pkill -f -- "--data $dir/data" 2>/dev/null; pkill -f -- "--cache $dir/cache" 2>/dev/null; rm -rf "$dir"' EXIT
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
  --out "$dir/s.blend" --kind anim --width 64 --height 48 --frames 6 --samples 4 >/dev/null 2>&1
strace -f -y -e trace=fsync,fdatasync,sync_file_range,syncfs -o "$dir/strace.log" \
  "$T" coordinator --listen 127.0.0.1:0 --http 127.0.0.1:0 --data "$dir/data" >"$dir/coord.log" 2>&1 &
for _ in $(seq 100); do grep -q "metrics on" "$dir/coord.log" 2>/dev/null && break; sleep 0.2; done
grpc=$(grep 'coordinator listening on' "$dir/coord.log" | grep -oE '127\.0\.0\.1:[0-9]+' | head -1)
http=$(grep 'metrics on' "$dir/coord.log" | grep -oE '127\.0\.0\.1:[0-9]+' | head -1)
export TESSERA_COORDINATOR="http://$grpc" TESSERA_TOKEN="$(cat "$dir/data/admin.token")"
"$T" worker --cache "$dir/cache" --slots 1 --device cpu --name w >"$dir/worker.log" 2>&1 &
"$T" submit "$dir/s.blend" --frames 1-6 --wait -o "$dir/out" >/dev/null 2>&1
commits=""
if [ -n "$http" ]; then
  commits=$(curl -s -H "Authorization: Bearer $TESSERA_TOKEN" "http://$http/metrics" | awk '/^tessera_store_commits_total/ {print $2}')
fi
# strace detaches when signalled: stop the coordinator itself (and the worker).
pkill -f -- "--data $dir/data" || true
pkill -f -- "--cache $dir/cache" || true
wait 2>/dev/null || true
echo "calls by file (strace -f -y -e trace=fsync,fdatasync,sync_file_range,syncfs):"
grep -v resumed "$dir/strace.log" | grep -E 'fsync|fdatasync|sync_file_range|syncfs' \
  | sed -E 's/^[0-9]+ +//; s/>.*/>/; s#'"$dir"'#DATA#; s#(blobs/tmp/)[^>]+#\1...#' \
  | sort | uniq -c | sort -rn
echo "store commits reported by the coordinator: ${commits:-unknown}"
echo "(the fd that sled opened is synced by its own 500 ms flusher; the other db fd is the store's fsync after every commit)"
echo "(blobs/tmp files and the folder naming them: synced by the results' group sync, or by a commit, before any record naming them was written; the shard folders they are then linked into: by the next such sync, before those tmp names are removed)"
