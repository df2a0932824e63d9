"""What the panel shows between redraws, kept out of the .blend: the last
view of each job, the upload in progress, and a UI timer that polls running
jobs from a thread so Blender never waits on the network while drawing."""

import threading

import bpy

from .api import FarmError
from .props import api_or_none

#: job id -> {"view": dict or None, "error": str or None}
jobs = {}
#: the Upload the submit operator runs in the UI, if any
upload = None
_inflight = set()
_lock = threading.Lock()
ENDED = ("done", "failed", "canceled")
INTERVAL = 2.0


def remember(job_id, view=None, error=None):
    with _lock:
        jobs[job_id] = {"view": view, "error": error}


def known(job_id):
    with _lock:
        return jobs.get(job_id)


def _fetch(api, job_id):
    try:
        remember(job_id, view=api.job(job_id))
    except FarmError as e:
        old = known(job_id) or {}
        remember(job_id, view=old.get("view"), error=str(e))
    except Exception as e:  # noqa: BLE001 - the panel shows it in words
        remember(job_id, error="unexpected %s: %s" % (type(e).__name__, e))
    finally:
        with _lock:
            _inflight.discard(job_id)


def poll_async(api, job_id):
    """Asks for the job's state in a thread (at most one request per job)."""
    with _lock:
        if job_id in _inflight:
            return
        _inflight.add(job_id)
    threading.Thread(target=_fetch, args=(api, job_id), daemon=True).start()


def redraw():
    wm = getattr(bpy.context, "window_manager", None)
    for window in (wm.windows if wm else []):
        for area in window.screen.areas:
            if area.type == "PROPERTIES":
                area.tag_redraw()


def _tick():
    try:
        scene = bpy.context.scene
        job_id = scene.tessera.job_id if scene is not None else 0
        if job_id:
            last = known(job_id)
            state = ((last or {}).get("view") or {}).get("state")
            if state not in ENDED:
                api = api_or_none(bpy.context)
                if api is not None:
                    poll_async(api, job_id)
        redraw()
    except Exception:  # noqa: BLE001 - a timer must never die (restricted contexts at load)
        pass
    return INTERVAL


def start_timer():
    if bpy.app.background:
        return  # no UI to update: operators run synchronously there
    if not bpy.app.timers.is_registered(_tick):
        bpy.app.timers.register(_tick, first_interval=INTERVAL, persistent=True)


def stop_timer():
    if bpy.app.timers.is_registered(_tick):
        bpy.app.timers.unregister(_tick)
