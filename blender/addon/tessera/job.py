"""Sending a scene to the farm, in two halves.

`prepare()` runs on Blender's main thread (it needs bpy): it saves a copy of
the open file, traces its files and refuses missing ones. `Upload.run()`
needs no bpy and runs in a thread under the modal operator (or inline in
background mode): hash, dry run, upload what the coordinator lacks, store
the file set, submit. The job is created last, so a cancelled upload leaves
no job behind.
"""

import json
import os
import re
import shutil
import tempfile
import threading

import bpy

from . import digests, files
from .api import Cancelled, FarmError

TILES = re.compile(r"^\s*[1-9][0-9]*\s*x\s*[1-9][0-9]*\s*$")
TAG = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def tags_of(text):
    return [t for t in re.split(r"[,\s]+", text or "") if t]


class Prepared:
    """A saved copy of the open file, its file set and the job's settings."""

    def __init__(self, layout, report, spec, tmpdir):
        self.layout, self.report, self.spec, self.tmpdir = layout, report, spec, tmpdir

    def cleanup(self):
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def prepare(context):
    """Checks the settings, saves a copy of the open file and traces its files.
    Raises FarmError with the words to show."""
    if not bpy.data.filepath:
        raise FarmError("save the file first: the farm renders a saved .blend "
                        "(File > Save As), and its textures are found relative to it")
    scene = context.scene
    s = scene.tessera
    if not TILES.match(s.tiles or "1x1"):
        raise FarmError("tiles %r is not COLUMNSxROWS, for example 2x2" % s.tiles)
    tags = tags_of(s.tags)
    for t in tags:
        if not TAG.match(t):
            raise FarmError("tag %r is not a tag; use up to 64 letters, digits, '-', '_' or '.'" % t)
    tmpdir = tempfile.mkdtemp(prefix="tessera-submit-")
    try:
        copy = os.path.join(tmpdir, os.path.basename(bpy.data.filepath))
        # A copy: the artist's file, its name and its unsaved state stay as
        # they are; relative paths are written as they are, so they resolve
        # from the original's place in the job root.
        bpy.ops.wm.save_as_mainfile(filepath=copy, copy=True, relative_remap=False,
                                    check_existing=False)
        if not os.path.isfile(copy):
            raise FarmError("Blender could not save a copy of the file to %s" % tmpdir)
        report = files.trace(scene)
        report["scene"] = os.path.abspath(bpy.data.filepath)
        layout = files.Layout(report, copy)
        if layout.missing:
            raise FarmError("the scene refers to %d file(s) that do not exist: %s. Put them "
                            "back or fix the paths (File > External Data > Report Missing "
                            "Files)" % (len(layout.missing), "; ".join(layout.missing)))
        facts = report["facts"]
        spec = {
            "scene_digest": "",
            "scene_name": os.path.basename(bpy.data.filepath),
            "frames": (s.frames or "").strip() or files.frames_of(report),
            "chunk": int(s.chunk),
            "priority": int(s.priority),
            "max_attempts": 0,
            "tiles": (s.tiles or "1x1").replace(" ", ""),
            # No margin when each pixel renders on its own, as `tessera submit`
            # chooses (deps.neighbours); else the farm's 16 px.
            "overscan": 0 if report.get("neighbours") == [] else 16,
            "scene_info": {"width": facts["width"], "height": facts["height"],
                           "file_format": facts["file_format"],
                           "fps": facts.get("fps", 0.0)},
            "device": s.device.lower(),
            "min_vram_gb": float(s.min_vram),
            "tags": tags,
            "file_set_digest": "",
            "features": files.features(report),
        }
        return Prepared(layout, report, spec, tmpdir)
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise


