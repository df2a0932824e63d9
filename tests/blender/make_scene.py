"""Build a small Cycles test scene from scratch and save it as a .blend.

Run with Blender (3.4+):
    blender -b --factory-startup --python tests/blender/make_scene.py -- --out PATH.blend [options]

Options (after `--`):
    --kind anim|still|fail-driver|heavy   (default anim)
    --width W --height H                  (default 64x48)
    --percent P                           (resolution percentage, default 100)
    --frames N                            (frame_end, frame_start is 1; default 8)
    --fps F                               (frames per second, e.g. 12 or 29.97: fps and fps_base;
                                           default Blender's 24)
    --samples S                           (default 8)
    --adaptive                            (adaptive sampling on; default off)
    --format PNG|PNG16|PNGA|EXR           (default PNG)
    --threads T                           (threads_mode FIXED with T threads)
    --fail-mode MODE                      (fail-driver only, see FAIL_MODES)
    --heavy-grid N                        (heavy only: grid of N x N quads, default 1000)
    --heavy-tex N                         (heavy only: packed noise texture N x N, default 4096)
    --missing-texture PATH                (any kind: the sphere's base colour comes from an image
                                           texture at PATH, absolute, not packed, meant not to exist)
    --external-texture PATH               (the same, but the path is saved absolute, not //-relative:
                                           a file outside the job that may well exist)
    --file-output DIR                     (any kind: a compositor File Output node writing the image
                                           and the alpha, slots "Image" and "aov/alpha_", to DIR)
    --tile-size N                         (Cycles' tile size, auto tiling on: a frame larger than
                                           N x N renders in Cycles tiles; Blender's default is 2048)
    --py-driver                           (any kind: the cube's height is driven by a Python
                                           expression that runs only with auto-run (-y); without it
                                           Blender skips the driver and renders on, exit 0)
    --denoise                             (any kind: denoising on with OpenImageDenoise, as Blender's
                                           default scene has it; needs a Blender built with it)
    --eevee                               (any kind: the EEVEE engine instead of Cycles, with
                                           --samples TAA samples)
    --texture PATH                        (any kind: a checker image written to PATH, which may be
                                           in a folder whose name has spaces, used by the sphere's
                                           material and saved //-relative)

Also runs in the `bpy` module (through blender/bpy_run.py): the scene is then
saved by that Blender (4.5's header reads BLENDER-v405).

Every scene: Cycles on the CPU, denoising off everywhere, dither 0, a camera,
a sun light, a world colour and a few objects with Principled BSDF materials.
"""

import argparse
import math
import os
import random
import struct
import sys
import tempfile
import zlib

import bpy

FAIL_MODES = ("nocamera", "driver", "driver-py", "denoise", "fileout", "handler")
DEFAULT_FAIL_MODE = "nocamera"


