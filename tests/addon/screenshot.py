"""Takes a screenshot of the Tessera panel in a Blender with a window (run
under Xvfb by scripts/addon-screenshot.sh): installs and enables the add-on,
shows Properties > Render in the whole window, waits for a few redraws, saves
the window to --out and quits.

    blender SCENE.blend -p 0 0 W H --python tests/addon/screenshot.py -- \
        --zip out/tessera-addon.zip --out docs/addon-panel.png \
        [--url URL --token T --job N]
"""

import argparse
import sys

import bpy

argv = sys.argv[sys.argv.index("--") + 1:]
p = argparse.ArgumentParser()
p.add_argument("--zip", required=True)
p.add_argument("--out", required=True)
p.add_argument("--url", default="")
p.add_argument("--token", default="")
p.add_argument("--job", type=int, default=0)
a = p.parse_args(argv)

bpy.ops.preferences.addon_install(filepath=a.zip, overwrite=True)
bpy.ops.preferences.addon_enable(module="tessera")
prefs = bpy.context.preferences.addons["tessera"].preferences
if a.url:
    prefs.url = a.url
prefs.token = a.token
ticks = [0]


def step():
    ticks[0] += 1
    win = bpy.context.window_manager.windows[0]
    if ticks[0] == 1:
        bpy.context.scene.tessera.job_id = a.job
        area = max((x for x in win.screen.areas if x.type == "PROPERTIES"),
                   key=lambda x: x.height)
        area.spaces[0].context = "RENDER"
        with bpy.context.temp_override(window=win, area=area):
            bpy.ops.screen.screen_full_area()
        return 1.0
    if ticks[0] == 2 and a.job:
        bpy.ops.tessera.refresh()
        return 1.0
    if ticks[0] < 4:
        for area in win.screen.areas:
            area.tag_redraw()
        return 1.0
    with bpy.context.temp_override(window=win):
        bpy.ops.screen.screenshot(filepath=a.out)
    print("screenshot.py: wrote", a.out, flush=True)
    bpy.ops.wm.quit_blender()
    return None


bpy.app.timers.register(step, first_interval=1.0)
