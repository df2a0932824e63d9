"""List every external file a .blend needs (its job "file set"), as JSON.

Run with Blender (3.4+) on the scene itself:

    blender -b SCENE.blend --python-exit-code 3 --python blender/deps.py -- --out FILE.json

Exit 0 and FILE.json written on success. On bad input (no --out, no .blend loaded,
unwritable output) a line starting with `deps.py: error:` goes to stderr and the
exit status is 2; a Python error exits 3 (from --python-exit-code); Blender
itself exits 1 when SCENE.blend cannot be read, before this script runs.

One load sees everything: Blender reads indirect libraries too, and their
datablocks appear in bpy.data with `.library` set, so nothing is opened twice.
Missing libraries are listed (kind "library", in "missing"), but what *they* need
cannot be known until they exist.

Also a module: remap.py imports it (`import deps`) to walk the same references
it rewrites, so the two can never disagree about what a reference is.

JSON contract (version 1):

    {"version": 1,
     "saved_with": "3.4",        # "MAJOR.MINOR" of the Blender that saved the file.
                                 # .blend files store no patch version: bpy.data.version
                                 # is (3, 4, 6) for a 3.4.1 file, 6 being the *file
                                 # subversion*, so "3.4.1" cannot be recovered.
     "engine": "CYCLES",         # scene.render.engine of the scene that renders
     "denoise": false,           # see denoise_needed(): true when a render of this scene
                                 # runs a denoiser (needs OpenImageDenoise/OptiX)
     "neighbours": [],           # see neighbours(): why a tile of this scene depends on
                                 # pixels beyond it ([]: tiles need no overscan)
     "scene": "/abs/path/scene.blend",
     "facts": {"frame_start": 1, "frame_end": 250, "frame_step": 1,
               "width": 1920, "height": 1080, "file_format": "PNG", "fps": 24.0},
     "files": [ {
        "kind": "image|library|font|sound|movieclip|volume|cachefile|pointcache|fluid|
                 ocean|meshcache|sequence_strip|ies|script|other",
        "name": "datablock name",           # for pointcache/fluid/ocean/meshcache:
                                            # "Object/Modifier" (or "Object/ParticleSystem");
                                            # for strips: "Scene/Strip"; "other": null
        "owner": null | "/abs/library.blend",  # the library holding the datablock (for a
                                            # library: the library that links it); null = the scene
        "written": "//tex/checker.png",     # the path string exactly as stored; for disk point
                                            # caches, which store no path, the implied
                                            # "//blendcache_<blendname>/" of the owner file; for
                                            # an indirect library, the value Blender holds in
                                            # memory, re-based on the scene (see lib_abs)
        "abs": "/abs/normalized/path",      # resolved as Blender does (// against the owner's
                                            # folder), normalised; keeps <UDIM>/<UVTILE> tokens;
                                            # a folder for pattern "directory"
        "absolute_ref": true|false,         # the stored path is absolute (not //-relative)
        "pattern": null | "udim" | "sequence" | "directory",
        "members": ["/abs/file", ...],      # existing files it covers, sorted (single file:
                                            # [abs] if it exists, else [])
        "missing": ["/abs/...", ...]        # files it needs that do not exist (single file:
                                            # [abs] if absent)
     }, ...]}

Patterns:
  - udim: the image's tiles (image.tiles) with <UDIM>/<UVTILE> filled in; missing = tiles
    listed in the .blend whose file is absent.
  - sequence: image/movie-clip/volume sequences: every file in the folder that matches the
    numbered pattern Blender uses (the last run of digits before the extension, e.g.
    frame_0001.png -> frame_<N padded to 4>.png). For image sequences, missing = the
    frames the scene's frame range needs (through each Image Texture node / texture's
    image user) that do not exist; elsewhere, missing = [abs] only when no frame exists.
    Also VSE image strips with more than one element (members = the elements' files).
  - directory: point caches on disk (files "<prefix>_<frame>_<index>.*" in the cache
    folder), fluid and ocean bake folders (every file below the folder, recursively).
    missing = [abs] when the cache is marked baked (point cache) or expected (fluid
    domain, cached ocean) but no file is there.

Packed data is not listed (packed images, fonts, sounds, volumes, libraries).
Generated/viewer images, `<builtin>` fonts and in-memory texts have no file.
Anything bpy.utils.blend_paths() reports that the walk above did not cover is
listed as kind "other" (name/owner null) so nothing is dropped silently.

"denoise": scene.cycles.use_denoising and at least one enabled view layer with
view_layer.cycles.use_denoising (Cycles only denoises a layer when both are on;
the view-layer flag defaults to on, so it alone means nothing), or an unmuted
compositor Denoise node in an active compositing tree (also OpenImageDenoise).
"""