def parse_args():
    argv = sys.argv
    argv = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(prog="make_scene.py")
    p.add_argument("--out", required=True)
    p.add_argument("--kind", default="anim", choices=["anim", "still", "fail-driver", "heavy"])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--height", type=int, default=48)
    p.add_argument("--percent", type=int, default=100)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--fps", type=float, default=None)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--adaptive", action="store_true")
    p.add_argument("--format", default="PNG", choices=["PNG", "PNG16", "PNGA", "EXR"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--fail-mode", default=DEFAULT_FAIL_MODE, choices=FAIL_MODES)
    p.add_argument("--heavy-grid", type=int, default=1000)
    p.add_argument("--heavy-tex", type=int, default=4096)
    p.add_argument("--missing-texture", default=None, metavar="PATH")
    p.add_argument("--external-texture", default=None, metavar="PATH")
    p.add_argument("--file-output", default=None, metavar="DIR")
    p.add_argument("--denoise", action="store_true")
    p.add_argument("--eevee", action="store_true")
    p.add_argument("--texture", default=None, metavar="PATH")
    p.add_argument("--tile-size", type=int, default=None)
    p.add_argument("--py-driver", action="store_true")
    return p.parse_args(argv)


def clear_scene():
    for ob in list(bpy.data.objects):
        bpy.data.objects.remove(ob, do_unlink=True)
    for coll in (bpy.data.meshes, bpy.data.materials, bpy.data.cameras,
                 bpy.data.lights, bpy.data.images, bpy.data.textures):
        for block in list(coll):
            coll.remove(block)


def make_material(name, color, roughness=0.4, metallic=0.0):
    mat = bpy.data.materials.new(name)
    mat.use_nodes = True
    bsdf = mat.node_tree.nodes.get("Principled BSDF")
    bsdf.inputs["Base Color"].default_value = (*color, 1.0)
    bsdf.inputs["Roughness"].default_value = roughness
    bsdf.inputs["Metallic"].default_value = metallic
    return mat


def assign(ob, mat):
    ob.data.materials.clear()
    ob.data.materials.append(mat)


def setup_render(scene, args):
    r = scene.render
    scene.render.engine = "CYCLES"
    scene.cycles.device = "CPU"
    scene.cycles.samples = args.samples
    scene.cycles.preview_samples = args.samples
    scene.cycles.use_adaptive_sampling = bool(args.adaptive)
    scene.cycles.use_denoising = False
    scene.cycles.use_preview_denoising = False
    scene.cycles.seed = 0
    scene.cycles.use_animated_seed = False
    for vl in scene.view_layers:
        if hasattr(vl, "cycles"):
            if hasattr(vl.cycles, "use_denoising"):
                vl.cycles.use_denoising = False
            if hasattr(vl.cycles, "denoising_store_passes"):
                vl.cycles.denoising_store_passes = False
    r.dither_intensity = 0.0
    r.resolution_x = args.width
    r.resolution_y = args.height
    r.resolution_percentage = args.percent
    r.pixel_aspect_x = 1.0
    r.pixel_aspect_y = 1.0
    r.use_border = False
    r.use_crop_to_border = False
    r.use_persistent_data = False
    scene.frame_start = 1
    scene.frame_end = args.frames
    if args.fps is not None:
        # Blender keeps an integer rate and a divisor: 29.97 is 30 / 1.001.
        scene.render.fps = max(1, round(args.fps))
        scene.render.fps_base = scene.render.fps / args.fps
    scene.frame_current = 1
    if args.tile_size:
        scene.cycles.use_auto_tile = True
        scene.cycles.tile_size = args.tile_size
    if args.threads:
        r.threads_mode = "FIXED"
        r.threads = args.threads
    else:
        r.threads_mode = "AUTO"

    img = r.image_settings
    r.film_transparent = False
    if args.format == "PNG":
        img.file_format = "PNG"
        img.color_mode = "RGB"
        img.color_depth = "8"
        img.compression = 15
    elif args.format == "PNG16":
        img.file_format = "PNG"
        img.color_mode = "RGB"
        img.color_depth = "16"
        img.compression = 15
    elif args.format == "PNGA":
        img.file_format = "PNG"
        img.color_mode = "RGBA"
        img.color_depth = "8"
        img.compression = 15
        r.film_transparent = True
    elif args.format == "EXR":
        img.file_format = "OPEN_EXR"
        img.color_mode = "RGBA"
        img.color_depth = "32"
        img.exr_codec = "ZIP"
    # Standard view transform keeps values simple and predictable.
    scene.view_settings.view_transform = "Standard"
    scene.view_settings.look = "None"
    r.filepath = "//render/frame_####"


def setup_world(scene):
    world = bpy.data.worlds.get("World") or bpy.data.worlds.new("World")
    scene.world = world
    world.use_nodes = True
    bg = world.node_tree.nodes.get("Background")
    bg.inputs["Color"].default_value = (0.05, 0.08, 0.15, 1.0)
    bg.inputs["Strength"].default_value = 1.0


def add_camera(scene):
    cam_data = bpy.data.cameras.new("Camera")
    cam = bpy.data.objects.new("Camera", cam_data)
    scene.collection.objects.link(cam)
    cam.location = (7.0, -7.0, 5.0)
    cam.rotation_euler = (math.radians(63), 0.0, math.radians(45))
    cam_data.lens = 35
    scene.camera = cam
    return cam


def add_sun(scene):
    light = bpy.data.lights.new("Sun", type="SUN")
    light.energy = 3.0
    light.angle = math.radians(5)
    ob = bpy.data.objects.new("Sun", light)
    scene.collection.objects.link(ob)
    ob.rotation_euler = (math.radians(40), math.radians(10), math.radians(30))
    return ob


def add_objects(scene):
    # Ground plane
    bpy.ops.mesh.primitive_plane_add(size=12, location=(0, 0, 0))
    ground = bpy.context.active_object
    ground.name = "Ground"
    assign(ground, make_material("GroundMat", (0.6, 0.6, 0.55), roughness=0.8))

    bpy.ops.mesh.primitive_cube_add(size=1.5, location=(-1.2, 0.5, 0.75))
    cube = bpy.context.active_object
    cube.name = "Cube"
    assign(cube, make_material("RedMat", (0.8, 0.1, 0.08)))

    bpy.ops.mesh.primitive_uv_sphere_add(radius=0.9, location=(1.4, -0.6, 0.9),
                                         segments=32, ring_count=16)
    sphere = bpy.context.active_object
    sphere.name = "Sphere"
    bpy.ops.object.shade_smooth()
    assign(sphere, make_material("BlueMat", (0.1, 0.25, 0.85), roughness=0.2, metallic=0.3))

    bpy.ops.mesh.primitive_cylinder_add(radius=0.5, depth=2.0, location=(0.3, 2.0, 1.0))
    cyl = bpy.context.active_object
    cyl.name = "Cylinder"
    assign(cyl, make_material("GreenMat", (0.1, 0.7, 0.15)))

    bpy.ops.mesh.primitive_torus_add(location=(-0.5, -2.0, 0.4), major_radius=0.8,
                                     minor_radius=0.25)
    torus = bpy.context.active_object
    torus.name = "Torus"
    assign(torus, make_material("YellowMat", (0.9, 0.75, 0.1), roughness=0.3))
    return {"ground": ground, "cube": cube, "sphere": sphere, "cyl": cyl, "torus": torus}


def animate(scene, objs, frames):
    """Keyframe the cube (move + rotate) and the torus (rotate) so every frame differs."""
    cube = objs["cube"]
    torus = objs["torus"]
    last = max(frames, 2)
    cube.location = (-2.0, 0.5, 0.75)
    cube.rotation_euler = (0.0, 0.0, 0.0)
    cube.keyframe_insert("location", frame=1)
    cube.keyframe_insert("rotation_euler", frame=1)
    torus.rotation_euler = (0.0, 0.0, 0.0)
    torus.keyframe_insert("rotation_euler", frame=1)
    cube.location = (0.5, 1.0, 1.5)
    cube.rotation_euler = (0.0, 0.0, math.radians(90 * last))
    cube.keyframe_insert("location", frame=last)
    cube.keyframe_insert("rotation_euler", frame=last)
    torus.rotation_euler = (math.radians(30 * last), 0.0, math.radians(45 * last))
    torus.keyframe_insert("rotation_euler", frame=last)
    for ob in (cube, torus):
        for fc in ob.animation_data.action.fcurves:
            for kp in fc.keyframe_points:
                kp.interpolation = "LINEAR"
    scene.frame_set(1)


# ---------------------------------------------------------------- heavy

def write_noise_png(path, size):
    """Write an incompressible size x size RGB 8-bit PNG (random noise) with zlib/struct."""
    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))
    rng = random.Random(1234)
    row_len = size * 3
    comp = zlib.compressobj(1)
    parts = []
    for _ in range(size):
        parts.append(comp.compress(b"\x00" + rng.randbytes(row_len)))
    parts.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", ihdr))
        f.write(chunk(b"IDAT", b"".join(parts)))
        f.write(chunk(b"IEND", b""))


