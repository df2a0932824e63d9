"""Build tiny test scenes that depend on external files (for job file sets).

Run with Blender (3.4+):

    blender -b --factory-startup --python-exit-code 2 --python blender/make_asset_scenes.py -- \
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
import os
import sys

import bpy

CASES = ("subfolder", "absolute", "library", "linked-absolute", "sequence", "udim",
         "missing", "many")
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
    mscene = new_scene_file(mats_path)
    stone = write_png(os.path.join(out, "textures", "stone.png"), 8, 6,
                      checker((0.7, 0.7, 0.2), (0.2, 0.2, 0.7), n=2))
    img = load_image(stone, "Stone", os.path.abspath(stone))
    mat = emission_material("Stone", img)
    mat.use_fake_user = True  # keep it in the file without an object using it
    del mscene
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


BUILDERS = {
    "subfolder": case_subfolder,
    "absolute": case_absolute,
    "library": case_library,
    "linked-absolute": case_linked_absolute,
    "sequence": case_sequence,
    "udim": case_udim,
    "missing": case_missing,
    "many": case_many,
}


def main():
    args = parse_args()
    out = os.path.abspath(args.dir)
    os.makedirs(out, exist_ok=True)
    scene_path = BUILDERS[args.case](out)
    print("make_asset_scenes: case=%s scene=%s" % (args.case, scene_path), flush=True)


if __name__ == "__main__":
    main()
