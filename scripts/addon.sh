#!/usr/bin/env bash
# Builds the Blender add-on into out/tessera-addon.zip (install it from
# Edit > Preferences > Add-ons > Install...). blender/deps.py is copied into
# the package, so the add-on and `tessera deps` trace scenes with one script.
set -euo pipefail
cd "$(dirname "$0")/.."
out="out"
stage="$out/addon-build"
rm -rf "$stage"
mkdir -p "$stage/tessera"
cp blender/addon/tessera/*.py "$stage/tessera/"
cp blender/deps.py "$stage/tessera/deps.py"
rm -f "$out/tessera-addon.zip"
python3 - "$stage" "$out/tessera-addon.zip" <<'PY'
import os, sys, zipfile
stage, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
    for name in sorted(os.listdir(os.path.join(stage, "tessera"))):
        z.write(os.path.join(stage, "tessera", name), "tessera/" + name)
PY
rm -rf "$stage"
echo "$out/tessera-addon.zip"
