"""Build tiny test scenes that depend on external files (for job file sets).

Run with Blender (3.4+):

    blender -b --factory-startup --python-exit-code 2 --python tests/blender/make_asset_scenes.py -- \
        --dir OUT --case CASE

OUT should be a fresh folder per case: the script writes the scene and every
file it uses under OUT (nothing outside it), and prints, as its last line,

    make_asset_scenes: case=CASE scene=/abs/path/of/scene.blend

Cases (paths relative to OUT; "rel" = stored `//`-relative, "abs" = stored absolute):

| case              | scene                  | external files                                                    |
|-------------------|------------------------|-------------------------------------------------------------------|
| subfolder         | scene.blend            | tex/checker.png (rel `//tex/checker.png`)                         |
| absolute          | project/scene.blend    | elsewhere/wood.png (abs), outside the scene's folder              |
| library           | shots/shot.blend       | lib/prop.blend (rel `//../lib/prop.blend`), which uses            |
|                   |                        | lib/tex/bark.png (rel to the library: `//tex/bark.png`)           |
| linked-absolute   | shots/shot.blend       | lib/crate.blend (abs), which links a material from                |
|                   |                        | assets/materials.blend (abs, an indirect library), which uses     |
|                   |                        | textures/stone.png (abs): absolute paths inside linked data       |
| sequence          | scene.blend            | seq/frame_0001.png .. frame_0003.png, an image sequence, frames 1-3 |
| udim              | scene.blend            | udim/tile.1001.png, udim/tile.1002.png (`//udim/tile.<UDIM>.png`) |
| missing           | scene.blend            | tex/not_there.png (rel), deliberately absent: renders magenta     |
| many              | scene.blend            | many/f_0001.png .. f_2000.png: ONE image datablock, a 2,000-frame |
|                   |                        | sequence; frame N of the scene shows file N                       |
| kinds             | scene.blend            | fonts/DejaVuSerif-Bold.ttf (abs, a text object), caches/mover.pc2  |
|                   |                        | (abs, Mesh Cache modifier), a cloth with a disk cache              |
|                   |                        | (blendcache_scene/, implied relative), a cloth with an external   |
|                   |                        | cache (caches/cloth_b/, abs), a smoke domain baked to             |
|                   |                        | fluid_cache/ (abs), a volume sequence vdb/smoke_000N.vdb (rel);   |
|                   |                        | not rendered: audio/beep.wav (abs sound), clip/c_000N.png (movie  |
|                   |                        | clip sequence), strips/s_000N.png (VSE image strip, scene "Edit") |
| linked-kinds      | shots/shot.blend       | links the six rendered objects of a `kinds` scene built in lib/   |
|                   |                        | (rel `//../lib/scene.blend`): all of the above as linked data     |
| nested            | shots/shot.blend       | lib/deep/prop.blend (rel `//../lib/deep/prop.blend`) links a      |
|                   |                        | material from assets/mats.blend (rel to the library:              |
|                   |                        | `//../../assets/mats.blend`), which uses assets/tex/rock.png      |
|                   |                        | (`//tex/rock.png`): relative paths at different depths            |

Why `many` is one sequence: 2,000 image datablocks make loading and syncing
slow, but a file set of 2,000 small files is what the speed check needs; a
sequence gives exactly that (deps.py lists all 2,000 as members) while the
render stays as small as any other case and still depends on its files.

Every scene: 64x48, 4 samples, Cycles on the CPU, denoising off (scene and view
layers), adaptive sampling off, dither 0, seed 0, Standard view transform,
8-bit RGB PNG output. An orthographic camera looks straight down at planes lit
by nothing: their materials are pure Emission of the image texture (Closest
interpolation), so every pixel is a texel and a missing or different file
changes pixels. All textures are written as PNG by Blender itself, each with
distinct colours.
"""

import argparse
import math
import os
import shutil
import struct
import sys
import wave

import bpy

CASES = ("subfolder", "absolute", "library", "linked-absolute", "sequence", "udim",
         "missing", "many", "kinds", "linked-kinds", "nested")
MANY_FILES = 2000


def parse_args():
    argv = sys.argv
    argv = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(prog="make_asset_scenes.py")
    p.add_argument("--dir", required=True, help="output folder (created)")
    p.add_argument("--case", required=True, choices=CASES)
    return p.parse_args(argv)


# ---------------------------------------------------------------- textures

