"""Point a loaded scene's absolute file references at the worker's job root.

Imported by session.py (run with blender/ on sys.path; needs deps.py beside it):

    import remap
    problems = remap.remap(job_root, mapping)   # after the .blend is loaded, before rendering

The farm mirrors the artist's directory tree on the worker, from the deepest
common folder of the scene and all its files, under `job_root`. `//`-relative
paths therefore resolve unchanged (a library's relative paths against the
library's own mirrored folder); only absolute references must be rewritten.

Contract:

- `mapping`: {original absolute path: new absolute path of the same file under
  job_root}. Keys are the `abs` values of deps.py's entries whose
  `absolute_ref` is true, e.g. {"/mnt/assets/wood.png": "/job/mnt/assets/wood.png"}.
  For pattern entries the key is the pattern's own `abs` (UDIM: with the
  `<UDIM>` token; sequence: the stored frame's file; directory: the folder).
  Keys may also be member files: a pattern entry whose `abs` is not a key is
  moved by the first member found, keeping the layout (all members of one
  entry must land in one folder, as the mirror does). Keys and values are
  normalised with os.path.normpath; other keys are ignored.
- Every absolute reference whose resolved path is a key is set to the mapped
  path (stored absolute): libraries (`lib.filepath` + `lib.reload()`, parents
  before the libraries they link), images (+ `reload()`), fonts, sounds, movie
  clips, volumes, cache files (and their layers), external point caches, fluid
  and ocean bake folders, mesh caches, IES/OSL nodes, VSE image/movie strips.
  Datablocks that come from linked libraries are rewritten the same way: in
  Blender 3.4 Python may set `filepath` on a linked image (or other linked ID)
  and the render then reads the new file (verified pixel-exact, see
  blender/README.md). The change lives only in memory: nothing is saved.
- Returns a list of problems, one line each, empty when all is well:
  a mapped reference Blender did not keep (read back after setting), a
  reference that cannot be rewritten (e.g. a disk point cache, whose folder
  follows its .blend), and, after remapping, every reference (absolute or
  relative) that still resolves outside `job_root` (it would read the worker's
  own disk, or nothing). Missing files are not problems here: session.py's
  `missing` list reports them.

Blender prints warnings while loading a scene whose absolute library paths do
not exist on the worker ("Cannot find lib ..."); the linked data is read again by
`lib.reload()` here, so those lines are expected before remap() runs.
"""

import os

import deps


def _under(path, root):
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives (Windows) or mixed absolute/relative
        return False


def _lookup(ref, mapping):
    """New absolute path for a reference, or None when the mapping does not name it."""
    if ref.abs in mapping:
        return mapping[ref.abs]
    for m in ref.members:
        if m in mapping:
            old_dir = os.path.dirname(m)
            new_dir = os.path.dirname(mapping[m])
            return os.path.normpath(os.path.join(new_dir, os.path.relpath(ref.abs, old_dir)))
    return None


def _describe(ref):
    where = " (in %s)" % ref.owner if ref.owner else ""
    return "%s %r%s: %r" % (ref.kind, ref.name, where, ref.written)


def _store(ref, new_path, problems):
    """Write new_path into the datablock and check that Blender kept it."""
    value = new_path
    if ref.written.endswith(("/", "\\")) and not value.endswith(os.sep):
        value += os.sep  # folders stored with a trailing slash keep it
    if ref.set_written is None:
        problems.append("%s: cannot be remapped (the path follows the .blend file)"
                        % _describe(ref))
        return False
    try:
        ref.set_written(value)
    except Exception as e:  # read-only property, failed reload, ...
        problems.append("%s: cannot set %r: %s" % (_describe(ref), value,
                                                    " ".join(str(e).split())))
        return False
    kept = ref.get_written() if ref.get_written is not None else value
    if os.path.normpath(kept) != os.path.normpath(value):
        problems.append("%s: set to %r but Blender kept %r" % (_describe(ref), value, kept))
        return False
    return True


def _lib_depth(lib):
    """0 for a library the scene links, 1 for one that library links, ..."""
    depth = 0
    while lib.parent is not None:
        lib = lib.parent
        depth += 1
    return depth


def _remap_libraries(mapping, problems):
    """Libraries one at a time, parents before children, walking again after each
    reload because a reload re-creates (and resets) the libraries it links."""
    failed = set()
    n_libs = len(list(deps.library_refs()))
    for _ in range(4 * n_libs + 4):
        deps.reset_caches()
        todo = None
        # Parents first: reloading a library re-reads the libraries it links.
        for ref in sorted(deps.library_refs(), key=lambda r: _lib_depth(r.id_block)):
            if not ref.absolute_ref or ref.name in failed:
                continue
            new = _lookup(ref, mapping)
            if new is not None and os.path.normpath(ref.written) != new:
                todo = (ref, new)
                break
        if todo is None:
            return
        ref, new = todo
        if not _store(ref, new, problems):
            failed.add(ref.name)
    problems.append("libraries: remapping did not settle (a library reload keeps resetting "
                    "paths)")


def remap(root, mapping):
    """Rewrite absolute references of the loaded scene per `mapping`; return problems."""
    root = os.path.normpath(os.path.abspath(root))
    mapping = {os.path.normpath(k): os.path.normpath(v) for k, v in mapping.items()}
    problems = []

    _remap_libraries(mapping, problems)

    # Everything else, after the libraries: a library reload re-reads its datablocks,
    # which would undo paths set on them earlier.
    for ref in deps.collect():
        if ref.kind == "library" or not ref.absolute_ref:
            continue
        new = _lookup(ref, mapping)
        if new is None or os.path.normpath(ref.written) == new:
            continue
        _store(ref, new, problems)

    # What still points outside the job root after remapping.
    for ref in deps.collect():
        if not _under(ref.abs, root):
            why = "absolute path not in the mapping" if ref.absolute_ref else \
                "relative path resolves outside the job root"
            problems.append("%s -> %s: %s" % (_describe(ref), ref.abs, why))
    return problems
