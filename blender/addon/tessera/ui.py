"""The panel (Properties > Render > Tessera): the job's settings, the upload in
progress and the last job's state, as `state` keeps them."""

import bpy

from . import state
from .props import prefs

class TESSERA_PT_panel(bpy.types.Panel):
    bl_label = "Tessera"
    bl_space_type = "PROPERTIES"
    bl_region_type = "WINDOW"
    bl_context = "render"

    def draw(self, context):
        layout = self.layout
        scene = context.scene
        s = scene.tessera
        layout.use_property_split = True
        layout.use_property_decorate = False
        col = layout.column()
        col.prop(s, "frames")
        if not s.frames:
            col.label(text="Frames: the scene's range, %d-%d" % (scene.frame_start,
                                                                  scene.frame_end))
        col.prop(s, "tiles")
        col.prop(s, "chunk")
        col.prop(s, "priority")
        col.prop(s, "device")
        col.prop(s, "min_vram")
        col.prop(s, "tags")
        try:
            configured = bool(prefs(context).token)
        except KeyError:
            configured = False
        if not configured:
            layout.label(text="Set the coordinator and token in the add-on's preferences",
                         icon="ERROR")
        up = state.upload
        row = layout.row(align=True)
        row.scale_y = 1.4
        if up is not None and not up.finished:
            row.label(text=up.status_line(), icon="EXPORT")
        else:
            row.operator("tessera.submit", icon="RENDER_ANIMATION")
        layout.operator("tessera.export_bundle", icon="PACKAGE")
        if s.job_id:
            self.draw_job(layout, s.job_id)

    def draw_job(self, layout, job_id):
        box = layout.box()
        known = state.known(job_id) or {}
        view = known.get("view")
        if view:
            done, total = view.get("frames_done", 0), view.get("frames_total", 0)
            pct = 100.0 * done / total if total else 0.0
            box.label(text="Job %d: %s, %d of %d frames (%.0f%%)" % (
                job_id, view.get("state", "?"), done, total, pct), icon="RENDERLAYERS")
            for key in ("message", "waiting"):
                if view.get(key):
                    row = box.row()
                    row.alert = view.get("state") == "failed"
                    row.label(text=str(view[key]), icon="ERROR" if row.alert else "TIME")
        else:
            box.label(text="Job %d" % job_id, icon="RENDERLAYERS")
        if known.get("error"):
            row = box.row()
            row.alert = True
            row.label(text=known["error"], icon="ERROR")
        row = box.row(align=True)
        row.operator("tessera.refresh", icon="FILE_REFRESH")
        row.operator("tessera.fetch", icon="IMPORT")
        op = row.operator("tessera.fetch", text="", icon="FILE_FOLDER")
        op.choose = True
        row.operator("tessera.open_dashboard", icon="URL")


CLASSES = (TESSERA_PT_panel,)


def register():
    for c in CLASSES:
        bpy.utils.register_class(c)


def unregister():
    for c in reversed(CLASSES):
        bpy.utils.unregister_class(c)
