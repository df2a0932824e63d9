"""A job's file set, by the same rules as `tessera deps` / `tessera submit`
(cli/src/fileset.rs): the scene's external files are traced with deps.py (the
very script the CLI runs, copied into this package by scripts/addon.sh), here
on the open file in memory, unsaved changes included. The job root mirrors
the artist's folders from the deepest folder holding the scene and every
file; absolute references become mappings into the root.

The scene's bytes come from a copy saved for the job (relative paths kept as
they are), listed under the original's path, so the artist's .blend is only
ever read.
"""

import os

import bpy

from . import deps


def _norm(path):
    return os.path.normpath(os.path.abspath(path))


def _parts(path):
    """Path components, for sorting as Rust sorts paths (component by component)."""
    return [p for p in path.split(os.sep) if p]


def _under(root, path):
    rel = os.path.relpath(path, root)
    if rel == os.curdir or rel.startswith(os.pardir + os.sep) or rel == os.pardir:
        raise ValueError("%s is not under %s" % (path, root))
    return "/".join(_parts(rel))


def describe(f):
    """How the scene refers to a file, as `tessera submit` words it."""
    owner = " in library %s" % f["owner"] if f.get("owner") else ""
    return '%s "%s"%s as `%s`' % (f["kind"], f.get("name") or "", owner, f.get("written") or "")


def trace(scene=None):
    """deps.py's report on the open file (the same JSON `tessera deps` reads)."""
    return deps.report(scene or bpy.context.scene)


class Layout:
    """The files of a job under its root: what fileset.rs's `layout` builds."""

    def __init__(self, report, scene_copy):
        scene = _norm(report["scene"])
        found, missing = set(), []
        for f in report["files"]:
            for m in f["members"]:
                found.add(_norm(m))
            for m in f["missing"]:
                missing.append("%s (%s)" % (m, describe(f)))
        found.discard(scene)
        files = sorted(found, key=_parts)
        dirs = [os.path.dirname(p) for p in [scene] + files]
        self.root = os.path.commonpath(dirs) if dirs else os.sep
        self.scene = _under(self.root, scene)
        self.source = scene
        #: (path under the root, file to read), the scene (its copy) first.
        self.files = [(self.scene, scene_copy)] + [(_under(self.root, p), p) for p in files]
        self.missing = missing
        maps = set()
        for f in report["files"]:
            if f.get("absolute_ref"):
                try:
                    maps.add((f["abs"], _under(self.root, _norm(f["abs"]))))
                except ValueError:
                    pass
        self.mappings = sorted(maps)

    def entries(self, digests):
        """FileEntry dicts, given {local path: (digest, size)}."""
        out = []
        for rel, local in self.files:
            digest, size = digests[local]
            mode = 0o755 if os.stat(local).st_mode & 0o111 else 0o644
            out.append({"path": rel, "digest": digest, "size": size, "mode": mode, "shared": ""})
        return out

    def file_set(self, entries):
        """The FileSet as the API takes it, or None for a self-contained scene
        (as the CLI submits it: no file set at all)."""
        if len(entries) == 1 and not self.mappings and not self.missing:
            return None
        return {"scene": self.scene, "files": entries,
                "mappings": [{"from": a, "to": b} for a, b in self.mappings],
                "missing": list(self.missing)}


def features(report):
    """The Blender features the scene needs (cli/src/fileset.rs `features`)."""
    out = []
    if report.get("denoise"):
        out.append("optix-denoise" if report.get("denoiser") == "OPTIX" else "openimagedenoise")
    if "EEVEE" in (report.get("engine") or ""):
        out.append("eevee")
    return out


def frames_of(report):
    """The scene's frame range in frame-set syntax."""
    f = report["facts"]
    if f["frame_step"] in (0, 1):
        return "%d-%d" % (f["frame_start"], f["frame_end"])
    return "%d-%dx%d" % (f["frame_start"], f["frame_end"], f["frame_step"])
