"""The `blender` command line over a `bpy` module runtime: the arguments the
worker and the tests pass, no more. It lets tests/tests/addon.rs start a
worker whose Blender is the 4.5 module, so that a scene the add-on saved in
4.5 (which crashes Blender 3.4 on load) renders on the farm, until workers
run `bpy` runtimes themselves (issue 20, item 1); then this file goes.

    VENV/bin/python -I tests/addon/bpy_blender.py --version
    VENV/bin/python -I tests/addon/bpy_blender.py -b [--factory-startup] [--disable-autoexec]
        [SCENE.blend] [--python-exit-code N] [--python FILE | --python-expr CODE]
        [-o PATH] [-s N] [-e N] [-a | -f N] [-- ARGS...]

Arguments are taken in order, as Blender takes them; everything after `--`
is left to the scripts, which read it from sys.argv as in Blender.
"""

import os
import sys
import traceback

import bpy


def run_python(kind, text, exit_code):
    """Runs a --python file or --python-expr code as Blender does: an
    exception prints its traceback, and ends the process with exit_code when
    one was given (Blender's --python-exit-code), else carries on."""
    try:
        if kind == "file":
            with open(text, encoding="utf-8") as f:
                code = compile(f.read(), text, "exec")
            scope = {"__name__": "__main__", "__file__": text}
        else:
            code = compile(text, "<string>", "exec")
            scope = {"__name__": "__main__"}
        exec(code, scope)  # noqa: S102 - this is what --python means
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - Blender prints every error of a script
        traceback.print_exc()
        sys.stdout.flush()
        if exit_code:
            os._exit(exit_code)


def render(frames):
    scene = bpy.context.scene
    pattern = scene.render.filepath
    for frame in frames:
        scene.frame_set(frame)
        # Blender's -o expands `#` to the frame number; render.filepath alone does not.
        scene.render.filepath = bpy.path.abspath(pattern)
        path = scene.render.frame_path(frame=frame)
        scene.render.filepath = path
        bpy.ops.render.render(write_still=True)
        scene.render.filepath = pattern


def main(argv):
    if "--version" in argv[:1]:
        print("Blender", bpy.app.version_string.split()[0], flush=True)
        return 0
    # Scripts read their own arguments after `--` from sys.argv, as in Blender.
    sys.argv = ["blender"] + argv
    args = argv[:argv.index("--")] if "--" in argv else list(argv)
    exit_code = 0
    autoexec = True
    start, end = None, None
    i = 0
    while i < len(args):
        arg = args[i]
        value = args[i + 1] if i + 1 < len(args) else None
        i += 1
        if arg in ("-b", "--background"):
            continue
        if arg == "--factory-startup":
            bpy.ops.wm.read_factory_settings(use_empty=False)
        elif arg in ("--disable-autoexec", "-Y"):
            autoexec = False
        elif arg == "--python-exit-code":
            exit_code, i = int(value), i + 1
        elif arg in ("--python", "-P"):
            run_python("file", value, exit_code)
            i += 1
        elif arg == "--python-expr":
            run_python("expr", value, exit_code)
            i += 1
        elif arg in ("-o", "--render-output"):
            bpy.context.scene.render.filepath = value
            i += 1
        elif arg in ("-s", "--frame-start"):
            start, i = int(value), i + 1
        elif arg in ("-e", "--frame-end"):
            end, i = int(value), i + 1
        elif arg in ("-f", "--render-frame"):
            render([int(value)])
            i += 1
        elif arg in ("-a", "--render-anim"):
            scene = bpy.context.scene
            render(range(start or scene.frame_start, (end or scene.frame_end) + 1))
        elif arg.endswith(".blend") and not arg.startswith("-"):
            if not os.path.isfile(arg):
                print("Error: Cannot read file \"%s\": No such file or directory" % arg,
                      flush=True)
                return 1
            bpy.ops.wm.open_mainfile(filepath=os.path.abspath(arg), load_ui=False,
                                     use_scripts=autoexec)
        else:
            print("bpy_blender.py: unsupported argument %r" % arg, flush=True)
            return 2
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skips the module's teardown, as `blender -b` ends without one.
    os._exit(code)