import argparse
import json
import os
import re
import sys
import time

import bpy

UDIM_TOKENS = ("<UDIM>", "<UVTILE>")


# ---------------------------------------------------------------- paths

def _norm(path):
    return os.path.normpath(path) if path else path


def is_relative(path):
    return path.startswith("//")


def main_dir():
    return os.path.dirname(os.path.abspath(bpy.data.filepath))


_lib_abs_cache = {}


def lib_abs(lib):
    """Absolute path of a library file (None: the scene itself).

    In memory, every Library.filepath that is `//`-relative is relative to the *scene*,
    also for indirect libraries: Blender re-bases the path stored in the parent library
    when it reads it (`//../../assets/mats.blend` in lib/deep/prop.blend shows up as
    `//../assets/mats.blend` when loaded from shots/shot.blend). So resolve against the
    scene's folder, never the parent's (which bpy.path.abspath(library=lib.parent)
    would do)."""
    if lib is None:
        return os.path.abspath(bpy.data.filepath)
    key = lib.name
    if key not in _lib_abs_cache:
        _lib_abs_cache[key] = resolve(lib.filepath, main_dir())
    return _lib_abs_cache[key]


def resolve(path, base_dir):
    """Resolve a stored path as Blender does: `//x` against base_dir, absolute as is."""
    if is_relative(path):
        rest = path[2:].replace("\\", "/")
        return _norm(os.path.join(base_dir, rest))
    return _norm(path)


def owner_dir(id_block):
    """Folder `//` means for data of this datablock: its library's, else the scene's."""
    lib = getattr(id_block, "library", None)
    return os.path.dirname(lib_abs(lib)) if lib is not None else main_dir()


def owner_path(id_block):
    lib = getattr(id_block, "library", None)
    return lib_abs(lib) if lib is not None else None


# ---------------------------------------------------------------- folder listings

_listing_cache = {}


def listdir(folder):
    """Cached directory listing (sorted file names), [] when absent."""
    if folder not in _listing_cache:
        try:
            _listing_cache[folder] = sorted(
                e.name for e in os.scandir(folder) if e.is_file())
        except OSError:
            _listing_cache[folder] = []
    return _listing_cache[folder]