def write_png(path, width, height, pixel):
    """Save a width x height RGB PNG through Blender's own image writer.

    `pixel(x, y)` gives (r, g, b) in 0..1 (stored as 8-bit). The helper
    datablock is removed again so it never ends up in a saved scene."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img = bpy.data.images.new("__tessera_tmp", width, height)
    px = []
    for y in range(height):
        for x in range(width):
            r, g, b = pixel(x, y)
            px.extend((r, g, b, 1.0))
    img.pixels[:] = px
    img.file_format = "PNG"
    img.filepath_raw = path
    img.save()
    bpy.data.images.remove(img)
    return path


def checker(c1, c2, n=4):
    return lambda x, y: c1 if ((x // n) + (y // n)) % 2 == 0 else c2


def stripes(c1, c2, n=2):
    return lambda x, y: c1 if (x // n) % 2 == 0 else c2


# ---------------------------------------------------------------- scene basics

def reset_file():
    """Start from an empty scene (the factory startup has a cube, light and camera)."""
    for ob in list(bpy.data.objects):
        bpy.data.objects.remove(ob, do_unlink=True)
    for coll in (bpy.data.meshes, bpy.data.materials, bpy.data.cameras, bpy.data.lights,
                 bpy.data.images):
        for block in list(coll):
            coll.remove(block)


def setup_render(scene, frames=1):
    scene.render.engine = "CYCLES"
    c = scene.cycles
    c.device = "CPU"
    c.samples = 4
    c.preview_samples = 4
    c.use_adaptive_sampling = False
    c.use_denoising = False
    c.use_preview_denoising = False
    c.seed = 0
    c.use_animated_seed = False
    for vl in scene.view_layers:
        vl.cycles.use_denoising = False
        vl.cycles.denoising_store_passes = False
    r = scene.render
    r.resolution_x, r.resolution_y, r.resolution_percentage = 64, 48, 100
    r.dither_intensity = 0.0
    r.use_border = False
    r.use_persistent_data = False
    r.film_transparent = False
    r.image_settings.file_format = "PNG"
    r.image_settings.color_mode = "RGB"
    r.image_settings.color_depth = "8"
    r.filepath = "//render/frame_####"
    scene.view_settings.view_transform = "Standard"
    scene.view_settings.look = "None"
    scene.frame_start = 1
    scene.frame_end = frames
    scene.frame_current = 1
    world = bpy.data.worlds.get("World") or bpy.data.worlds.new("World")
    scene.world = world
    world.use_nodes = True
    world.node_tree.nodes["Background"].inputs["Color"].default_value = (0, 0, 0, 1)


def add_camera(scene):
    """Orthographic camera looking straight down, seeing x in [-2, 2], y in [-1.5, 1.5]."""
    data = bpy.data.cameras.new("Camera")
    data.type = "ORTHO"
    data.ortho_scale = 4.0
    cam = bpy.data.objects.new("Camera", data)
    cam.location = (0.0, 0.0, 10.0)
    scene.collection.objects.link(cam)
    scene.camera = cam


def emission_material(name, image, image_user_setup=None):
    """Emission of an image texture: the pixel colour is the texel colour, no lighting."""
    mat = bpy.data.materials.new(name)
    mat.use_nodes = True
    nt = mat.node_tree
    for n in list(nt.nodes):
        nt.nodes.remove(n)
    out = nt.nodes.new("ShaderNodeOutputMaterial")
    em = nt.nodes.new("ShaderNodeEmission")
    tex = nt.nodes.new("ShaderNodeTexImage")
    tex.image = image
    tex.interpolation = "Closest"
    if image_user_setup:
        image_user_setup(tex.image_user)
    em.inputs["Strength"].default_value = 1.0
    nt.links.new(tex.outputs["Color"], em.inputs["Color"])
    nt.links.new(em.outputs["Emission"], out.inputs["Surface"])
    return mat


def add_plane(scene, name, mat, location=(0, 0, 0), size=(4.0, 3.0), u_scale=1.0):
    """A plane of size (sx, sy) with UVs 0..u_scale x 0..1 and the given material."""
    bpy.ops.mesh.primitive_plane_add(size=1.0, location=location)
    ob = bpy.context.active_object
    ob.name = name
    ob.data.name = name
    ob.scale = (size[0], size[1], 1.0)
    if u_scale != 1.0:
        for loop_uv in ob.data.uv_layers.active.data:
            loop_uv.uv = (loop_uv.uv[0] * u_scale, loop_uv.uv[1])
    ob.data.materials.append(mat)
    return ob


def load_image(path, name, stored_path=None):
    """Load a PNG; `stored_path` is the string kept in the .blend (e.g. "//tex/a.png")."""
    img = bpy.data.images.load(path, check_existing=False)
    img.name = name
    if stored_path is not None:
        img.filepath = stored_path
    return img


def save(path):
    """Save uncompressed; the path must be where the file will stay (relative paths
    are computed against it), so every scene is saved once up front and again at the end."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # No .blend1 backups in the test tree (read_factory_settings resets this, so set it here).
    bpy.context.preferences.filepaths.save_version = 0
    bpy.ops.wm.save_as_mainfile(filepath=path, compress=False)


