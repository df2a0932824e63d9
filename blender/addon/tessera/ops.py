"""Operators. Each reports failures in words with self.report and returns
CANCELLED: no traceback reaches the artist. Called from a script or in
`blender -b`, every one runs synchronously (execute)."""

import os
import time
import webbrowser

import bpy
from bpy.props import BoolProperty, FloatProperty, IntProperty, StringProperty

from . import job, state
from .api import FarmError
from .props import connect, tessera_binary


def addon_version():
    from . import VERSION
    return VERSION


def _fail(op, message):
    op.report({"ERROR"}, message)
    return {"CANCELLED"}


class TESSERA_OT_submit(bpy.types.Operator):
    """Save a copy of this file, upload it with every file it uses, and render it on the farm"""

    bl_idname = "tessera.submit"
    bl_label = "Submit to Tessera"

    _upload = None
    _timer = None

    def _start(self, context):
        api = connect(context)
        prepared = job.prepare(context)
        return job.Upload(api, prepared, tessera_binary(context))

    def execute(self, context):
        try:
            up = self._start(context)
        except FarmError as e:
            return _fail(self, str(e))
        up.run()
        return self._finish(context, up)

    def invoke(self, context, event):
        if bpy.app.background:
            return self.execute(context)
        if state.upload is not None and not state.upload.finished:
            return _fail(self, "an upload is already running; wait for it or press Esc")
        try:
            up = self._start(context)
        except FarmError as e:
            return _fail(self, str(e))
        self._upload = state.upload = up
        up.start()
        wm = context.window_manager
        wm.progress_begin(0, 100)
        self._timer = wm.event_timer_add(0.1, window=context.window)
        wm.modal_handler_add(self)
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        up = self._upload
        if event.type == "ESC" and event.value == "PRESS":
            up.cancel.set()
            up.stage = "cancelling"
            return {"RUNNING_MODAL"}
        if event.type == "TIMER":
            wm = context.window_manager
            if up.total:
                wm.progress_update(int(100 * up.done / up.total))
            context.workspace.status_text_set("Tessera: " + up.status_line())
            state.redraw()
            if up.finished:
                wm.event_timer_remove(self._timer)
                wm.progress_end()
                context.workspace.status_text_set(None)
                state.upload = None
                return self._finish(context, up)
        return {"PASS_THROUGH"}

    def _finish(self, context, up):
        if up.error:
            return _fail(self, up.error)
        if up.stage == "cancelled" or up.job_id is None:
            self.report({"WARNING"}, "upload cancelled; no job was submitted")
            return {"CANCELLED"}
        for note in up.notes:
            self.report({"WARNING"}, note)
        context.scene.tessera.job_id = up.job_id
        state.remember(up.job_id)
        check = up.check or {}
        sent, count = up.sent
        self.report({"INFO"}, "submitted job %d: %s frame(s) in %s task(s); uploaded %d file(s), "
                    "%.1f MB" % (up.job_id, check.get("frames", "?"), check.get("tasks", "?"),
                                 count, sent / 1e6))
        return {"FINISHED"}


class TESSERA_OT_export_bundle(bpy.types.Operator):
    """Write this file and every file it uses, with the job's settings, to a folder; submit it later with `tessera submit --bundle DIR`"""

    bl_idname = "tessera.export_bundle"
    bl_label = "Export Job Bundle"

    directory: StringProperty(name="Folder", subtype="DIR_PATH", default="")

    def invoke(self, context, event):
        if bpy.app.background or self.directory:
            return self.execute(context)
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        if not self.directory:
            return _fail(self, "choose a folder for the bundle (directory=...)")
        try:
            prepared = job.prepare(context)
        except FarmError as e:
            return _fail(self, str(e))
        try:
            n = job.export_bundle(prepared, bpy.path.abspath(self.directory),
                                  tessera_binary(context))
        except (FarmError, OSError) as e:
            return _fail(self, "cannot export the bundle: %s" % e)
        finally:
            prepared.cleanup()
        self.report({"INFO"}, "bundle of %d file(s) written to %s; submit it with `tessera submit "
                    "--bundle %s`" % (n, self.directory, self.directory))
        return {"FINISHED"}


def _job_id(op, context):
    job_id = op.job_id or context.scene.tessera.job_id
    if not job_id:
        raise FarmError("no job yet: submit the scene first (or give job_id=N)")
    return job_id


def describe(view):
    text = "job %d %s: %d of %d frame(s)" % (view.get("id", 0), view.get("state", "?"),
                                            view.get("frames_done", 0), view.get("frames_total", 0))
    for k in ("message", "waiting"):
        if view.get(k):
            text += "; " + view[k]
    return text


class TESSERA_OT_refresh(bpy.types.Operator):
    """Ask the farm for the last job's state and progress"""

    bl_idname = "tessera.refresh"
    bl_label = "Refresh"

    job_id: IntProperty(name="Job", default=0, min=0)

    def execute(self, context):
        try:
            job_id = _job_id(self, context)
            view = connect(context).job(job_id)
        except FarmError as e:
            return _fail(self, str(e))
        state.remember(job_id, view=view)
        state.start_timer()
        self.report({"INFO"}, describe(view))
        return {"FINISHED"}


def _safe_parts(name):
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return parts or ["output"]


