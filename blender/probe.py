"""What this Blender can render, asked of Blender itself by the worker at start.

Run as `blender -b --factory-startup --python probe.py -- [--eevee PNG]` or, for
the `bpy` module, through bpy_run.py. Prints one line
`TESSERA_CAPS {json}`: the version, whether Cycles was built with
OpenImageDenoise and OSL, and the GPU devices Cycles finds. With `--eevee PNG`
it then renders a tiny EEVEE frame into PNG and prints `TESSERA_EEVEE ok`
when that worked: whether EEVEE runs here (a display, or Blender's fallback to
surfaceless EGL on a headless machine) is only known by trying.
"""

import json
import os
import sys

import bpy


def gpu_devices():
    """`TYPE name` of every GPU device Cycles can use, for each device type."""
    found = []
    try:
        prefs = bpy.context.preferences.addons["cycles"].preferences
    except KeyError:
        return found
    for kind in ("CUDA", "OPTIX", "HIP", "ONEAPI", "METAL"):
        try:
            prefs.compute_device_type = kind
        except TypeError:
            continue  # not a device type of this build
        try:
            devices = prefs.get_devices_for_type(kind)
        except Exception:
            prefs.refresh_devices()
            devices = prefs.devices
        for d in devices:
            if d.type == kind:
                found.append("%s %s" % (kind, d.name))
    return found


def caps():
    import _cycles
    return {
        "version": bpy.app.version_string.split()[0],
        "openimagedenoise": bool(getattr(_cycles, "with_openimagedenoise", False)),
        "osl": bool(getattr(_cycles, "with_osl", False)),
        "devices": gpu_devices(),
    }


def eevee(path):
    scene = bpy.context.scene
    engines = [e.identifier for e in
               bpy.types.RenderSettings.bl_rna.properties["engine"].enum_items]
    # 4.2-4.x call it BLENDER_EEVEE_NEXT; 3.x and 5.0 BLENDER_EEVEE.
    engine = next((e for e in ("BLENDER_EEVEE_NEXT", "BLENDER_EEVEE") if e in engines), None)
    if engine is None:
        print("tessera: no EEVEE engine in this build", flush=True)
        return
    scene.render.engine = engine
    scene.render.resolution_x, scene.render.resolution_y = 16, 16
    scene.render.resolution_percentage = 100
    try:
        scene.eevee.taa_render_samples = 1
    except AttributeError:
        pass
    scene.render.image_settings.file_format = "PNG"
    scene.render.filepath = path
    bpy.ops.render.render(write_still=True)
    if os.path.getsize(path) > 0:
        print("TESSERA_EEVEE ok", flush=True)


def main():
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    print("TESSERA_CAPS " + json.dumps(caps()), flush=True)
    if len(argv) == 2 and argv[0] == "--eevee":
        eevee(argv[1])


main()