def add_heavy(scene, grid, tex_size):
    # ~grid*grid quads in one mesh, displaced with a few sine waves.
    bpy.ops.mesh.primitive_grid_add(x_subdivisions=grid, y_subdivisions=grid, size=6,
                                    location=(0, 0, 1.5))
    ob = bpy.context.active_object
    ob.name = "HeavyGrid"
    me = ob.data
    co = [0.0] * (len(me.vertices) * 3)
    me.vertices.foreach_get("co", co)
    for i in range(0, len(co), 3):
        x, y = co[i], co[i + 1]
        co[i + 2] = 0.15 * math.sin(3.0 * x) * math.cos(2.5 * y) + 0.05 * math.sin(11.0 * (x + y))
    me.vertices.foreach_set("co", co)
    me.update()
    ob.rotation_euler = (math.radians(20), 0.0, 0.0)

    # Packed noise texture.
    tmpdir = tempfile.mkdtemp(prefix="tessera_heavy_")
    png = os.path.join(tmpdir, "noise_%d.png" % tex_size)
    write_noise_png(png, tex_size)
    img = bpy.data.images.load(png)
    img.name = "Noise%d" % tex_size
    img.pack()
    img.filepath = "//noise_%d.png" % tex_size  # the packed copy is used; the path is cosmetic
    os.remove(png)
    os.rmdir(tmpdir)

    mat = bpy.data.materials.new("HeavyMat")
    mat.use_nodes = True
    nt = mat.node_tree
    bsdf = nt.nodes.get("Principled BSDF")
    tex = nt.nodes.new("ShaderNodeTexImage")
    tex.image = img
    coord = nt.nodes.new("ShaderNodeTexCoord")
    nt.links.new(coord.outputs["UV"], tex.inputs["Vector"])
    nt.links.new(tex.outputs["Color"], bsdf.inputs["Base Color"])
    assign(ob, mat)
    return ob