class TESSERA_OT_fetch(bpy.types.Operator):
    """Download the last job's frames to the scene's output folder (Output Properties), or a chosen folder"""

    bl_idname = "tessera.fetch"
    bl_label = "Fetch Frames"

    job_id: IntProperty(name="Job", default=0, min=0)
    directory: StringProperty(name="Folder", subtype="DIR_PATH", default="",
                              description="Empty: where the scene's Output path points")
    choose: BoolProperty(name="Choose folder", default=False, options={"SKIP_SAVE"})
    wait: BoolProperty(name="Wait", default=False,
                       description="Wait for the job to end first (for scripts)")
    timeout: FloatProperty(name="Timeout", default=3600.0, min=1.0)

    def invoke(self, context, event):
        if self.choose and not bpy.app.background:
            context.window_manager.fileselect_add(self)
            return {"RUNNING_MODAL"}
        return self.execute(context)

    def execute(self, context):
        try:
            return self._fetch(context)
        except FarmError as e:
            return _fail(self, str(e))
        except OSError as e:
            return _fail(self, "cannot write the frames: %s" % e)

    def _dest(self, scene, frame, ext):
        if self.directory:
            folder = bpy.path.abspath(self.directory)
            return os.path.join(folder, "frame_%04d.%s" % (frame, ext))
        path = bpy.path.abspath(scene.render.frame_path(frame=frame))
        root, old = os.path.splitext(path)
        return root + "." + ext if old.lstrip(".").lower() != ext.lower() else path

    def _fetch(self, context):
        scene = context.scene
        job_id = _job_id(self, context)
        api = connect(context)
        view = api.job(job_id)
        deadline = time.monotonic() + self.timeout
        while self.wait and view.get("state") not in state.ENDED:
            if time.monotonic() > deadline:
                raise FarmError("job %d did not end within %d s (%s)" % (
                    job_id, self.timeout, describe(view)))
            time.sleep(0.5)
            view = api.job(job_id)
        outputs = []
        total = None
        while total is None or len(outputs) < total:
            page = api.job(job_id, output_from=len(outputs), output_limit=1000)
            got = page.get("outputs") or []
            total = page.get("outputs_total", len(got))
            outputs.extend(got)
            if not got:
                break
        state.remember(job_id, view=view)
        if not outputs:
            raise FarmError("%s; nothing rendered yet to fetch" % describe(view))
        written, folder = [], None
        wm = context.window_manager
        wm.progress_begin(0, len(outputs))
        try:
            for i, out in enumerate(outputs):
                ext = (out.get("ext") or "png").lstrip(".")
                frame = int(out["frame"])
                if out.get("pass"):
                    base = os.path.dirname(self._dest(scene, frame, ext))
                    dest = os.path.join(base, "passes", *_safe_parts(out["pass"]))
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    api.blob(out["digest"], dest)
                else:
                    dest = self._dest(scene, frame, ext)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    api.frame(job_id, frame, dest)
                    written.append(dest)
                    folder = os.path.dirname(dest)
                wm.progress_update(i + 1)
        finally:
            wm.progress_end()
        self.report({"INFO"}, "%d frame(s) of job %d written to %s%s" % (
            len(written), job_id, folder,
            "" if view.get("state") == "done" else " (%s)" % describe(view)))
        return {"FINISHED"}


class TESSERA_OT_open_dashboard(bpy.types.Operator):
    """Open the last job's page on the farm's dashboard in the web browser"""

    bl_idname = "tessera.open_dashboard"
    bl_label = "Open Dashboard"

    job_id: IntProperty(name="Job", default=0, min=0)

    def execute(self, context):
        try:
            api = connect(context)
        except FarmError as e:
            return _fail(self, str(e))
        url = api.dashboard(self.job_id or context.scene.tessera.job_id)
        if not bpy.app.background:
            webbrowser.open(url)
        self.report({"INFO"}, url)
        return {"FINISHED"}


class TESSERA_OT_test_connection(bpy.types.Operator):
    """Check the URL, the token and the coordinator's version"""

    bl_idname = "tessera.test_connection"
    bl_label = "Test Connection"

    def execute(self, context):
        try:
            who = connect(context).whoami()
        except FarmError as e:
            return _fail(self, str(e))
        ours, theirs = addon_version(), str(who.get("version", "?"))
        text = "connected as %s (%s); coordinator %s" % (who.get("user", "?"),
                                                          who.get("role", "?"), theirs)
        if theirs != ours:
            self.report({"WARNING"}, "%s, but this add-on is %s: install the add-on that comes "
                        "with the farm's tessera (scripts/addon.sh)" % (text, ours))
        else:
            self.report({"INFO"}, text)
        if who.get("role") == "worker":
            self.report({"WARNING"}, "this is a worker token; submitting needs a user token")
        return {"FINISHED"}


CLASSES = (TESSERA_OT_submit, TESSERA_OT_export_bundle, TESSERA_OT_refresh, TESSERA_OT_fetch,
           TESSERA_OT_open_dashboard, TESSERA_OT_test_connection)


def register():
    for c in CLASSES:
        bpy.utils.register_class(c)


def unregister():
    for c in reversed(CLASSES):
        bpy.utils.unregister_class(c)