def walk_files(folder):
    """Every file below folder (recursively), sorted; [] when absent."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        out.extend(os.path.join(dirpath, f) for f in filenames)
    return sorted(out)


# ---------------------------------------------------------------- sequences

def sequence_decode(path):
    """Split a numbered file path like Blender's BLI_path_sequence_decode:
    the last run of digits in the file name before its last dot.
    Returns (head, tail, digits) or None when the name has no digits."""
    folder, name = os.path.split(path)
    dot = name.rfind(".")
    end = dot if dot > 0 else len(name)
    m = None
    for m in re.finditer(r"\d+", name[:end]):
        pass
    if m is None:
        return None
    return os.path.join(folder, name[:m.start()]), name[m.end():], m.end() - m.start()


def sequence_encode(head, tail, digits, frame):
    # BLI_path_sequence_encode: printf("%s%.*d%s") pads to at least `digits`.
    return "%s%0*d%s" % (head, digits, frame, tail) if frame >= 0 else \
        "%s-%0*d%s" % (head, digits, -frame, tail)


def sequence_members(path):
    """Existing files of the numbered sequence `path` belongs to (sorted by frame)."""
    dec = sequence_decode(path)
    if dec is None:
        return [path] if os.path.isfile(path) else []
    head, tail, digits = dec
    folder, prefix = os.path.split(head)
    pat = re.compile(re.escape(prefix) + r"(-?\d+)" + re.escape(tail) + r"\Z")
    found = []
    for name in listdir(folder):
        m = pat.match(name)
        if not m:
            continue
        num = m.group(1)
        n = int(num)
        # Only names Blender itself would generate for frame n (frame_01.png is not
        # frame 1 of frame_0001.png).
        if sequence_encode("", "", digits, n) == num:
            found.append((n, os.path.join(folder, name)))
    return [p for _, p in sorted(found)]


def image_user_frame(iu, cfra):
    """Frame number of the file an image user shows at scene frame cfra
    (BKE_image_user_frame_get in Blender 3.4)."""
    length = iu.frame_duration
    if length == 0:
        return 0
    f = cfra - iu.frame_start + 1
    if iu.use_cyclic:
        f %= length
        if f == 0:
            f = length
    f = max(0, min(f, length))
    return f + iu.frame_offset


_image_users_cache = {}


def image_users(image):
    """ImageUser structs that show `image`: Image Texture / Environment / compositor
    Image nodes (in every node tree, including groups) and image textures.
    Indexed once per walk, so many sequences do not rescan every node tree."""
    if not _image_users_cache:
        index = {}
        trees = []
        for coll in (bpy.data.materials, bpy.data.worlds, bpy.data.lights, bpy.data.textures,
                     bpy.data.scenes, bpy.data.linestyles):
            for idb in coll:
                nt = getattr(idb, "node_tree", None)
                if nt is not None:
                    trees.append(nt)
        trees.extend(bpy.data.node_groups)
        for nt in trees:
            for node in nt.nodes:
                img = getattr(node, "image", None)
                if img is not None and hasattr(node, "image_user"):
                    index.setdefault(img.as_pointer(), []).append(node.image_user)
        for tex in bpy.data.textures:
            img = getattr(tex, "image", None)
            if img is not None and hasattr(tex, "image_user"):
                index.setdefault(img.as_pointer(), []).append(tex.image_user)
        _image_users_cache["index"] = index
    return _image_users_cache["index"].get(image.as_pointer(), [])


# ---------------------------------------------------------------- references

class Ref:
    """One external path reference. `set_written(new)` stores a new path string in the
    datablock (remap.py uses it); `get_written()` reads it back."""

    def __init__(self, kind, name, owner, written, abs_path, pattern=None, members=None,
                 missing=None, set_written=None, get_written=None, id_block=None):
        self.kind = kind
        self.name = name
        self.owner = owner
        self.written = written
        self.abs = abs_path
        self.absolute_ref = not is_relative(written)
        self.pattern = pattern
        if members is None:
            exists = os.path.isfile(abs_path)
            members = [abs_path] if exists else []
            if missing is None:
                missing = [] if exists else [abs_path]
        self.members = members
        self.missing = missing or []
        self.set_written = set_written
        self.get_written = get_written
        self.id_block = id_block

    def to_json(self):
        return {"kind": self.kind, "name": self.name, "owner": self.owner,
                "written": self.written, "abs": self.abs, "absolute_ref": self.absolute_ref,
                "pattern": self.pattern, "members": self.members, "missing": self.missing}


def _attr_setter(obj, attr, reload=None):
    def set_written(value):
        setattr(obj, attr, value)
        if reload is not None:
            reload()
    return set_written


def _attr_getter(obj, attr):
    return lambda: getattr(obj, attr)


def _id_ref(kind, idb, attr="filepath", reload=None, **kw):
    written = getattr(idb, attr)
    return Ref(kind, idb.name, owner_path(idb), written, resolve(written, owner_dir(idb)),
               set_written=_attr_setter(idb, attr, reload), get_written=_attr_getter(idb, attr),
               id_block=idb, **kw)


def _is_packed(idb):
    if getattr(idb, "packed_file", None) is not None:
        return True
    return len(getattr(idb, "packed_files", ())) > 0


def image_refs(scene):
    for img in bpy.data.images:
        if img.source not in {"FILE", "SEQUENCE", "TILED", "MOVIE"} or not img.filepath:
            continue
        if _is_packed(img):
            continue
        written = img.filepath
        abs_path = resolve(written, owner_dir(img))
        common = dict(set_written=_attr_setter(img, "filepath", img.reload),
                      get_written=_attr_getter(img, "filepath"), id_block=img)
        if img.source == "TILED" and any(t in abs_path for t in UDIM_TOKENS):
            members, missing = [], []
            for tile in img.tiles:
                n = tile.number
                u, v = (n - 1001) % 10 + 1, (n - 1001) // 10 + 1
                p = abs_path.replace("<UDIM>", str(n)).replace("<UVTILE>", "u%d_v%d" % (u, v))
                (members if os.path.isfile(p) else missing).append(p)
            yield Ref("image", img.name, owner_path(img), written, abs_path, "udim",
                      sorted(members), sorted(missing), **common)
        elif img.source == "SEQUENCE":
            members = sequence_members(abs_path)
            missing = []
            dec = sequence_decode(abs_path)
            users = image_users(img)
            if dec is not None and users:
                have = set(members)
                need = set()
                for iu in users:
                    for cfra in range(scene.frame_start, scene.frame_end + 1):
                        need.add(sequence_encode(*dec, image_user_frame(iu, cfra)))
                missing = sorted(need - have)
            elif not members:
                missing = [abs_path]
            yield Ref("image", img.name, owner_path(img), written, abs_path, "sequence",
                      members, missing, **common)
        else:
            yield Ref("image", img.name, owner_path(img), written, abs_path, **common)


def library_refs():
    for lib in bpy.data.libraries:
        if lib.packed_file is not None:
            continue
        written = lib.filepath
        abs_path = lib_abs(lib)
        owner = lib_abs(lib.parent) if lib.parent is not None else None
        yield Ref("library", lib.name, owner, written, abs_path,
                  set_written=_attr_setter(lib, "filepath", lib.reload),
                  get_written=_attr_getter(lib, "filepath"), id_block=lib)


def simple_id_refs():
    for font in bpy.data.fonts:
        if font.filepath and font.filepath != "<builtin>" and not _is_packed(font):
            yield _id_ref("font", font)
    for snd in bpy.data.sounds:
        if snd.filepath and not _is_packed(snd):
            yield _id_ref("sound", snd)
    for clip in bpy.data.movieclips:
        if not clip.filepath:
            continue
        if clip.source == "SEQUENCE":
            abs_path = resolve(clip.filepath, owner_dir(clip))
            members = sequence_members(abs_path)
            yield _id_ref("movieclip", clip, pattern="sequence", members=members,
                          missing=[] if members else [abs_path])
        else:
            yield _id_ref("movieclip", clip)
    for vol in bpy.data.volumes:
        if not vol.filepath or _is_packed(vol):
            continue
        if vol.is_sequence:
            abs_path = resolve(vol.filepath, owner_dir(vol))
            members = sequence_members(abs_path)
            yield _id_ref("volume", vol, pattern="sequence", members=members,
                          missing=[] if members else [abs_path])
        else:
            yield _id_ref("volume", vol)
    for cf in bpy.data.cache_files:
        if not cf.filepath:
            continue
        if cf.is_sequence:
            abs_path = resolve(cf.filepath, owner_dir(cf))
            members = sequence_members(abs_path)
            yield _id_ref("cachefile", cf, pattern="sequence", members=members,
                          missing=[] if members else [abs_path])
        else:
            yield _id_ref("cachefile", cf)
        for i, layer in enumerate(getattr(cf, "layers", ())):
            if layer.filepath:
                written = layer.filepath
                yield Ref("cachefile", "%s/layer%d" % (cf.name, i), owner_path(cf), written,
                          resolve(written, owner_dir(cf)),
                          set_written=_attr_setter(layer, "filepath"),
                          get_written=_attr_getter(layer, "filepath"), id_block=cf)


# ---------------------------------------------------------------- caches

def _hex_name(name):
    # Point cache files of an unnamed cache are prefixed with the owner's name in hex.
    return "".join("%02X" % b for b in name.encode("utf-8"))


def point_cache_refs():
    for ob in bpy.data.objects:
        caches = []  # (label, PointCache)
        for md in ob.modifiers:
            pc = getattr(md, "point_cache", None)
            if pc is not None:
                caches.append(("%s/%s" % (ob.name, md.name), pc))
            if md.type == "DYNAMIC_PAINT" and md.canvas_settings is not None:
                for surf in md.canvas_settings.canvas_surfaces:
                    caches.append(("%s/%s/%s" % (ob.name, md.name, surf.name), surf.point_cache))
        for psys in ob.particle_systems:
            caches.append(("%s/%s" % (ob.name, psys.name), psys.point_cache))
        for label, top in caches:
            for pc in top.point_caches:  # a cache may hold a list of caches
                ref = _point_cache_ref(ob, label, pc)
                if ref is not None:
                    yield ref
        for md in ob.modifiers:
            yield from _modifier_refs(ob, md)


def _point_cache_ref(ob, label, pc):
    if not (pc.use_disk_cache or pc.use_external):
        return None  # memory caches live inside the .blend
    lib = ob.library if pc.use_library_path else None
    base_file = lib_abs(lib) if lib is not None else os.path.abspath(bpy.data.filepath)
    if pc.use_external:
        if not pc.filepath:
            return None
        written = pc.filepath
        setter, getter = _attr_setter(pc, "filepath"), _attr_getter(pc, "filepath")
    else:
        stem = os.path.basename(base_file)
        if stem.endswith(".blend"):
            stem = stem[:-6]
        written = "//blendcache_%s/" % stem
        setter, getter = None, None  # the folder follows the .blend; nothing to rewrite
    folder = resolve(written, os.path.dirname(base_file))
    prefix = pc.name if (pc.name or pc.use_external) else _hex_name(ob.name)
    members = [os.path.join(folder, n) for n in listdir(folder) if n.startswith(prefix + "_")]
    missing = [folder] if (pc.is_baked and not members) else []
    return Ref("pointcache", label, owner_path(ob), written, folder, "directory", members,
               missing, set_written=setter, get_written=getter, id_block=ob)


def _dir_ref(kind, ob, md, obj, attr, expected):
    written = getattr(obj, attr)
    folder = resolve(written, owner_dir(ob))
    members = walk_files(folder)
    return Ref(kind, "%s/%s" % (ob.name, md.name), owner_path(ob), written, folder, "directory",
               members, [folder] if (expected and not members) else [],
               set_written=_attr_setter(obj, attr), get_written=_attr_getter(obj, attr),
               id_block=ob)


def _modifier_refs(ob, md):
    if md.type == "FLUID" and md.fluid_type == "DOMAIN":
        ds = md.domain_settings
        if ds.cache_directory:
            yield _dir_ref("fluid", ob, md, ds, "cache_directory",
                           expected=ds.cache_type != "REPLAY")
    elif md.type == "OCEAN" and md.filepath and md.is_cached:
        yield _dir_ref("ocean", ob, md, md, "filepath", expected=True)
    elif md.type == "MESH_CACHE" and md.filepath:
        written = md.filepath
        yield Ref("meshcache", "%s/%s" % (ob.name, md.name), owner_path(ob), written,
                  resolve(written, owner_dir(ob)), set_written=_attr_setter(md, "filepath"),
                  get_written=_attr_getter(md, "filepath"), id_block=ob)


# ---------------------------------------------------------------- nodes and strips

def node_file_refs():
    """IES and OSL script nodes that read an external file."""
    trees = []
    for coll in (bpy.data.materials, bpy.data.worlds, bpy.data.lights):
        for idb in coll:
            if getattr(idb, "node_tree", None) is not None:
                trees.append((idb, idb.node_tree))
    trees.extend((g, g) for g in bpy.data.node_groups)
    for idb, nt in trees:
        for node in nt.nodes:
            if node.bl_idname in ("ShaderNodeTexIES", "ShaderNodeScript") \
                    and node.mode == "EXTERNAL" and node.filepath:
                kind = "ies" if node.bl_idname == "ShaderNodeTexIES" else "script"
                written = node.filepath
                yield Ref(kind, "%s/%s" % (idb.name, node.name), owner_path(idb), written,
                          resolve(written, owner_dir(idb)),
                          set_written=_attr_setter(node, "filepath"),
                          get_written=_attr_getter(node, "filepath"), id_block=idb)


def strip_refs():
    for sc in bpy.data.scenes:
        if sc.sequence_editor is None:
            continue
        base = owner_dir(sc)
        editor = sc.sequence_editor
        # `strips_all` since 4.4; `sequences_all`, its old name, is gone in 5.0.
        strips = editor.strips_all if hasattr(editor, "strips_all") else editor.sequences_all
        for strip in strips:
            label = "%s/%s" % (sc.name, strip.name)
            if strip.type == "IMAGE":
                written_dir = strip.directory
                folder = resolve(written_dir, base)
                files = [os.path.join(folder, e.filename) for e in strip.elements]
                if not files:
                    continue
                members = sorted(p for p in files if os.path.isfile(p))
                missing = sorted(p for p in files if not os.path.isfile(p))
                # The stored path is the folder plus each element's file name; "abs" is the
                # first frame's file so every entry's abs is a file (or pattern) path.
                yield Ref("sequence_strip", label, owner_path(sc),
                          written_dir + strip.elements[0].filename, files[0],
                          "sequence" if len(files) > 1 else None, members, missing,
                          set_written=_strip_dir_setter(strip),
                          get_written=_strip_dir_getter(strip), id_block=sc)
            elif strip.type == "MOVIE" and strip.filepath:
                written = strip.filepath
                yield Ref("sequence_strip", label, owner_path(sc), written,
                          resolve(written, base), set_written=_attr_setter(strip, "filepath"),
                          get_written=_attr_getter(strip, "filepath"), id_block=sc)
            # SOUND strips use a Sound datablock, listed under "sound".


def _strip_dir_setter(strip):
    def set_written(value):
        folder = os.path.dirname(value)
        strip.directory = folder if folder.endswith(os.sep) else folder + os.sep
    return set_written


def _strip_dir_getter(strip):
    return lambda: strip.directory + strip.elements[0].filename


# ---------------------------------------------------------------- the walk

def reset_caches():
    """Forget resolved library paths and folder listings (after a path changed)."""
    _lib_abs_cache.clear()
    _listing_cache.clear()
    _image_users_cache.clear()


def collect(scene=None):
    """Every external reference of the loaded file, libraries included (a list of Ref)."""
    scene = scene or bpy.context.scene
    reset_caches()
    refs = []
    refs.extend(library_refs())
    refs.extend(image_refs(scene))
    refs.extend(simple_id_refs())
    refs.extend(point_cache_refs())
    refs.extend(node_file_refs())
    refs.extend(strip_refs())
    refs.extend(other_refs(refs))
    return refs


def other_refs(refs):
    """Whatever bpy.utils.blend_paths() knows that the walk above did not cover."""
    known = set()
    for r in refs:
        known.add(r.abs)
        known.update(r.members)
        known.update(r.missing)
        if r.pattern == "directory":
            known.add(r.abs + os.sep)
    # packed=False leaves packed data out (the 3.4 docstring has the meaning inverted).
    for path in bpy.utils.blend_paths(absolute=True, packed=False, local=False):
        if not path:
            continue
        p = _norm(path)
        if p in known or path in known:
            continue
        known.add(p)
        yield Ref("other", None, None, path, p)


def compositor_tree(scene):
    """The scene's compositor nodes, or None: `scene.node_tree` (with
    `use_nodes`) up to 4.5; 5.0 removed it for `compositing_node_group`, a
    node group of its own (already among bpy.data.node_groups)."""
    if hasattr(scene, "compositing_node_group"):
        return scene.compositing_node_group
    return scene.node_tree if scene.use_nodes else None


def denoise_needed(scene):
    c = getattr(scene, "cycles", None)
    if scene.render.engine == "CYCLES" and c is not None and c.use_denoising:
        for vl in scene.view_layers:
            if vl.use and getattr(vl.cycles, "use_denoising", True):
                return True
    tree = compositor_tree(scene)
    if scene.render.use_compositing and tree is not None:
        for node in tree.nodes:
            if node.bl_idname == "CompositorNodeDenoise" and not node.mute:
                return True
    return False


# Compositor nodes that pass each pixel through on its own.
PER_PIXEL_NODES = {
    "CompositorNodeRLayers", "CompositorNodeComposite", "CompositorNodeViewer",
    "NodeReroute", "NodeFrame", "NodeGroupInput", "NodeGroupOutput",
}


def neighbours(scene):
    """Why a tile of this scene depends on pixels beyond it, so that a tile
    needs an overscan margin to stitch into the frame one render gives; []
    when every pixel is rendered on its own. Cycles samples each pixel with
    its own seed and importance-samples the pixel filter, so a border render
    of such a scene is bit-identical to the same pixels of the whole frame;
    adaptive sampling (its convergence test spreads to neighbours),
    denoising, path guiding (it learns from the whole image) and compositor
    filters look further, and so do the other engines' screen-space
    effects."""
    why = []
    if scene.render.engine != "CYCLES":
        return ["the %s engine" % scene.render.engine]
    c = scene.cycles
    if c.use_adaptive_sampling:
        why.append("adaptive sampling")
    if getattr(c, "use_guiding", False):
        why.append("path guiding")
    if denoise_needed(scene):
        why.append("denoising")
    tree = compositor_tree(scene)
    if scene.render.use_compositing and tree is not None:
        kinds = sorted({n.bl_idname for n in tree.nodes
                        if not n.mute and n.bl_idname not in PER_PIXEL_NODES})
        if kinds:
            why.append("compositing (%s)" % ", ".join(kinds))
    return why


def report(scene=None):
    scene = scene or bpy.context.scene
    return {
        "version": 1,
        "saved_with": "%d.%d" % tuple(bpy.data.version[:2]),
        "engine": scene.render.engine,
        "denoise": denoise_needed(scene),
        "neighbours": neighbours(scene),
        # Which denoiser Cycles runs: OPENIMAGEDENOISE or OPTIX (a compositor
        # Denoise node always runs OpenImageDenoise).
        "denoiser": getattr(getattr(scene, "cycles", None), "denoiser", None),
        "scene": os.path.abspath(bpy.data.filepath),
        "files": [r.to_json() for r in collect(scene)],
        # What a submit needs besides the files, so one Blender start answers
        # both: the frame range, the output size (percentage applied) and format.
        "facts": {
            "frame_start": scene.frame_start,
            "frame_end": scene.frame_end,
            "frame_step": scene.frame_step,
            "width": scene.render.resolution_x * scene.render.resolution_percentage // 100,
            "height": scene.render.resolution_y * scene.render.resolution_percentage // 100,
            "file_format": scene.render.image_settings.file_format,
            # Frames per second, for preview videos: fps / fps_base (29.97 is 30 / 1.001).
            "fps": scene.render.fps / scene.render.fps_base,
        },
    }


# ---------------------------------------------------------------- command line

def fail(msg, code=2):
    sys.stdout.flush()
    sys.stderr.write("deps.py: error: %s\n" % msg)
    sys.stderr.flush()
    sys.exit(code)


def main():
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    p = argparse.ArgumentParser(prog="deps.py", add_help=False)
    p.add_argument("--out")
    args, unknown = p.parse_known_args(argv)
    if not args.out:
        fail("--out FILE.json is required (blender -b SCENE.blend --python-exit-code 3 "
             "--python deps.py -- --out FILE.json)")
    if unknown:
        fail("unknown arguments: %s" % " ".join(unknown))
    if not bpy.data.filepath:
        fail("no .blend file is loaded: give the scene before --python "
             "(blender -b SCENE.blend --python deps.py -- --out FILE.json)")
    t0 = time.monotonic()
    data = report()
    seconds = time.monotonic() - t0
    out = os.path.abspath(args.out)
    tmp = out + ".tmp%d" % os.getpid()
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, out)  # never leave a half-written file under the real name
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        fail("cannot write %s: %s" % (out, e.strerror or e))
    n_missing = sum(len(f["missing"]) for f in data["files"])
    print("deps.py: %d references, %d files, %d missing, walked in %.3f s -> %s" % (
        len(data["files"]), sum(len(f["members"]) for f in data["files"]), n_missing,
        seconds, out), flush=True)


if __name__ == "__main__":
    main()
