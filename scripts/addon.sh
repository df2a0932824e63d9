#!/usr/bin/env bash
# Builds the Blender add-on into out/tessera-addon.zip. One zip serves both
# kinds of Blender: 4.2 and later install it as an extension (Edit >
# Preferences > Get Extensions > Install from Disk, or `blender --command
# extension install-file -r user_default -e out/tessera-addon.zip`), reading
# tessera/blender_manifest.toml; 3.4 to 4.1 install it as a legacy add-on
# (Edit > Preferences > Add-ons > Install...), reading bl_info. Both accept
# the package in one top-level folder. blender/deps.py is copied into the
# package, so the add-on and `tessera deps` trace scenes with one script.
set -euo pipefail
cd "$(dirname "$0")/.."
out="out"
stage="$out/addon-build"
rm -rf "$stage"
mkdir -p "$stage/tessera"
cp blender/addon/tessera/*.py blender/addon/tessera/blender_manifest.toml "$stage/tessera/"
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