# ---------------------------------------------------------------- missing texture

def add_missing_texture(objs, path):
    """Give the sphere an image texture whose file (absolute, not packed) is expected not to
    exist: Blender then renders it magenta without any error."""
    path = os.path.abspath(path)
    # images.load() refuses a missing file, so make an image datablock and point it at the path.
    img = bpy.data.images.new("MissingTex", 4, 4)
    img.source = "FILE"
    img.filepath = path
    sphere = objs["sphere"]
    mat = sphere.data.materials[0]
    nt = mat.node_tree
    tex = nt.nodes.new("ShaderNodeTexImage")
    tex.image = img
    nt.links.new(tex.outputs["Color"], nt.nodes.get("Principled BSDF").inputs["Base Color"])
    return img


# ---------------------------------------------------------------- file output

def add_file_output(scene, base):
    """A compositor File Output node writing the render and its alpha to `base`
    (made absolute), as an artist's scene might: Blender writes
    base/Image0001.png and base/aov/alpha_0001.png next to the frame."""
    scene.use_nodes = True
    scene.render.use_compositing = True
    nt = scene.node_tree
    rl = nt.nodes.get("Render Layers") or nt.nodes.new("CompositorNodeRLayers")
    comp = nt.nodes.get("Composite") or nt.nodes.new("CompositorNodeComposite")
    if not comp.inputs["Image"].is_linked:
        nt.links.new(rl.outputs["Image"], comp.inputs["Image"])
    fo = nt.nodes.new("CompositorNodeOutputFile")
    fo.name = "File Output"
    fo.base_path = os.path.abspath(base) + os.sep
    fo.format.file_format = "PNG"
    fo.format.color_mode = "RGBA"
    fo.file_slots.new("aov/alpha_")
    nt.links.new(rl.outputs["Image"], fo.inputs[0])
    nt.links.new(rl.outputs["Alpha"], fo.inputs[1])
    return fo


# ---------------------------------------------------------------- Python drivers

PY_DRIVER = "bpy.context.scene.frame_current * 0.5 + 0.75"


def add_py_driver(objs):
    """A driver that needs auto-run Python (it names `bpy`, outside Blender's
    restricted namespace) but works with it: with -y the cube rises to 1.25 at
    frame 1; without -y Blender prints `Error in PyDriver` and keeps 0.75."""
    cube = objs["cube"]
    fc = cube.driver_add("location", 2)
    drv = fc.driver
    drv.type = "SCRIPTED"
    drv.expression = PY_DRIVER
    drv.use_self = False
    # The value this file keeps, whether or not this Blender ran the driver.
    cube.location.z = 0.75


# ---------------------------------------------------------------- failing scenes

