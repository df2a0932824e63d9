"""Test driver: load a scene from a job root, remap it, render frames.

    blender -b JOBROOT/.../scene.blend --python-exit-code 3 --python tests/blender/render_remapped.py -- \
        --root JOBROOT --map MAP.json --out DIR --frames 1,2,3 [--problems OUT.json]

MAP.json is remap.py's mapping ({old abs path: new abs path}); `{}` renders the
scene as loaded (a control: what the worker would get without remapping).
Frames are written as DIR/frame_####.png exactly as session.py writes them
(render.frame_path + write_still), so the pixels can be compared with a plain
`blender -b SCENE -o DIR/frame_#### -f N` render of the original files.
Remap problems are printed (and written to --problems); they do not stop the render.
"""

import argparse
import json
import os
import sys

import bpy

# remap.py (and deps.py, which it imports) as shipped, in the repository's blender/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "blender"))
import remap  # noqa: E402  (needs the path above)


def main():
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    p = argparse.ArgumentParser(prog="render_remapped.py")
    p.add_argument("--root", required=True)
    p.add_argument("--map", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--frames", default="1")
    p.add_argument("--problems", default=None)
    args = p.parse_args(argv)
    with open(args.map, encoding="utf-8") as f:
        mapping = json.load(f)
    problems = remap.remap(args.root, mapping)
    for line in problems:
        print("remap problem: %s" % line, flush=True)
    if args.problems:
        with open(args.problems, "w", encoding="utf-8") as f:
            json.dump(problems, f, indent=1)
    scene = bpy.context.scene
    r = scene.render
    os.makedirs(args.out, exist_ok=True)
    for frame in (int(x) for x in args.frames.split(",")):
        r.filepath = os.path.join(os.path.abspath(args.out), "frame_####")
        r.filepath = scene.render.frame_path(frame=frame)
        scene.frame_set(frame)
        bpy.ops.render.render(write_still=True)
    print("render_remapped: %d problem(s)" % len(problems), flush=True)


main()
