"""Tessera: send the open scene to a Tessera render farm and bring its frames
back, from Render Properties > Tessera. See the README's "Add-on" section."""

bl_info = {
    "name": "Tessera render farm",
    "author": "Tessera",
    "version": (0, 1, 0),
    "blender": (3, 4, 0),
    "location": "Properties > Render > Tessera",
    "description": "Submit the scene to a Tessera farm, watch its progress, fetch its frames",
    "category": "Render",
}

if "bpy" in locals():
    import importlib

    for _m in (api, blake3, deps, digests, files, job, props, state, ops, ui):  # noqa: F821
        importlib.reload(_m)
else:
    from . import api, blake3, deps, digests, files, job, props, state, ops, ui  # noqa: F401

import bpy  # noqa: E402

VERSION = ".".join(str(v) for v in bl_info["version"])


def register():
    props.register()
    ops.register()
    ui.register()
    state.start_timer()


def unregister():
    state.stop_timer()
    ui.unregister()
    ops.unregister()
    props.unregister()
