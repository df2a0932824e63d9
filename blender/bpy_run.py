"""Runs a Blender-side script in the `bpy` module as the Blender binary runs it.

The worker starts a `bpy` runtime (the official Blender build from PyPI, a
Python module in a venv) as

    python -I bpy_run.py --script SCRIPT [--scene SCENE] [--scene-python] -- ARGS

which does what `blender -b --factory-startup --disable-autoexec SCENE
--python-exit-code 3 --python SCRIPT -- ARGS` does with the binary, so every
script (the render session, the capability probe) runs unchanged in both:

- factory settings: no preferences, startup file or add-ons of the worker's
  account (`--factory-startup`);
- the scene is opened without running the Python stored in it
  (`use_scripts=False`, as `--disable-autoexec`) unless `--scene-python`;
- `sys.argv` keeps `-- ARGS`, where the script (and Cycles' own
  `--cycles-device`) read their options;
- an uncaught exception exits with status 3 (`--python-exit-code 3`).

Python itself runs isolated (`-I`): no PYTHON* variables, no user site-packages.
"""

import argparse
import os
import runpy
import sys
import traceback


def main():
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="bpy_run.py")
    p.add_argument("--script", required=True)
    p.add_argument("--scene")
    p.add_argument("--scene-python", action="store_true")
    args = p.parse_args(argv[:cut])

    import bpy

    bpy.ops.wm.read_factory_settings(use_empty=False)
    if args.scene:
        try:
            bpy.ops.wm.open_mainfile(filepath=args.scene, load_ui=False,
                                     use_scripts=args.scene_python)
        except RuntimeError as e:
            msg = " ".join(str(e).split())
            print("Error: Cannot read file '%s': %s" % (args.scene, msg), flush=True)
            sys.stdout.flush()
            os._exit(1)
    sys.argv = [args.script] + argv[cut:]
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)


main()