def add_failure(scene, mode, objs):
    if mode == "nocamera":
        # Rendering a scene with no camera fails before any sampling.
        cam = scene.camera
        scene.camera = None
        bpy.data.objects.remove(cam, do_unlink=True)
    elif mode == "driver":
        # A driver whose Python expression raises. Only evaluated with -y (auto-exec).
        cube = objs["cube"]
        fc = cube.driver_add("location", 2)
        drv = fc.driver
        drv.type = "SCRIPTED"
        drv.expression = "1/0 + frame"
        drv.use_self = False
    elif mode == "driver-py":
        # A driver expression too complex for the simple-expression evaluator, so it
        # needs Python: skipped without -y, raises with -y.
        cube = objs["cube"]
        fc = cube.driver_add("location", 2)
        drv = fc.driver
        drv.type = "SCRIPTED"
        drv.expression = "int('tessera') + frame"
        drv.use_self = False
    elif mode == "denoise":
        # Denoising on, but this Blender build has no OpenImageDenoise.
        use_denoising(scene)
    elif mode == "fileout":
        # Compositor File Output node into an unwritable location.
        scene.use_nodes = True
        scene.render.use_compositing = True
        nt = scene.node_tree
        rl = nt.nodes.get("Render Layers") or nt.nodes.new("CompositorNodeRLayers")
        fo = nt.nodes.new("CompositorNodeOutputFile")
        fo.base_path = "/proc/tessera_unwritable/out_"
        nt.links.new(rl.outputs["Image"], fo.inputs[0])
    elif mode == "handler":
        # A registered text block raising in render_pre (only runs with -y).
        txt = bpy.data.texts.new("fail_handler.py")
        txt.use_module = True
        txt.write(
            "import bpy\n"
            "def _tessera_fail(scene, *args):\n"
            "    raise RuntimeError('tessera: render_pre handler failure')\n"
            "bpy.app.handlers.render_pre.append(_tessera_fail)\n"
        )


def use_denoising(scene):
    """Denoising on with OpenImageDenoise, on the scene and every view layer."""
    scene.cycles.use_denoising = True
    try:
        scene.cycles.denoiser = "OPENIMAGEDENOISE"
    except TypeError:
        pass  # the enum is empty when Blender was built without any denoiser
    for vl in scene.view_layers:
        vl.cycles.use_denoising = True


def use_eevee(scene, samples):
    """The EEVEE engine: BLENDER_EEVEE_NEXT in 4.2-4.x, BLENDER_EEVEE before and in 5.0."""
    engines = [e.identifier for e in
               bpy.types.RenderSettings.bl_rna.properties["engine"].enum_items]
    scene.render.engine = ("BLENDER_EEVEE_NEXT" if "BLENDER_EEVEE_NEXT" in engines
                           else "BLENDER_EEVEE")
    scene.eevee.taa_render_samples = samples


def add_texture(objs, path):
    """A 16x16 checker written to `path`, used as the sphere's base colour."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img = bpy.data.images.new("Checker", 16, 16)
    px = []
    for y in range(16):
        for x in range(16):
            on = (x // 4 + y // 4) % 2
            px.extend((0.9, 0.2, 0.1, 1.0) if on else (0.1, 0.3, 0.9, 1.0))
    img.pixels = px
    img.filepath_raw = path
    img.file_format = "PNG"
    img.save()
    sphere = objs["sphere"]
    nt = sphere.data.materials[0].node_tree
    tex = nt.nodes.new("ShaderNodeTexImage")
    tex.image = img
    nt.links.new(tex.outputs["Color"], nt.nodes.get("Principled BSDF").inputs["Base Color"])


def main():
    args = parse_args()
    clear_scene()
    scene = bpy.context.scene
    setup_render(scene, args)
    setup_world(scene)
    add_camera(scene)
    add_sun(scene)
    objs = add_objects(scene)
    if args.kind == "anim":
        animate(scene, objs, args.frames)
    elif args.kind == "heavy":
        add_heavy(scene, args.heavy_grid, args.heavy_tex)
    elif args.kind == "fail-driver":
        add_failure(scene, args.fail_mode, objs)
    if args.missing_texture or args.external_texture:
        add_missing_texture(objs, args.missing_texture or args.external_texture)
    if args.file_output:
        add_file_output(scene, args.file_output)
    if args.denoise:
        use_denoising(scene)
    if args.eevee:
        use_eevee(scene, args.samples)
    if args.texture:
        add_texture(objs, args.texture)
    if args.py_driver:
        add_py_driver(objs)
    scene.frame_set(1)
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # Paths are saved //-relative, except an --external-texture's, kept absolute.
    bpy.ops.wm.save_as_mainfile(filepath=out, compress=False,
                                relative_remap=not args.external_texture)
    print("make_scene: wrote %s (kind=%s%s)" % (
        out, args.kind, (", fail-mode=" + args.fail_mode) if args.kind == "fail-driver" else ""))


if __name__ == "__main__":
    main()
