"""Write a copy of a .blend whose absolute file references are made `//`-relative.

The submit-time alternative (or fallback) to remap.py's load-time rewriting, as
BAT's pack does it: the copy goes into the job's file set in place of the
original, at the original's place in the mirrored tree, so no path needs
rewriting on the worker. The user's file is only read, never written.

    blender -b FILE.blend --python-exit-code 3 --python blender/rewrite_library.py -- \
        --out COPY.blend [--only PATHS.json]

FILE.blend must be opened at its real location: its relative paths resolve
against its own folder, and the new relative paths are computed from there.
COPY.blend can be written anywhere (`relative_remap=False` keeps every `//` path
verbatim instead of re-basing it on COPY's folder); it only works once placed
where FILE.blend sits in the mirrored tree.

Rewrites only references *stored in FILE.blend*: its own datablocks and the
paths of the libraries it links directly (deps.py's entries with
`owner == null` when run on FILE.blend). Data linked from other libraries lives
in those files: run this once per file that deps.py names as an `owner` of an
absolute reference (and on the scene itself for owner null).

--only PATHS.json: a JSON list of absolute paths (deps.py `abs` values); only
references resolving to one of them are rewritten (e.g. leave paths that a
worker's --path-map resolves from shared storage). Default: every absolute one.

Prints one line per rewritten reference (`rewrite_library: KIND 'NAME': OLD -> NEW`)
and exits 0; exits 2 with `rewrite_library.py: error: ...` on bad input or a
reference that cannot be made relative (another drive on Windows), and 3 on a
Python error. No COPY.blend is written unless every reference could be rewritten.
"""

import argparse
import json
import os
import sys

import bpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deps  # noqa: E402  (needs the path above)


def fail(msg):
    sys.stdout.flush()
    sys.stderr.write("rewrite_library.py: error: %s\n" % msg)
    sys.stderr.flush()
    sys.exit(2)


def main():
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    p = argparse.ArgumentParser(prog="rewrite_library.py", add_help=False)
    p.add_argument("--out")
    p.add_argument("--only")
    args, unknown = p.parse_known_args(argv)
    if not args.out or unknown:
        fail("usage: blender -b FILE.blend --python rewrite_library.py -- --out COPY.blend "
             "[--only PATHS.json]")
    if not bpy.data.filepath:
        fail("no .blend file is loaded: give the file before --python")
    src = os.path.abspath(bpy.data.filepath)
    out = os.path.abspath(args.out)
    if os.path.exists(out) and os.path.samefile(out, src):
        fail("--out must not be the file itself (the user's files are never modified)")
    only = None
    if args.only:
        try:
            with open(args.only, encoding="utf-8") as f:
                only = {os.path.normpath(x) for x in json.load(f)}
        except (OSError, ValueError) as e:
            fail("cannot read %s: %s" % (args.only, e))

    base = os.path.dirname(src)
    changes = []
    for ref in deps.collect():
        if ref.owner is not None or not ref.absolute_ref or ref.kind == "other":
            continue  # stored in another file, already relative, or not writable here
        if only is not None and ref.abs not in only:
            continue
        try:
            rel = os.path.relpath(ref.abs, base)
        except ValueError:
            fail("%s %r: %s is on another drive than %s" % (ref.kind, ref.name, ref.abs, src))
        new = "//" + rel.replace(os.sep, "/")
        if ref.written.endswith(("/", "\\")):
            new += "/"
        if ref.set_written is None:
            fail("%s %r: its path cannot be rewritten" % (ref.kind, ref.name))
        ref.set_written(new)
        kept = ref.get_written()
        if kept != new:
            fail("%s %r: set to %r but Blender kept %r" % (ref.kind, ref.name, new, kept))
        changes.append((ref, new))
        print("rewrite_library: %s %r: %s -> %s" % (ref.kind, ref.name, ref.written, new),
              flush=True)

    os.makedirs(os.path.dirname(out), exist_ok=True)
    # copy=True: bpy.data.filepath stays the user's file; relative_remap=False: `//` paths
    # are written as they are, relative to where the copy will be placed.
    bpy.ops.wm.save_as_mainfile(filepath=out, copy=True, relative_remap=False, compress=False)
    print("rewrite_library: %d reference(s) made relative, wrote %s" % (len(changes), out),
          flush=True)


main()
