#!/usr/bin/env bash
# A screenshot of the add-on's panel, taken in a Blender with a window under
# Xvfb: docs/addon-panel.png. With a farm (URL TOKEN JOB), the panel shows
# that job's state: scripts/addon-screenshot.sh http://127.0.0.1:7879 TOKEN 1
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_blender
ensure_xvfb
zip="$(scripts/addon.sh)"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_asset_scenes.py -- \
  --dir "$work/scene" --case library >/dev/null
mkdir -p docs
extra=()
if [ $# -ge 3 ]; then extra=(--url "$1" --token "$2" --job "$3"); fi
BLENDER_USER_SCRIPTS="$work/scripts" BLENDER_USER_CONFIG="$work/config" timeout 120 xvfb-run -a -s "-screen 0 900x1500x24" \
  blender "$work/scene/shots/shot.blend" -p 0 0 900 1500 --python tests/addon/screenshot.py -- \
  --zip "$PWD/$zip" --out "$PWD/docs/addon-panel.png" "${extra[@]}" | grep -E "screenshot.py|Error" || true
test -s docs/addon-panel.png && echo docs/addon-panel.png
