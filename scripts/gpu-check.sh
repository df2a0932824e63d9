#!/usr/bin/env bash
# Checks a machine with NVIDIA GPUs, end to end, in one run:
#   1. builds tessera (release) and the worker's probe example;
#   2. finds or installs a Blender 4.5 `bpy` runtime (a Python 3.11 venv);
#   3. prints the GPUs the worker's probe finds (Vulkan through ash, NVML)
#      and checks that each NVIDIA GPU's Vulkan UUID is one NVML lists, and
#      the other way round (the worker matches them by UUID to pin slots and
#      read telemetry);
#   4. renders one frame of tests/blender/make_scene.py's scene with that runtime
#      on CUDA, on OptiX and on the CPU, with Cycles' device preferences set
#      as blender/session.py sets them, failing a GPU render that fell back
#      to the CPU, and prints the times and their ratios;
#   5. exits non-zero when anything above failed (every step still runs and
#      reports, so one run shows every problem).
#
#   scripts/gpu-check.sh                      # on the GPU machine
#   GPU_CHECK_CPU_ONLY=1 scripts/gpu-check.sh # anywhere: build, probe, CPU render
#
# Environment:
#   TESSERA_BPY         the bpy runtime's venv (default: an existing
#                       ~/.cache/tessera/runtimes/bpy-4.5.*, else one
#                       installed at ~/.cache/tessera/runtimes/bpy-4.5)
#   GPU_CHECK_CPU_ONLY  1: no GPU expected; skip CUDA and OptiX
#   GPU_CHECK_GPU       which NVIDIA GPU renders (probe index; default the first)
#   GPU_CHECK_SIZE      frame size, WxH (default 1920x1080)
#   GPU_CHECK_SAMPLES   Cycles samples (default 16)
#   GPU_CHECK_PROFILE   cargo profile (default release; `dev` builds faster)
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

cpu_only=${GPU_CHECK_CPU_ONLY:-0}
size=${GPU_CHECK_SIZE:-1920x1080}
samples=${GPU_CHECK_SAMPLES:-16}
profile=${GPU_CHECK_PROFILE:-release}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/tessera/runtimes
work=$(mktemp -d -t tessera-gpu-check.XXXXXX)
trap 'rm -rf "$work"' EXIT

