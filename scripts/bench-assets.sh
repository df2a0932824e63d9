#!/usr/bin/env bash
# File sets, side by side with what they compete with. Prints figures and ratios:
#   1. first upload of a 1 GiB asset set on loopback (hashing included)
#      vs `cp` of the same bytes onto the same disk (the floor of any copy),
#      and vs the commit BASELINE's upload when given, two rounds each;
#   2. an unchanged resubmit of a scene with 2,000 files (bytes sent, CPU
#      seconds) vs its first submit;
#   3. `tessera render` vs a bare `blender -b -a` on the 12-frame bench-farm
#      scene, with 1 and 2 workers (the submit-time overhead).
# Usage: [BASELINE=REV] scripts/bench-assets.sh [GIB]     (GIB: size of the asset set, default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_rust

gib="${1:-1}"
work="$(mktemp -d)"; trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cargo build -q --release -p tessera-cli
tessera="$PWD/target/release/tessera"
export XDG_CACHE_HOME="$work/cache"     # no hash or trace cache from earlier runs
now() { date +%s.%N; }
cpu() { awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"; }

# A coordinator with no workers: the submits measure upload only.
"$tessera" coordinator --listen 127.0.0.1:0 --data "$work/data" >"$work/coord.out" 2>"$work/coord.log" &
for _ in $(seq 50); do grep -q "listening on" "$work/coord.out" 2>/dev/null && break; sleep 0.1; done
addr=$(sed -n 's/tessera coordinator listening on //p' "$work/coord.out" | head -1)
export TESSERA_COORDINATOR="http://$addr" TESSERA_TOKEN="$(cat "$work/data/admin.token")"

# 1. A scene whose image sequence is GIB GiB of 64 MiB frames.
if [ -n "${BASELINE:-}" ]; then build_baseline "$BASELINE" release; fi
n=$((gib * 16))
mkdir -p "$work/big/seq"
for i in $(seq -f "%04g" 1 "$n"); do head -c $((64 << 20)) /dev/urandom >"$work/big/seq/f_$i.png"; done
blender -b --factory-startup --python-exit-code 2 --python-expr "
import bpy
img = bpy.data.images.new('Big', 4, 4); img.source = 'SEQUENCE'
img.filepath = '//seq/f_0001.png'; img.use_fake_user = True
bpy.context.scene.frame_end = $n
bpy.ops.wm.save_as_mainfile(filepath='$work/big/scene.blend')" >/dev/null 2>&1
bytes=$(du -cb "$work"/big/seq/* | tail -1 | cut -f1)
# Every timed copy starts from the same memory: the page cache dropped
# (the source is read from disk) and 2.5x its bytes of recently used free
# pages. On a virtual machine that hands free pages back to its host
# (free page reporting), a write into pages the host reclaimed costs about
# 2 s per GiB of first touches, so whichever side ran after a large free
# would otherwise win by that alone.
settle() {
  dd if=/dev/zero of="$work/settle" bs=1M count=$((gib * 2560)) status=none; rm -f "$work/settle"
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
}
# upload BIN: the first submit of the big scene to a fresh coordinator run
# by BIN (no hash cache); prints seconds. Blender's trace of the scene is
# remembered first, so the time is hashing and sending only.
upload() {
  local bin="$1" d="$work/up-data" out="$work/up.out" t0 t1
  rm -rf "$d"
  "$bin" coordinator --listen 127.0.0.1:0 --data "$d" >"$out" 2>"$work/up.log" &
  local pid=$!
  for _ in $(seq 50); do grep -q "listening on" "$out" 2>/dev/null && break; sleep 0.1; done
  local a; a="http://$(sed -n 's/tessera coordinator listening on //p' "$out" | head -1)"
  TESSERA_COORDINATOR="$a" TESSERA_TOKEN="$(cat "$d/admin.token")" "$bin" deps "$work/big/scene.blend" >/dev/null
  rm -f "$XDG_CACHE_HOME/tessera/hashes.json"
  settle
  t0=$(now)
  TESSERA_COORDINATOR="$a" TESSERA_TOKEN="$(cat "$d/admin.token")" \
    "$bin" submit "$work/big/scene.blend" --frames 1 >/dev/null 2>"$work/submit1.err"
  t1=$(now)
  grep -q "uploaded" "$work/submit1.err" || { cat "$work/submit1.err" >&2; exit 1; }
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c "print($t1 - $t0)"
}
copy() {
  rm -rf "$work/cp-copy"; settle
  local t0 t1; t0=$(now); cp -r "$work/big/seq" "$work/cp-copy" && sync; t1=$(now)
  rm -rf "$work/cp-copy"; python3 -c "print($t1 - $t0)"
}
tb0=$(now); "$tessera" deps "$work/big/scene.blend" >/dev/null; tb1=$(now)
ups=(); cps=(); bases=()
for _ in 1 2; do
  cps+=("$(copy)"); ups+=("$(upload "$tessera")")
  if [ -n "${BASELINE:-}" ]; then bases+=("$(upload "$BASELINE_BIN")"); fi
done
up=$(printf '%s\n' "${ups[@]}" | sort -g | head -1)
cp_s=$(printf '%s\n' "${cps[@]}" | sort -g | head -1)
base=$(printf '%s\n' "${bases[@]:-0}" | sort -g | head -1)

# 2. 2,000 small files: first submit (cold: Blender traces, every file is
#    hashed and sent), then the same scene unchanged. CPU of the command and
#    its children (Blender), from getrusage.
cputime() { python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], "w"))
r = resource.getrusage(resource.RUSAGE_CHILDREN); print(r.ru_utime + r.ru_stime)' "$@"; }
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_asset_scenes.py -- \
  --dir "$work/many" --case many >/dev/null 2>&1
t6=$(now); cold=$(cputime "$work/many1.err" "$tessera" submit "$work/many/scene.blend" --frames 1); t7=$(now)
t8=$(now); warm=$(cputime "$work/many2.err" "$tessera" submit "$work/many/scene.blend" --frames 2); t9=$(now)
grep -q "0 bytes uploaded" "$work/many2.err" || { echo "unchanged resubmit sent bytes:"; cat "$work/many2.err"; }

# 3. Submit-time overhead of tessera render against blender -b -a.
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_scene.py -- \
  --out "$work/anim.blend" --kind anim --width 160 --height 120 --frames 12 --samples 16 >/dev/null 2>&1
blender -b "$work/anim.blend" -o "$work/warmup/f_####" -s 1 -e 1 -a >/dev/null 2>&1   # page cache
t10=$(now); blender -b "$work/anim.blend" -o "$work/anim/f_####" -s 1 -e 12 -a >/dev/null 2>&1; t11=$(now)
"$tessera" render "$work/anim.blend" --frames 1-12 --workers 1 -o "$work/r0" >/dev/null 2>&1   # caches
t12=$(now); "$tessera" render "$work/anim.blend" --frames 1-12 --workers 1 -o "$work/r1" >/dev/null 2>&1; t13=$(now)
t14=$(now); "$tessera" render "$work/anim.blend" --frames 1-12 --workers 2 -o "$work/r2" >/dev/null 2>&1; t15=$(now)

python3 - "$bytes" "$up" "$cp_s" "$base" "${BASELINE:-}" "$t6" "$t7" "$t8" "$t9" "$t10" "$t11" "$t12" "$t13" "$t14" "$t15" \
  "$cold" "$warm" "$tb0" "$tb1" <<'PY'
import sys
b = int(sys.argv[1]); up, cp, base = map(float, sys.argv[2:5]); rev = sys.argv[5]
t = [0.0] * 4 + list(map(float, sys.argv[6:16])); cold, warm = sys.argv[16:18]
trace = float(sys.argv[19]) - float(sys.argv[18])
print(f"1. first upload of {b / 2**30:.2f} GiB on loopback, hashing included (best of 2)")
print(f"   tessera submit  {up:7.2f} s  {b / up / 1e6:8.0f} MB/s   (goal >= 600 MB/s or 0.6x of cp)")
if rev:
    print(f"   {rev[:12]:<15} {base:7.2f} s  {b / base / 1e6:8.0f} MB/s   this tree {base / up:.2f}x as fast")
print(f"   (before it: Blender's trace of the scene, once per scene, {trace:.2f} s, with hashing for `deps`)")
print(f"   cp, same disk   {cp:7.2f} s  {b / cp / 1e6:8.0f} MB/s   tessera/cp speed {cp / up:.2f}x")
ccpu, wcpu = float(cold), float(warm)
print("2. 2,000 small files")
print(f"   first submit (trace, hash, send) {t[5] - t[4]:6.2f} s wall  {ccpu:5.2f} s CPU")
print(f"   unchanged resubmit, 0 bytes      {t[7] - t[6]:6.2f} s wall  {wcpu:5.2f} s CPU   (goal < 1 s CPU)  {ccpu / max(wcpu, 1e-3):.1f}x less CPU")
anim, r1, r2 = t[9] - t[8], t[11] - t[10], t[13] - t[12]
print("3. 12 frames 160x120, 16 samples")
print(f"   blender -b -a                    {anim:6.2f} s")
print(f"   tessera render --workers 1       {r1:6.2f} s   {r1 / anim:.2f}x   (goal <= 1.15x)")
print(f"   tessera render --workers 2       {r2:6.2f} s   {r2 / anim:.2f}x   (goal <= 1.15x)")
PY