def new_scene_file(path, frames=1):
    """Empty scene saved at `path`, so `//` paths resolve against its folder from now on."""
    bpy.ops.wm.read_factory_settings(use_empty=False)
    reset_file()
    scene = bpy.context.scene
    setup_render(scene, frames)
    add_camera(scene)
    save(path)
    return scene


def rel(path):
    """`//`-relative form of an absolute path, against the current .blend."""
    return bpy.path.relpath(path)


# ---------------------------------------------------------------- cases

def case_subfolder(out):
    scene_path = os.path.join(out, "scene.blend")
    scene = new_scene_file(scene_path)
    tex = write_png(os.path.join(out, "tex", "checker.png"), 16, 12,
                    checker((0.9, 0.2, 0.1), (0.1, 0.3, 0.9)))
    img = load_image(tex, "Checker", rel(tex))
    add_plane(scene, "Plane", emission_material("CheckerMat", img))
    save(scene_path)
    return scene_path


def case_absolute(out):
    scene_path = os.path.join(out, "project", "scene.blend")
    scene = new_scene_file(scene_path)
    tex = write_png(os.path.join(out, "elsewhere", "wood.png"), 16, 12,
                    stripes((0.6, 0.35, 0.1), (0.3, 0.15, 0.05)))
    img = load_image(tex, "Wood", os.path.abspath(tex))  # stored absolute on purpose
    add_plane(scene, "Plane", emission_material("WoodMat", img))
    save(scene_path)
    return scene_path


def case_library(out):
    # The library first: a plane "Prop" whose material uses //tex/bark.png.
    lib_path = os.path.join(out, "lib", "prop.blend")
    lib_scene = new_scene_file(lib_path)
    bark = write_png(os.path.join(out, "lib", "tex", "bark.png"), 8, 8,
                     checker((0.4, 0.25, 0.1), (0.1, 0.6, 0.2), n=2))
    img = load_image(bark, "Bark", rel(bark))
    add_plane(lib_scene, "Prop", emission_material("BarkMat", img),
              location=(1.0, 0.0, 0.0), size=(2.0, 3.0))
    save(lib_path)

    # The shot links the object by a relative path; a local plane fills the other half.
    scene_path = os.path.join(out, "shots", "shot.blend")
    scene = new_scene_file(scene_path)
    link_object(scene, lib_path, "Prop", relative=True)
    grey = write_png(os.path.join(out, "shots", "tex", "grey.png"), 4, 4,
                     checker((0.5, 0.5, 0.5), (0.8, 0.8, 0.8), n=1))
    gimg = load_image(grey, "Grey", rel(grey))
    add_plane(scene, "Floor", emission_material("GreyMat", gimg),
              location=(-1.0, 0.0, 0.0), size=(2.0, 3.0))
    save(scene_path)
    return scene_path


