"""The add-on's preferences (with their layout, and the coordinator API and
hasher they name) and the scene's job settings (`scene.tessera`).

The token is kept in a file of its own, `tessera.token` in Blender's user
config folder, readable only by its owner: never in the .blend, and not in
`userpref.blend`, which Blender writes readable by everyone."""

import os
import sys

import bpy
from bpy.props import (EnumProperty, FloatProperty, IntProperty, PointerProperty,
                       StringProperty)

from . import digests
from .api import Api, FarmError

PACKAGE = __package__


def prefs(context=None):
    """The add-on's preferences."""
    context = context or bpy.context
    return context.preferences.addons[PACKAGE].preferences


def connect(context):
    """The API of the coordinator the preferences name (FarmError if unset)."""
    p = prefs(context)
    # Blender before 4.2 has no such setting: online.
    return Api(p.url, p.token, p.ca_file, online=getattr(bpy.app, "online_access", True))


def api_or_none(context):
    try:
        return connect(context)
    except FarmError:
        return None


def tessera_binary(context):
    """The `tessera` binary that hashes files, or None for pure Python."""
    p = prefs(context)
    return None if p.hasher == "PYTHON" else digests.find_tessera(p.tessera_path)


def token_file():
    """Where the token is kept."""
    return os.path.join(bpy.utils.user_resource("CONFIG"), "tessera.token")


def _write_token(value):
    path = token_file()
    if not value:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # A file an older tool made may be wider: narrow it first.
        os.fchmod(fd, 0o600)
        os.write(fd, (value + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def _get_token(self):
    try:
        with open(token_file(), encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        pass
    except OSError as e:
        print("Tessera: cannot read the token from %s: %s; check its permissions"
              % (token_file(), e), file=sys.stderr)
        return ""
    # Earlier versions kept the token in the preferences: move it out.
    old = self.get("token")
    if isinstance(old, str) and old.strip():
        try:
            _write_token(old.strip())
            del self["token"]
        except (OSError, TypeError) as e:
            print("Tessera: cannot move the token to %s: %s" % (token_file(), e),
                  file=sys.stderr)
        return old.strip()
    return ""


def _set_token(self, value):
    try:
        _write_token((value or "").strip())
    except OSError as e:
        print("Tessera: cannot write the token to %s: %s; check the folder's permissions"
              % (token_file(), e), file=sys.stderr)


_how = {}


def _hashing(p):
    """How digests are computed, measured once per setting."""
    key = (p.hasher, p.tessera_path)
    if key not in _how:
        exe = None if p.hasher == "PYTHON" else digests.find_tessera(p.tessera_path)
        _how[key] = digests.describe(exe)
    return _how[key]


def _draw_preferences(p, context):
    layout = p.layout
    col = layout.column()
    col.prop(p, "url")
    col.prop(p, "token")
    col.prop(p, "ca_file")
    col.prop(p, "tessera_path")
    col.prop(p, "hasher")
    col.label(text=_hashing(p), icon="INFO")
    col.operator("tessera.test_connection", icon="LINKED")


class TesseraPreferences(bpy.types.AddonPreferences):
    bl_idname = PACKAGE

    url: StringProperty(
        name="Coordinator URL", default="http://127.0.0.1:7879",
        description="The coordinator's HTTP address (tessera coordinator --http ADDR)")
    token: StringProperty(
        name="Token", subtype="PASSWORD", default="", get=_get_token, set=_set_token,
        description="Your token (tessera users add NAME prints one); kept in tessera.token "
                    "in Blender's config folder, readable only by you, never in a .blend")
    ca_file: StringProperty(
        name="CA file", subtype="FILE_PATH", default="",
        description="For https:// URLs: the CA certificate (PEM) that signed the coordinator's")
    tessera_path: StringProperty(
        name="tessera binary", subtype="FILE_PATH", default="",
        description="Hashes files at native speed (empty: found on $PATH); without it a "
                    "pure-Python BLAKE3 is used, much slower")
    hasher: EnumProperty(
        name="Digests", default="AUTO",
        items=[("AUTO", "Auto", "The tessera binary when found, else pure Python"),
               ("PYTHON", "Pure Python", "Always the add-on's own BLAKE3 (slow)")])

    def draw(self, context):
        _draw_preferences(self, context)


class TesseraSceneSettings(bpy.types.PropertyGroup):
    frames: StringProperty(
        name="Frames", default="",
        description="Frames to render: 7, 1-250, 1-100x2, 1,5,10-20 (empty: the scene's range)")
    tiles: StringProperty(
        name="Tiles", default="1x1",
        description="Split every frame into COLUMNSxROWS tiles, stitched back pixel-exactly")
    chunk: IntProperty(name="Chunk", default=0, min=0,
                       description="Frames per task (0: sized by the farm, about 2 s of work a task)")
    priority: IntProperty(name="Priority", default=0, description="Higher runs first")
    device: EnumProperty(
        name="Device", default="ANY",
        items=[("ANY", "Any", "Any worker"), ("CPU", "CPU", "CPU workers only"),
               ("CUDA", "CUDA", "NVIDIA CUDA GPUs"), ("OPTIX", "OptiX", "NVIDIA OptiX GPUs")])
    min_vram: FloatProperty(name="Min VRAM (GB)", default=0.0, min=0.0,
                            description="Least GPU memory a worker slot must have")
    tags: StringProperty(name="Tags", default="",
                         description="Tags every rendering worker must carry, comma-separated")
    job_id: IntProperty(name="Last job", default=0, min=0,
                        description="The last job submitted from this scene")


CLASSES = (TesseraPreferences, TesseraSceneSettings)


def register():
    for c in CLASSES:
        bpy.utils.register_class(c)
    bpy.types.Scene.tessera = PointerProperty(type=TesseraSceneSettings)


def unregister():
    del bpy.types.Scene.tessera
    for c in reversed(CLASSES):
        bpy.utils.unregister_class(c)