class Upload:
    """The thread-safe half: progress is read from another thread."""

    def __init__(self, api, prepared, tessera):
        self.api, self.prepared, self.tessera = api, prepared, tessera
        self.cancel = threading.Event()
        self.stage = "starting"
        self.done = 0
        self.total = 0
        self.notes = []      # warnings to show at the end
        self.check = None    # the dry run's answer
        self.sent = (0, 0)   # bytes and files uploaded
        self.job_id = None
        self.error = None
        self.finished = False

    def _progress(self, n):
        self.done += n

    def _cancelled(self):
        return self.cancel.is_set()

    def _stage(self, name, total):
        self.stage, self.done, self.total = name, 0, total

    def hash(self):
        """Digests of every file: the FileEntry list."""
        layout = self.prepared.layout
        sizes = sum(os.path.getsize(p) for _, p in layout.files)
        self._stage("hashing", sizes)
        found = digests.hash_files([p for _, p in layout.files], self.tessera,
                                   self._progress, self._cancelled)
        return layout.entries(found)

    def run(self):
        try:
            self._run()
        except Cancelled:
            self.error = None
            self.stage = "cancelled"
        except FarmError as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - shown in words, never as a traceback
            self.error = "unexpected %s: %s" % (type(e).__name__, e)
        finally:
            self.finished = True
            self.prepared.cleanup()

    def _run(self):
        api, layout, spec = self.api, self.prepared.layout, dict(self.prepared.spec)
        entries = self.hash()
        spec["scene_digest"] = entries[0]["digest"]
        # The dry run, before any upload: frames, requirements, workers.
        self._stage("checking", 0)
        self.check = api.check(spec)
        if not self.check.get("workers"):
            self.notes.append("no worker can take this job now%s; it will wait" % (
                ": " + self.check["waiting"] if self.check.get("waiting") else ""))
        if self._cancelled():
            raise Cancelled()
        lacking = api.missing({e["digest"] for e in entries})
        todo, seen = [], set()
        for (rel, local), e in zip(layout.files, entries):
            if e["digest"] in lacking and e["digest"] not in seen:
                seen.add(e["digest"])
                todo.append((local, e))
        self._stage("uploading", sum(e["size"] for _, e in todo))
        for local, e in todo:
            api.put_blob(e["digest"], local, e["size"], self._progress, self._cancelled)
        self.sent = (sum(e["size"] for _, e in todo), len(todo))
        self._stage("submitting", 0)
        fs = layout.file_set(entries)
        if fs is not None:
            spec["file_set_digest"] = api.file_set(fs)
        if self._cancelled():
            raise Cancelled()
        self.job_id = api.submit(spec)
        if self._cancelled():
            # Esc arrived while the job was being created: take it back.
            try:
                api.cancel(self.job_id)
            except FarmError as e:
                self.notes.append("job %d was created as you cancelled and could not be "
                                  "canceled: %s" % (self.job_id, e))
        self.stage = "done"

    def start(self):
        threading.Thread(target=self.run, name="tessera-upload", daemon=True).start()

    def status_line(self):
        if self.stage in ("hashing", "uploading") and self.total:
            return "%s %.1f of %.1f MB (Esc cancels)" % (self.stage.capitalize(), self.done / 1e6,
                                                         self.total / 1e6)
        return self.stage.capitalize() + "..."


def export_bundle(prepared, folder, tessera, progress=None):
    """Writes `folder/manifest.json` and `folder/files/...` for
    `tessera submit --bundle folder`. Returns the number of files."""
    folder = os.path.abspath(folder)
    manifest_path = os.path.join(folder, "manifest.json")
    if os.path.isdir(folder) and os.listdir(folder) and not os.path.isfile(manifest_path):
        raise FarmError("%s is not empty; export the bundle into an empty folder" % folder)
    up = Upload(None, prepared, tessera)
    entries = up.hash()
    files_dir = os.path.join(folder, "files")
    shutil.rmtree(files_dir, ignore_errors=True)
    for (rel, local), e in zip(prepared.layout.files, entries):
        dest = os.path.join(files_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(local, dest)
        if progress:
            progress(e["size"])
    spec = dict(prepared.spec)
    for k in ("scene_digest", "file_set_digest"):
        spec.pop(k, None)
    layout = prepared.layout
    manifest = {
        "format": "tessera-bundle",
        "version": 1,
        "created_by": "tessera add-on",
        "blender": bpy.app.version_string,
        "source": layout.source,
        "job": spec,
        "file_set": {"scene": layout.scene, "files": entries,
                     "mappings": [{"from": a, "to": b} for a, b in layout.mappings],
                     "missing": list(layout.missing)},
    }
    tmp = manifest_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, manifest_path)
    return len(entries)