def case_linked_absolute(out):
    # assets/materials.blend: material "Stone" using textures/stone.png by ABSOLUTE path.
    mats_path = os.path.join(out, "assets", "materials.blend")
    new_scene_file(mats_path)
    stone = write_png(os.path.join(out, "textures", "stone.png"), 8, 6,
                      checker((0.7, 0.7, 0.2), (0.2, 0.2, 0.7), n=2))
    img = load_image(stone, "Stone", os.path.abspath(stone))
    mat = emission_material("Stone", img)
    mat.use_fake_user = True  # keep it in the file without an object using it
    save(mats_path)

    # lib/crate.blend: object "Crate" whose material is linked from materials.blend by
    # ABSOLUTE path, so the shot sees materials.blend as an indirect library.
    crate_path = os.path.join(out, "lib", "crate.blend")
    cscene = new_scene_file(crate_path)
    with bpy.data.libraries.load(mats_path, link=True, relative=False) as (src, dst):
        dst.materials = ["Stone"]
    stone_mat = dst.materials[0]
    add_plane(cscene, "Crate", stone_mat, location=(0.0, 0.5, 0.0), size=(4.0, 2.0))
    save(crate_path)

    scene_path = os.path.join(out, "shots", "shot.blend")
    scene = new_scene_file(scene_path)
    link_object(scene, crate_path, "Crate", relative=False)  # absolute: a direct library too
    grey = write_png(os.path.join(out, "shots", "tex", "grey.png"), 4, 4,
                     checker((0.5, 0.5, 0.5), (0.8, 0.8, 0.8), n=1))
    gimg = load_image(grey, "Grey", rel(grey))
    add_plane(scene, "Floor", emission_material("GreyMat", gimg),
              location=(0.0, -1.0, 0.0), size=(4.0, 1.0))
    save(scene_path)
    return scene_path


def link_object(scene, lib_path, name, relative):
    with bpy.data.libraries.load(lib_path, link=True, relative=relative) as (src, dst):
        dst.objects = [name]
    ob = dst.objects[0]
    scene.collection.objects.link(ob)
    return ob


def sequence_user(frames):
    def setup(iu):
        iu.frame_start = 1
        iu.frame_duration = frames
        iu.frame_offset = 0
        iu.use_auto_refresh = True
        iu.use_cyclic = False
    return setup


def case_sequence(out):
    scene_path = os.path.join(out, "scene.blend")
    scene = new_scene_file(scene_path, frames=3)
    colours = [((0.9, 0.1, 0.1), (0.2, 0.2, 0.2)), ((0.1, 0.8, 0.1), (0.9, 0.9, 0.9)),
               ((0.1, 0.2, 0.9), (0.9, 0.8, 0.1))]
    first = None
    for i, (c1, c2) in enumerate(colours):
        p = write_png(os.path.join(out, "seq", "frame_%04d.png" % (i + 1)), 8, 6,
                      checker(c1, c2, n=2))
        first = first or p
    img = load_image(first, "Seq", rel(first))
    img.source = "SEQUENCE"
    add_plane(scene, "Plane", emission_material("SeqMat", img, sequence_user(3)))
    save(scene_path)
    return scene_path


def case_udim(out):
    scene_path = os.path.join(out, "scene.blend")
    scene = new_scene_file(scene_path)
    t1 = write_png(os.path.join(out, "udim", "tile.1001.png"), 8, 8,
                   checker((0.9, 0.5, 0.1), (0.1, 0.1, 0.1), n=2))
    write_png(os.path.join(out, "udim", "tile.1002.png"), 8, 8,
              stripes((0.1, 0.4, 0.9), (0.9, 0.9, 0.9), n=2))
    img = load_image(t1, "Tiles")
    img.source = "TILED"
    img.filepath = "//udim/tile.<UDIM>.png"
    if not any(t.number == 1002 for t in img.tiles):
        img.tiles.new(tile_number=1002)
    # UVs spanning u in 0..2 put the left half on tile 1001 and the right half on 1002.
    add_plane(scene, "Plane", emission_material("UdimMat", img), u_scale=2.0)
    save(scene_path)
    return scene_path


def case_missing(out):
    scene_path = os.path.join(out, "scene.blend")
    scene = new_scene_file(scene_path)
    # images.load() refuses a missing file: make a datablock and point it at the path.
    img = bpy.data.images.new("NotThere", 4, 4)
    img.source = "FILE"
    img.filepath = "//tex/not_there.png"
    add_plane(scene, "Plane", emission_material("MissingMat", img))
    save(scene_path)
    return scene_path


