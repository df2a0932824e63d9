"""Test driver run inside Blender: installs the add-on zip into the user
folders the test chose, enables it, sets its preferences, runs operators in
order and writes what each did to --out as JSON.

In a Blender binary (3.4 installs it as a legacy add-on, from bl_info):

    BLENDER_USER_SCRIPTS=DIR blender -b [SCENE.blend] --python-exit-code 3 \
        --python tests/addon/drive.py -- --zip out/tessera-addon.zip \
        --prefs '{"url": ..., "token": ...}' --steps '[["submit", {}], ...]' --out R.json

In a `bpy` module runtime (4.2+ install it as an extension, from
blender_manifest.toml, as module `bl_ext.user_default.tessera`):

    BLENDER_USER_RESOURCES=DIR VENV/bin/python -I tests/addon/drive.py \
        --scene SCENE.blend --zip ... --prefs ... --steps ... --out R.json

Each step is [operator name in bpy.ops.tessera, keyword arguments]; a step
may also be ["set", {"scene.tessera.frames": "1-2", ...}] to set properties.
The result lists, per step, Blender's return set or the error the operator
reported (bpy raises RuntimeError for an ERROR report), and "traceback":
whether a Python traceback appeared in it (an add-on bug). It also names the
module the add-on was enabled as and the Blender that ran it.
"""

import argparse
import hashlib
import importlib
import json
import os
import sys

import bpy

# After bpy: in the module runtime, `import bpy` puts Blender's script
# folders (where addon_utils lives) on sys.path.
import addon_utils  # noqa: E402


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def install(zip_path):
    """Installs and enables the add-on the way this Blender's user would;
    returns the module name it got."""
    if bpy.app.version >= (4, 2, 0):
        # What Preferences > Get Extensions > Install from Disk and
        # `blender --command extension install-file -r user_default` do.
        result = bpy.ops.extensions.package_install_files(
            filepath=zip_path, repo="user_default", enable_on_install=True)
        assert result == {"FINISHED"}, "extension install: %s" % result
        return "bl_ext.user_default.tessera"
    bpy.ops.preferences.addon_install(filepath=zip_path, overwrite=True)
    bpy.ops.preferences.addon_enable(module="tessera")
    return "tessera"


def upload_cancelled_midway(module):
    """Runs the submit operator's upload (the object its modal handler drives)
    and cancels it as Esc does, once bytes are on their way: the same
    `cancel` event, set from the upload's own progress."""
    # The installed add-on's own modules, under the name it was enabled as.
    job = importlib.import_module(module + ".job")
    props = importlib.import_module(module + ".props")
    up = job.Upload(props.connect(bpy.context), job.prepare(bpy.context),
                    props.tessera_binary(bpy.context))
    progress = up._progress

    def cancel_while_uploading(n):
        progress(n)
        if up.stage == "uploading":
            up.cancel.set()

    up._progress = cancel_while_uploading
    up.run()
    return {"op": "upload_cancelled_midway", "stage": up.stage, "job_id": up.job_id,
            "error": up.error, "sent": list(up.sent), "traceback": False}


def save_userpref(module, token):
    """Saves Blender's preferences as the artist does, and says where the
    token ended up: in userpref.blend (readable by anyone who can read the
    config folder) or in the add-on's token file, and that file's mode."""
    bpy.ops.wm.save_userpref()
    config = bpy.utils.user_resource("CONFIG")
    with open(os.path.join(config, "userpref.blend"), "rb") as f:
        in_userpref = token.encode() in f.read()
    props = importlib.import_module(module + ".props")  # as it was enabled
    # An add-on without a token file keeps the token in its preferences only.
    path = props.token_file() if hasattr(props, "token_file") else None
    exists = path is not None and os.path.exists(path)
    mode = os.stat(path).st_mode & 0o777 if exists else None
    with open(path if exists else os.devnull, "rb") as f:
        in_file = token.encode() in f.read()
    return {"op": "save_userpref", "token_in_userpref": in_userpref,
            "token_file": path, "token_file_mode": mode, "token_in_file": in_file,
            "traceback": False}


def main():
    # Blender passes the script's arguments after `--`; plain Python passes them all.
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:]
    p = argparse.ArgumentParser()
    p.add_argument("--scene", help="open this .blend first (the bpy module has no command line)")
    p.add_argument("--zip", required=True)
    p.add_argument("--prefs", default="{}")
    p.add_argument("--steps", default="[]")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.scene:
        bpy.ops.wm.open_mainfile(filepath=os.path.abspath(a.scene), load_ui=False,
                                 use_scripts=False)
    module = install(os.path.abspath(a.zip))
    assert addon_utils.check(module)[1], "the add-on is not enabled as %s" % module
    prefs = bpy.context.preferences.addons[module].preferences
    for k, v in json.loads(a.prefs).items():
        setattr(prefs, k, v)
    blend = bpy.data.filepath
    before = sha256(blend) if blend else None
    results = []
    for name, kwargs in json.loads(a.steps):
        if name == "set":
            for path, value in kwargs.items():
                obj_path, attr = path.rsplit(".", 1)
                obj = bpy.context
                for part in obj_path.split("."):
                    obj = getattr(obj, part)
                setattr(obj, attr, value)
            continue
        if name == "upload_cancelled_midway":
            results.append(upload_cancelled_midway(module))
            continue
        if name == "save_userpref":
            results.append(save_userpref(module, prefs.token))
            continue
        step = {"op": name}
        try:
            step["result"] = sorted(getattr(bpy.ops.tessera, name)(**kwargs))
            step["error"] = None
        except RuntimeError as e:
            step["result"] = ["ERROR"]
            step["error"] = str(e)
        step["traceback"] = "Traceback" in (step["error"] or "")
        step["job_id"] = bpy.context.scene.tessera.job_id
        results.append(step)
        print("drive.py:", json.dumps(step), flush=True)
    out = {"steps": results, "blend_sha_before": before,
           "blend_sha_after": sha256(blend) if blend else None,
           "is_dirty": bpy.data.is_dirty, "module": module,
           "blender": bpy.app.version_string}
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)


main()