failures=()
fail() {
    echo "FAIL: $*" >&2
    failures+=("$*")
}
finish() {
    echo
    if ((${#failures[@]})); then
        echo "gpu-check: ${#failures[@]} failure(s):"
        printf '  - %s\n' "${failures[@]}"
        exit 1
    fi
    echo "gpu-check: all checks passed"
    exit 0
}
if [[ ! $size =~ ^([0-9]+)x([0-9]+)$ ]]; then
    echo "GPU_CHECK_SIZE=$size is not WxH, for example 1920x1080" >&2
    exit 2
fi
width=${BASH_REMATCH[1]}
height=${BASH_REMATCH[2]}

# ---------------------------------------------------------------- 1. build
echo "== 1/5 building tessera ($profile)"
if ! command -v cargo >/dev/null; then
    fail "cargo not found: install Rust (https://rustup.rs) and run again"
    finish
fi
if ! cargo build --profile "$profile" -p tessera-cli --bin tessera \
    -p tessera-worker --example gpu_probe; then
    fail "cargo build failed (output above)"
    finish
fi
target_dir=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
case $profile in dev | test) out_dir=$target_dir/debug ;; *) out_dir=$target_dir/$profile ;; esac
"$out_dir/tessera" --version || fail "the built tessera does not run"

# ---------------------------------------------------------- 2. bpy runtime
echo
echo "== 2/5 the bpy 4.5 runtime"
bpy_ok() { [[ -x $1/bin/python ]] && "$1/bin/python" -I -c 'import bpy' >/dev/null 2>&1; }
bpy=${TESSERA_BPY:-}
if [[ -z $bpy ]]; then
    for candidate in "$cache"/bpy-4.5*; do
        if bpy_ok "$candidate"; then
            bpy=$candidate
        fi
    done
    bpy=${bpy:-$cache/bpy-4.5}
fi
if ! bpy_ok "$bpy"; then
    # The bpy 4.5 wheels are built for CPython 3.11 only.
    if ! command -v python3.11 >/dev/null; then
        fail "no bpy runtime at $bpy and no python3.11 to make one: install Python 3.11 \
(apt-get install python3.11-venv, or uv python install 3.11) or set TESSERA_BPY to a venv with bpy 4.5"
        finish
    fi
    echo "installing bpy 4.5 into $bpy (a 373 MB wheel; once)"
    started=$(date +%s.%N)
    if ! { python3.11 -m venv "$bpy" && "$bpy/bin/pip" install --progress-bar off 'bpy==4.5.*'; }; then
        fail "pip could not install bpy 4.5 into $bpy (output above)"
        finish
    fi
    echo "installed in $(python3 -c "print(f'{$(date +%s.%N) - $started:.0f}')") s"
fi
version=$("$bpy/bin/python" -I -c 'import bpy; print(bpy.app.version_string)' 2>/dev/null | tail -1)
echo "bpy runtime: $bpy (Blender $version)"
[[ $version == 4.5.* ]] || fail "the runtime at $bpy is Blender '$version', not 4.5"

# ---------------------------------------------------------------- 3. probe
echo
echo "== 3/5 the worker's GPU probe"
if ! "$out_dir/examples/gpu_probe" >"$work/probe.json"; then
    fail "the probe example failed"
    echo '{"gpus": [], "notes": [], "nvml": {"available": false}}' >"$work/probe.json"
fi
# Prints the table and a line `GPU_CHECK_GPU_UUID=<uuid>`: the GPU to render on.
probe_out=$(python3 - "$work/probe.json" "$cpu_only" "${GPU_CHECK_GPU:-}" <<'PY'
import json, sys

probe = json.load(open(sys.argv[1]))
cpu_only = sys.argv[2] == "1"
wanted = sys.argv[3]
problems = []
print("%-3s %-36s %-8s %-10s %9s  %-5s %-5s %s" % (
    "#", "NAME", "VENDOR", "TYPE", "MEMORY", "CC", "OPTIX", "UUID"))
for g in probe["gpus"]:
    print("%-3d %-36s %-8s %-10s %7.1f G  %-5s %-5s %s" % (
        g["index"], g["name"][:36], g["vendor"], g["type"], g["memory_bytes"] / 2**30,
        g["compute_capability"] or "-", "yes" if g["optix"] else "no", g["uuid"] or "-"))
for note in probe["notes"]:
    print("  note:", note)
nvml = probe["nvml"]
vulkan = {g["uuid"]: g for g in probe["gpus"] if g["nvidia"]}
if nvml["available"]:
    listed = {d.get("uuid"): d for d in nvml["devices"]}
    print("NVML lists %d GPU(s):" % len(listed))
    for d in nvml["devices"]:
        print("  %s %s" % (d.get("uuid") or d.get("error"), d.get("name", "")))
    for uuid, g in vulkan.items():
        if uuid not in listed:
            problems.append("Vulkan device %d (%s) has UUID %s, which NVML does not list"
                            % (g["index"], g["name"], uuid or "(none: Vulkan < 1.1)"))
        elif not g["nvml_matched"]:
            problems.append("the probe did not match Vulkan device %d (%s) to NVML"
                            % (g["index"], g["name"]))
    for uuid, d in listed.items():
        if uuid not in vulkan:
            problems.append("NVML's GPU %s (%s) has no Vulkan device with that UUID: is the "
                            "NVIDIA Vulkan ICD installed (nvidia_icd.json)?"
                            % (uuid, d.get("name", d.get("error"))))
    if vulkan and set(vulkan) == set(listed):
        print("UUIDs: all %d NVIDIA GPU(s) match between Vulkan and NVML" % len(vulkan))
elif not cpu_only:
    problems.append("NVML is not available (%s): install the NVIDIA driver" % nvml.get("error"))
if not cpu_only and not vulkan:
    problems.append("the probe found no NVIDIA GPU through Vulkan")
chosen = ""
ordered = sorted(vulkan.values(), key=lambda g: g["index"])
if wanted:
    chosen = next((g["uuid"] for g in ordered if str(g["index"]) == wanted), "")
    if not chosen and not cpu_only:
        problems.append("GPU_CHECK_GPU=%s is not the index of an NVIDIA GPU above" % wanted)
elif ordered:
    chosen = ordered[0]["uuid"]
for p in problems:
    print("PROBLEM:", p)
if not nvml["available"] and cpu_only:
    print("NVML is not available (%s)" % nvml.get("error"))
# Tagged, not merely last: $(...) drops trailing empty lines.
print("GPU_CHECK_GPU_UUID=" + chosen)
sys.exit(1 if problems else 0)
PY
)
probe_rc=$?
echo "$probe_out" | grep -v '^GPU_CHECK_GPU_UUID='
gpu_uuid=$(echo "$probe_out" | sed -n 's/^GPU_CHECK_GPU_UUID=//p' | tail -1)
((probe_rc == 0)) || fail "the GPU probe found problems (PROBLEM lines above)"

# ---------------------------------------------------------------- 4. render
echo
echo "== 4/5 one ${width}x${height} frame, $samples samples, Blender $version"
cat >"$work/render.py" <<'PY'
"""Renders the scene once on one Cycles device and prints one JSON line.

GPU devices are chosen as blender/session.py's use_gpu chooses them: only
devices of the asked kind enabled, the CPU left out, scene.cycles.device =
'GPU'. Cycles silently renders on the CPU when no such device is usable, so
the render is checked two ways: the device list before, and the GPU's memory
(or this process in its compute apps) while the render session is kept
alive with persistent data."""

import argparse
import json
import os
import struct
import subprocess
import sys
import time
import zlib

import bpy

p = argparse.ArgumentParser()
p.add_argument("--scene", required=True)
p.add_argument("--device", required=True, choices=["CPU", "CUDA", "OPTIX"])
p.add_argument("--gpu", default="", help="the GPU's UUID, for nvidia-smi")
p.add_argument("--width", type=int, required=True)
p.add_argument("--height", type=int, required=True)
p.add_argument("--samples", type=int, required=True)
p.add_argument("--out", required=True)
a = p.parse_args()


def gpu_memory_mib():
    try:
        out = subprocess.run(["nvidia-smi", "-i", a.gpu, "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        return int(out.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def compute_pids():
    try:
        out = subprocess.run(["nvidia-smi", "-i", a.gpu, "--query-compute-apps=pid",
                              "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return {int(x) for x in out.stdout.split() if x.isdigit()}
    except (OSError, subprocess.TimeoutExpired):
        return set()


def png_text(path):
    """The PNG's tEXt chunks: Cycles stamps its own timings there."""
    found = {}
    with open(path, "rb") as f:
        data = f.read()
    pos = 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            found[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        pos += 12 + length
    return found


def seconds(stamp):
    """Blender's stamp times: `MM:SS.ss` or `HH:MM:SS.ss`."""
    total = 0.0
    for part in stamp.split(":"):
        total = total * 60 + float(part)
    return total


result = {"device": a.device, "error": None}
bpy.ops.wm.open_mainfile(filepath=a.scene, load_ui=False, use_scripts=False)
scene = bpy.context.scene
scene.render.resolution_x, scene.render.resolution_y = a.width, a.height
scene.render.resolution_percentage = 100
scene.cycles.samples = a.samples
scene.cycles.use_denoising = False  # times of path tracing, not of a denoiser
scene.render.use_persistent_data = True  # keeps the device alive to be seen
scene.render.image_settings.file_format = "PNG"
scene.render.use_stamp = False
scene.render.filepath = a.out
before = gpu_memory_mib() if a.gpu else None
if a.device == "CPU":
    scene.cycles.device = "CPU"
else:
    prefs = bpy.context.preferences.addons["cycles"].preferences
    prefs.compute_device_type = a.device
    prefs.refresh_devices()
    found = [d for d in prefs.devices if d.type == a.device]
    for d in prefs.devices:
        d.use = d.type == a.device
    scene.cycles.device = "GPU"
    result["devices"] = [d.name for d in found]
    if not found:
        result["error"] = ("Cycles found no %s device (it would render on the CPU); devices: %s"
                           % (a.device, [(d.name, d.type) for d in prefs.devices]))
if result["error"] is None:
    times = []
    for _ in range(2):  # the first pays kernel loading (OptiX compiles), the second not
        started = time.monotonic()
        bpy.ops.render.render(write_still=True)
        times.append(time.monotonic() - started)
        if a.device != "CPU" and len(times) == 1:
            after = gpu_memory_mib()
            mine = os.getpid() in compute_pids()
            result["gpu_memory_mib"] = [before, after]
            result["in_compute_apps"] = mine
            grew = before is not None and after is not None and after - before >= 64
            if not (mine or grew):
                result["error"] = ("the %s render left no trace on GPU %s (this process is not "
                                   "in its compute apps, its memory went from %s to %s MiB): "
                                   "Cycles rendered on the CPU" % (a.device, a.gpu, before, after))
                break
    result["cold_s"], result["warm_s"] = times[0], times[-1]
    stamps = png_text(a.out) if os.path.isfile(a.out) else {}
    render_time = next((v for k, v in stamps.items() if k.endswith("render_time")), None)
    result["cycles_render_s"] = seconds(render_time) if render_time else None
print("GPU_CHECK " + json.dumps(result), flush=True)
PY

"$bpy/bin/python" -I "$repo/tests/blender/make_scene.py" -- --out "$work/scene.blend" \
    --kind still --width "$width" --height "$height" --samples "$samples" >"$work/make.log" 2>&1 ||
    { cat "$work/make.log"; fail "make_scene.py failed in the bpy runtime"; finish; }

devices=(CPU)
((cpu_only == 1)) || devices=(CUDA OPTIX CPU)
for device in "${devices[@]}"; do
    log=$work/render-$device.log
    # Pinned to one GPU, as a worker pins each slot's Blender.
    CUDA_VISIBLE_DEVICES=${gpu_uuid:-${CUDA_VISIBLE_DEVICES:-}} \
        "$bpy/bin/python" -I "$work/render.py" --scene "$work/scene.blend" \
        --device "$device" --gpu "$gpu_uuid" --width "$width" --height "$height" \
        --samples "$samples" --out "$work/$device.png" >"$log" 2>&1
    rc=$?
    line=$(grep '^GPU_CHECK ' "$log" | tail -1 | cut -d' ' -f2-)
    if [[ -z $line ]]; then
        tail -20 "$log"
        fail "$device: the render printed no result (exit $rc; Blender's last lines above)"
        continue
    fi
    echo "$line" >"$work/result-$device.json"
    error=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["error"] or "")' "$line")
    if [[ -n $error ]]; then
        fail "$device: $error"
    elif ((rc != 0)); then
        tail -20 "$log"
        fail "$device: Blender exited $rc"
    fi
done

# ---------------------------------------------------------------- 5. report
echo
echo "== 5/5 times"
python3 - "$work" "${devices[@]}" <<'PY'
import json, os, sys

work, devices = sys.argv[1], sys.argv[2:]
results = {}
for d in devices:
    path = os.path.join(work, "result-%s.json" % d)
    if os.path.exists(path):
        r = json.load(open(path))
        if r.get("error") is None and "warm_s" in r:
            results[d] = r
print("%-6s %10s %10s %14s  %s" % ("DEVICE", "FIRST (s)", "SECOND (s)", "CYCLES (s)", "ON"))
for d, r in results.items():
    cyc = r.get("cycles_render_s")
    print("%-6s %10.2f %10.2f %14s  %s" % (d, r["cold_s"], r["warm_s"],
                                          "%.2f" % cyc if cyc is not None else "-",
                                          ", ".join(r.get("devices", [])) or "CPU"))
# Ratios of the second render: the first includes loading kernels.
for slow, fast in (("CPU", "CUDA"), ("CPU", "OPTIX"), ("CUDA", "OPTIX")):
    if slow in results and fast in results:
        print("%s / %s: %.1fx" % (slow, fast, results[slow]["warm_s"] / results[fast]["warm_s"]))
PY
finish
