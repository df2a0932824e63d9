#!/usr/bin/env bash
# The blob store's durable step, both ways, on one disk: what the results'
# sync (`make_durable` in coordinator/src/blobs/fs.rs) does for a batch of N new
# blobs. Each blob is written under tmp/ and then
#   one by one: fdatasync each file, move it into its shard directory
#               (256 shards, as blobs/ab/cdef...), fsync each directory;
#   syncfs:     syncfs of the volume, the moves, syncfs again.
# (The coordinator now takes one flush a batch: the bytes and their names
# under tmp/, then links into place that the next batch's flush covers;
# this script measures the two ways it chose between before.)
# Prints the median of ROUNDS batches per size, each way, and the ratio.
# The coordinator takes syncfs for batches over 64 blobs, and for smaller
# ones while the machine has under 8 MiB written and not yet on disk.
# Usage: [ROUNDS=7] [SIZE=20000] scripts/bench-sync.sh [DIR]   (DIR on the
# disk to measure, default a temporary directory under ./target)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
dir="$(mktemp -d "${1:-$PWD/target}/bench-sync.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
ROUNDS="${ROUNDS:-7}" SIZE="${SIZE:-20000}" python3 - "$dir" <<'PY'
import ctypes, os, statistics, sys, time

root = sys.argv[1]
rounds, size = int(os.environ["ROUNDS"]), int(os.environ["SIZE"])
libc = ctypes.CDLL(None, use_errno=True)
tmp = os.path.join(root, "tmp")
os.makedirs(tmp)
for i in range(256):
    os.makedirs(os.path.join(root, f"{i:02x}"))
serial = 0

def write_batch(n):
    global serial
    paths = []
    for _ in range(n):
        serial += 1
        p = os.path.join(tmp, f"{serial:08x}")
        with open(p, "wb") as f:
            f.write(os.urandom(size))
        paths.append(p)
    return paths

def place(p):
    """Its place under a shard, spread over the 256 as digests are."""
    name = os.path.basename(p)
    return os.path.join(root, f"{int(name, 16) * 2654435761 % 256:02x}", name)

def unwritten_mib():
    """Dirty + Writeback of /proc/meminfo, what the coordinator's rule reads."""
    kib = 0
    for line in open("/proc/meminfo"):
        key, _, rest = line.partition(":")
        if key in ("Dirty", "Writeback"):
            kib += int(rest.split()[0])
    return kib / 1024

def sync(path, data_only):
    fd = os.open(path, os.O_RDONLY)
    try:
        (os.fdatasync if data_only else os.fsync)(fd)
    finally:
        os.close(fd)

def one_by_one(paths):
    for p in paths:
        sync(p, True)
    dirs = set()
    for p in paths:
        dest = place(p)
        os.rename(p, dest)
        dirs.add(os.path.dirname(dest))
    for d in sorted(dirs):
        sync(d, False)

def volume(paths):
    fd = os.open(root, os.O_RDONLY)
    try:
        if libc.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), "syncfs")
        for p in paths:
            os.rename(p, place(p))
        if libc.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), "syncfs")
    finally:
        os.close(fd)

def timed(how, n):
    paths = write_batch(n)
    t = time.perf_counter()
    how(paths)
    return (time.perf_counter() - t) * 1000

print(f"written and not yet on disk, machine-wide: {unwritten_mib():.1f} MiB (the coordinator takes syncfs for small batches under 8)")
print(f"{'blobs':>5}  {'one by one ms':>13}  {'syncfs ms':>9}  ratio   ({rounds} rounds, {size}-byte blobs, {root})")
for n in (1, 2, 3, 8, 32, 80):
    timed(one_by_one, n)  # warm the shards
    a, b = [], []
    for _ in range(rounds):
        a.append(timed(one_by_one, n))
        b.append(timed(volume, n))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{n:>5}  {ma:>13.2f}  {mb:>9.2f}  {mb / ma:5.2f}")
PY