def case_many(out):
    scene_path = os.path.join(out, "scene.blend")
    scene = new_scene_file(scene_path, frames=MANY_FILES)
    # One helper image re-saved 2,000 times: far faster than 2,000 datablocks.
    os.makedirs(os.path.join(out, "many"), exist_ok=True)
    tmp = bpy.data.images.new("__tessera_tmp", 4, 4)
    tmp.file_format = "PNG"
    for i in range(1, MANY_FILES + 1):
        # Every file has its own content (no two hash alike), 4x4 with two colours.
        a = ((i * 37) % 256 / 255.0, (i * 101) % 256 / 255.0, (i * 211) % 256 / 255.0, 1.0)
        b = (1.0 - a[0], 1.0 - a[1], 1.0 - a[2], 1.0)
        tmp.pixels[:] = [c for k in range(16) for c in (a if (k + k // 4) % 2 == 0 else b)]
        tmp.filepath_raw = os.path.join(out, "many", "f_%04d.png" % i)
        tmp.save()
    bpy.data.images.remove(tmp)
    first = os.path.join(out, "many", "f_0001.png")
    img = load_image(first, "Many", rel(first))
    img.source = "SEQUENCE"
    add_plane(scene, "Plane", emission_material("ManyMat", img, sequence_user(MANY_FILES)))
    save(scene_path)
    return scene_path


def case_kinds(out):
    """One of each other kind of external file, most of them visible in frame 3."""
    scene_path = os.path.join(out, "scene.blend")
    scene = new_scene_file(scene_path, frames=3)

    # Font (absolute): a text object; a missing font falls back to Blender's own.
    font_src = "/usr/share/fonts/truetype/dejavu/DejaVuSerif-Bold.ttf"
    font_path = os.path.join(out, "fonts", "DejaVuSerif-Bold.ttf")
    os.makedirs(os.path.dirname(font_path), exist_ok=True)
    shutil.copyfile(font_src, font_path)
    font = bpy.data.fonts.load(font_path)
    curve = bpy.data.curves.new("Label", "FONT")
    curve.body = "Ag"
    curve.font = font
    curve.size = 1.2
    label = bpy.data.objects.new("Label", curve)
    label.location = (-1.9, 0.4, 0.0)
    scene.collection.objects.link(label)
    label.data.materials.append(flat_material("LabelMat", (0.9, 0.9, 0.2)))

    # Cloth with a disk cache (relative: //blendcache_scene/) and a second cloth whose
    # external cache sits in an absolute folder; sideways gravity so the fall shows
    # through the camera looking straight down.
    scene.gravity = (-200.0, 0.0, 0.0)
    add_cloth(scene, "ClothA", (1.2, 0.8, 0.0), (0.9, 0.2, 0.2))
    cloth_b = add_cloth(scene, "ClothB", (1.2, -0.8, 0.0), (0.2, 0.9, 0.2))
    bake_point_caches(scene)
    ext_dir = os.path.join(out, "caches", "cloth_b")
    os.makedirs(ext_dir, exist_ok=True)
    pc_b = cloth_b.modifiers["Cloth"].point_cache
    prefix = "".join("%02X" % b for b in cloth_b.name.encode())
    blendcache = os.path.join(out, "blendcache_scene")
    for name in sorted(os.listdir(blendcache)):
        if name.startswith(prefix + "_"):
            shutil.move(os.path.join(blendcache, name), os.path.join(ext_dir, name))
    pc_b.use_external = True
    pc_b.name = prefix
    pc_b.filepath = ext_dir  # absolute on purpose

    # Mesh cache (absolute): a PC2 file moving a small quad over frames 1-3.
    pc2 = os.path.join(out, "caches", "mover.pc2")
    add_mover(scene, pc2, (0.0, -1.1, 0.0), (0.2, 0.5, 0.95))

    # Smoke: a tiny fluid domain baked into an absolute cache folder, and a volume
    # object reading copies of its VDB files as a relative sequence.
    vdb_dir = os.path.join(out, "fluid_cache")
    bake_smoke(scene, vdb_dir)
    vdb_seq = os.path.join(out, "vdb")
    os.makedirs(vdb_seq, exist_ok=True)
    for f in range(1, 4):
        shutil.copyfile(os.path.join(vdb_dir, "data", "fluid_data_%04d.vdb" % f),
                        os.path.join(vdb_seq, "smoke_%04d.vdb" % f))
    vol = bpy.data.volumes.new("Smoke")
    vol.filepath = "//vdb/smoke_0001.vdb"
    vol.is_sequence = True
    vol.frame_start = 1
    vol.frame_duration = 3
    vol_ob = bpy.data.objects.new("SmokeCopy", vol)
    vol_ob.location = (0.9, -0.9, 0.0)
    scene.collection.objects.link(vol_ob)
    vol.materials.append(volume_material("SmokeCopyMat", (0.3, 0.9, 1.0)))

    # Listed, not rendered: a sound, a movie clip (an image sequence) and, in a second
    # scene that is never rendered, a VSE image strip of two files.
    wav = write_wav(os.path.join(out, "audio", "beep.wav"))
    snd = bpy.data.sounds.load(wav)
    snd.use_fake_user = True
    clip_files = [write_png(os.path.join(out, "clip", "c_%04d.png" % i), 4, 4,
                            checker((i / 3.0, 0.2, 0.4), (0.1, 0.1, 0.1), n=1)) for i in (1, 2)]
    clip = bpy.data.movieclips.load(clip_files[0])
    clip.filepath = rel(clip_files[0])
    clip.use_fake_user = True
    strips = [write_png(os.path.join(out, "strips", "s_%04d.png" % i), 4, 4,
                        checker((0.2, i / 3.0, 0.4), (0.1, 0.1, 0.1), n=1)) for i in (1, 2)]
    edit = bpy.data.scenes.new("Edit")
    seq = edit.sequence_editor_create()
    strip = seq.sequences.new_image("Stills", rel(strips[0]), channel=1, frame_start=1)
    strip.elements.append(os.path.basename(strips[1]))

    scene.frame_set(1)
    save(scene_path)
    return scene_path


def case_nested(out):
    """Relative paths three files deep, at different folder depths: an indirect library's
    path is relative to the library linking it, not to the scene."""
    mats_path = os.path.join(out, "assets", "mats.blend")
    new_scene_file(mats_path)
    rock = write_png(os.path.join(out, "assets", "tex", "rock.png"), 8, 6,
                     checker((0.8, 0.3, 0.6), (0.2, 0.7, 0.7), n=2))
    mat = emission_material("Rock", load_image(rock, "Rock", rel(rock)))
    mat.use_fake_user = True
    save(mats_path)

    prop_path = os.path.join(out, "lib", "deep", "prop.blend")
    pscene = new_scene_file(prop_path)
    with bpy.data.libraries.load(mats_path, link=True, relative=True) as (src, dst):
        dst.materials = ["Rock"]
    add_plane(pscene, "Prop", dst.materials[0], location=(0.0, 0.5, 0.0), size=(4.0, 2.0))
    save(prop_path)

    scene_path = os.path.join(out, "shots", "shot.blend")
    scene = new_scene_file(scene_path)
    link_object(scene, prop_path, "Prop", relative=True)
    save(scene_path)
    return scene_path


def case_linked_kinds(out):
    """The `kinds` scene as a library (lib/scene.blend), its objects linked into a shot:
    absolute paths and disk caches inside linked data."""
    lib_path = case_kinds(os.path.join(out, "lib"))
    scene_path = os.path.join(out, "shots", "shot.blend")
    scene = new_scene_file(scene_path, frames=3)
    scene.gravity = (-200.0, 0.0, 0.0)  # the cloth caches were baked with it
    names = ["Label", "ClothA", "ClothB", "Mover", "SmokeDomain", "SmokeCopy"]
    with bpy.data.libraries.load(lib_path, link=True, relative=True) as (src, dst):
        dst.objects = names
    for ob in dst.objects:
        scene.collection.objects.link(ob)
    save(scene_path)
    return scene_path


def flat_material(name, colour):
    mat = bpy.data.materials.new(name)
    mat.use_nodes = True
    nt = mat.node_tree
    for n in list(nt.nodes):
        nt.nodes.remove(n)
    out = nt.nodes.new("ShaderNodeOutputMaterial")
    em = nt.nodes.new("ShaderNodeEmission")
    em.inputs["Color"].default_value = (*colour, 1.0)
    nt.links.new(em.outputs["Emission"], out.inputs["Surface"])
    return mat


def volume_material(name, colour):
    """Volume emission proportional to the "density" grid: visible on the black
    background exactly where there is smoke."""
    mat = bpy.data.materials.new(name)
    mat.use_nodes = True
    nt = mat.node_tree
    for n in list(nt.nodes):
        nt.nodes.remove(n)
    out = nt.nodes.new("ShaderNodeOutputMaterial")
    attr = nt.nodes.new("ShaderNodeAttribute")
    attr.attribute_name = "density"
    mul = nt.nodes.new("ShaderNodeMath")
    mul.operation = "MULTIPLY"
    mul.inputs[1].default_value = 40.0
    em = nt.nodes.new("ShaderNodeEmission")
    em.inputs["Color"].default_value = (*colour, 1.0)
    nt.links.new(attr.outputs["Fac"], mul.inputs[0])
    nt.links.new(mul.outputs["Value"], em.inputs["Strength"])
    nt.links.new(em.outputs["Emission"], out.inputs["Volume"])
    return mat


def add_cloth(scene, name, location, colour):
    bpy.ops.mesh.primitive_grid_add(x_subdivisions=4, y_subdivisions=4, size=0.6,
                                    location=location)
    ob = bpy.context.active_object
    ob.name = name
    ob.data.materials.append(flat_material(name + "Mat", colour))
    md = ob.modifiers.new("Cloth", "CLOTH")
    md.settings.quality = 2
    pc = md.point_cache
    pc.frame_start, pc.frame_end = 1, 3
    pc.use_disk_cache = True
    return ob


def bake_point_caches(scene):
    with bpy.context.temp_override(scene=scene):
        bpy.ops.ptcache.bake_all(bake=True)


def add_mover(scene, pc2_path, location, colour):
    """A quad deformed by a PC2 point cache written here (header + float32 xyz)."""
    bpy.ops.mesh.primitive_plane_add(size=0.5, location=location)
    ob = bpy.context.active_object
    ob.name = "Mover"
    ob.data.materials.append(flat_material("MoverMat", colour))
    verts = [v.co.copy() for v in ob.data.vertices]
    os.makedirs(os.path.dirname(pc2_path), exist_ok=True)
    with open(pc2_path, "wb") as f:
        f.write(struct.pack("<12siiffi", b"POINTCACHE2\0", 1, len(verts), 1.0, 1.0, 3))
        for frame in range(3):
            for co in verts:
                f.write(struct.pack("<fff", co.x + 0.4 * frame, co.y, co.z))
    md = ob.modifiers.new("MeshCache", "MESH_CACHE")
    md.cache_format = "PC2"
    md.filepath = pc2_path  # absolute on purpose
    md.frame_start = 1.0
    return ob


def bake_smoke(scene, cache_dir):
    bpy.ops.mesh.primitive_cube_add(size=1.2, location=(-0.9, -0.9, 0.0))
    domain = bpy.context.active_object
    domain.name = "SmokeDomain"
    bpy.ops.mesh.primitive_ico_sphere_add(radius=0.2, location=(-0.9, -0.9, -0.3))
    emitter = bpy.context.active_object
    emitter.name = "SmokeEmitter"
    emitter.hide_render = True
    em = emitter.modifiers.new("Fluid", "FLUID")
    em.fluid_type = "FLOW"
    em.flow_settings.flow_type = "SMOKE"
    em.flow_settings.flow_behavior = "INFLOW"
    dm = domain.modifiers.new("Fluid", "FLUID")
    dm.fluid_type = "DOMAIN"
    ds = dm.domain_settings
    ds.domain_type = "GAS"
    ds.resolution_max = 12
    ds.cache_type = "ALL"
    ds.cache_data_format = "OPENVDB"
    ds.cache_frame_start, ds.cache_frame_end = 1, 3
    ds.cache_directory = cache_dir  # absolute on purpose
    domain.data.materials.append(volume_material("SmokeMat", (1.0, 0.5, 0.1)))
    with bpy.context.temp_override(scene=scene, object=domain, active_object=domain):
        bpy.ops.fluid.bake_all()
    return domain


def write_wav(path):
    """A 0.1 s 440 Hz mono tone, 16-bit (stdlib wave)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rate = 8000
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
                               for i in range(rate // 10)))
    return path


BUILDERS = {
    "subfolder": case_subfolder,
    "absolute": case_absolute,
    "library": case_library,
    "linked-absolute": case_linked_absolute,
    "sequence": case_sequence,
    "udim": case_udim,
    "missing": case_missing,
    "many": case_many,
    "kinds": case_kinds,
    "linked-kinds": case_linked_kinds,
    "nested": case_nested,
}


def main():
    args = parse_args()
    out = os.path.abspath(args.dir)
    os.makedirs(out, exist_ok=True)
    scene_path = BUILDERS[args.case](out)
    print("make_asset_scenes: case=%s scene=%s" % (args.case, scene_path), flush=True)


if __name__ == "__main__":
    main()
