#!/usr/bin/env bash
# Writes the small seed corpus of every fuzz target into corpus/ (git-ignored:
# the corpus grows while fuzzing). Run from tests/fuzz.
set -eu
cd "$(dirname "$0")"
mkdir -p corpus/frame_set corpus/blend_sniff corpus/requests corpus/stitch_tile
# frame_set: 3 bytes limit (100000 = a0 86 01), 1 byte chunk, then the text
printf '\xa0\x86\x01\x0a1-250'     > corpus/frame_set/range
printf '\xa0\x86\x01\x031-100x2'   > corpus/frame_set/stepped
printf '\xa0\x86\x01\x011,5,10-20' > corpus/frame_set/list
# overlapping ranges, the input that once cost minutes (issue 9)
{ printf '\xa0\x86\x01\x01'; i=0; while [ $i -lt 400 ]; do printf '1-50000,'; i=$((i+1)); done; } > corpus/frame_set/overlapping
printf 'BLENDER-v304REND'                        > corpus/blend_sniff/plain
printf '\x1f\x8b\x08\0\0\0\0\0\0\0\0\0'          > corpus/blend_sniff/gzip
printf '\x28\xb5\x2f\xfd\0\0\0\0\0\0\0\0'        > corpus/blend_sniff/zstd
# requests: byte 0 = message index (0 = JobSpec), then the protobuf encoding
printf '\x00\x1a\x051-250\x3a\x034x2\x52\x04cuda' > corpus/requests/jobspec
printf '\x0c\x0a\x051.2.3'                       > corpus/requests/release
# stitch_tile: width-1, height-1, limit side-1 (each mod 64), then the file:
# a 2x2 8-bit RGB PNG, and the OpenEXR magic with a bare version field.
python3 - <<'PY'
import struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
raw = b"".join(b"\0" + bytes(range(r * 6, r * 6 + 6)) for r in range(2))
png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
open("corpus/stitch_tile/png", "wb").write(b"\x01\x01\x3f" + png)
open("corpus/stitch_tile/exr", "wb").write(b"\x01\x01\x3f" + b"\x76\x2f\x31\x01\x02\0\0\0")
PY
for d in corpus/*; do echo "$d: $(ls "$d" | wc -l) seeds"; done
