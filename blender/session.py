"""Warm render session: load a scene once, then render frames/tiles on command.

Started by the worker once per (job, slot):

    blender -b SCENE.blend --python-exit-code 3 --python blender/session.py -- --reply-fd 3

Commands arrive one JSON object per line on stdin; replies go one JSON object per
line to the file descriptor given by --reply-fd (never to stdout, which stays
Blender's log).  See blender/README.md for the protocol.

Every render keeps `render.use_persistent_data = True`, so later renders reuse the
synced scene, BVH and images.  Apart from the frame, the thread count (when given)
and the border (for tiles) no render setting is touched: the output equals a plain
`blender -b SCENE.blend -f N` render.

Progress: in background mode `bpy.app.handlers.render_stats` is called with no
string in 3.4 (its arguments are (None, None)), and Cycles only updates its status
at sample 0, after the first sample and then in chunks sized to ~30 s of work.
The only place the "Sample N/M" text exists is Blender's stdout, so (unless
--no-progress) fd 1 is replaced by a pipe that a thread copies, byte for byte, to
the original stdout while looking for "Sample N/M" (or, for a frame larger than
Cycles' tile size, "Rendered R/N Tiles, Sample S/M": see cycles_progress.py).
"""

import argparse
import json
import os
import select
import struct
import sys
import threading
import time
import traceback

import bpy

# Beside this script (written there by the worker, like remap.py); `python -I`
# leaves the script's folder off sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cycles_progress  # noqa: E402

PROGRESS_MIN_INTERVAL = 0.25  # seconds between progress events (at most ~4/s)


def parse_args():
    argv = sys.argv
    argv = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(prog="session.py")
    p.add_argument("--reply-fd", type=int, required=True)
    p.add_argument("--cycles-device", default="CPU",
                   help="CPU, CUDA or OPTIX: the worker pins the process to one GPU with "
                        "CUDA_VISIBLE_DEVICES; this enables exactly that device type")
    p.add_argument("--no-progress", action="store_true",
                   help="do not tee stdout to parse 'Sample N/M' (no progress events, and no "
                        "sample count to prove that a render really ran)")
    p.add_argument("--job-root", default=None,
                   help="the job's root folder (a file set materialised by the worker): the "
                        "scene may read files under it and nowhere else")
    p.add_argument("--mappings", default=None,
                   help="a JSON file {absolute path as the scene wrote it: the same file "
                        "under --job-root}; those references are rewritten at load")
    p.add_argument("--spare", action="store_true",
                   help="started before its task is known: wait for one `open` command on stdin "
                        "(the scene, its job root and mappings), then load the scene and serve")
    p.add_argument("--fail-first-render", action="store_true",
                   help="TESTS ONLY: the first render fails as a crashing GPU driver would, and "
                        "so does every later render in this process")
    # Options meant for Blender's own add-ons (e.g. Cycles' --cycles-device)
    # share the arguments after `--`: leave them alone.
    args, _ = p.parse_known_args(argv)
    return args


# ---------------------------------------------------------------- replies

class Replier:
    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()
        self.broken = False

    def send(self, obj):
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")
        with self.lock:
            if self.broken:
                return False
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            except OSError:
                self.broken = True  # the worker is gone; the loop ends on stdin EOF
                return False
        return True


# ---------------------------------------------------------------- progress (stdout tee)

class StdoutTee:
    """Replace fd 1 with a pipe; a thread copies everything to the real stdout and
    turns "Sample N/M" into progress events for the command being rendered."""

    def __init__(self, replier):
        self.replier = replier
        self.lock = threading.Lock()
        self.current_id = None  # set while a render command runs
        self.last_emit = 0.0
        self.seen = None        # last (done, total) parsed for this command
        self.most = None        # highest (done, total) parsed for this command
        self.pending = None     # parsed but held back by the rate limit
        self.tail = b""
        self.sync_token = None  # written to fd 1 by sync(); the thread sets `synced` on it
        self.sync_count = 0
        self.synced = threading.Event()
        sys.stdout.flush()
        self.real_stdout = os.dup(1)
        r, w = os.pipe()
        try:
            import fcntl
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MiB of slack while the GIL is held
        except Exception:
            pass
        os.dup2(w, 1)
        os.close(w)
        self.read_fd = r
        self.thread = threading.Thread(target=self._run, name="tessera-stdout-tee", daemon=True)
        self.thread.start()

    def start_command(self, cmd_id):
        with self.lock:
            self.current_id = cmd_id
            self.last_emit = 0.0
            self.seen = None
            self.most = None
            self.pending = None
            self.tail = b""

    def end_command(self):
        """Ends the command; returns the highest (done, total) samples Cycles
        printed for it, or None when it printed none."""
        self.sync()
        with self.lock:
            self.current_id = None
            self.pending = None
            return self.most

    def sync(self, timeout=5.0):
        """Wait until the thread has scanned everything written to fd 1 so far:
        flush C's and Python's buffers, write a marker line and wait for it."""
        try:
            sys.stdout.flush()
        except Exception:
            pass
        _flush_c_stdio()
        with self.lock:
            self.sync_count += 1
            self.sync_token = b"\x1btessera-sync %d\n" % self.sync_count
            self.synced.clear()
            token = self.sync_token
        try:
            os.write(1, token)
        except OSError:
            return
        self.synced.wait(timeout)

    def _run(self):
        while True:
            with self.lock:
                wait = None
                if self.pending is not None:
                    wait = max(0.0, self.last_emit + PROGRESS_MIN_INTERVAL - time.monotonic())
            try:
                ready, _, _ = select.select([self.read_fd], [], [], wait)
                if not ready:
                    self._emit_pending()
                    continue
                chunk = os.read(self.read_fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not chunk:
                break
            with self.lock:
                token = self.sync_token
            found_token = token is not None and token in (self.tail + chunk)
            if found_token and token in chunk:
                chunk = chunk.replace(token, b"")  # the marker is not Blender's output
            try:
                view = memoryview(chunk)
                while view:
                    n = os.write(self.real_stdout, view)
                    view = view[n:]
            except OSError:
                pass  # nobody reads stdout any more; keep draining so Blender never blocks
            try:
                self._scan(chunk)
                self._emit_pending()
            except Exception:
                pass
            if found_token:
                with self.lock:
                    self.sync_token = None
                self.synced.set()

    def _scan(self, chunk):
        with self.lock:
            if self.current_id is None:
                self.tail = b""
                return
            # Blender flushes each status line whole (one write), so a number is never cut;
            # the tail only helps with a status split from its digits.
            text = self.tail + chunk
            self.tail = text[-96:]
            found = cycles_progress.scan(text)
            if not found:
                return
            # The highest count so far: a tiled frame's lines can dip (see cycles_progress).
            value = max(found)
            if self.most is not None and value[0] < self.most[0]:
                return
            self.most = value
            if value != self.seen:
                self.seen = value
                self.pending = value

    def _emit_pending(self):
        with self.lock:
            if self.pending is None or self.current_id is None:
                return
            now = time.monotonic()
            done, total = self.pending
            if now - self.last_emit < PROGRESS_MIN_INTERVAL and done != total:
                return
            msg = {"event": "progress", "id": self.current_id,
                   "samples_done": done, "samples_total": total}
            self.pending = None
            self.last_emit = now
        self.replier.send(msg)

    def close(self):
        """Give fd 1 back to the real stdout and let the thread drain the pipe."""
        try:
            sys.stdout.flush()
        except Exception:
            pass
        os.dup2(self.real_stdout, 1)  # closes the pipe's last write end -> EOF for the thread
        self.thread.join(timeout=5.0)


_LIBC = None


def _flush_c_stdio():
    """Flush C's stdout buffer (Blender prints with printf)."""
    global _LIBC
    try:
        if _LIBC is None:
            import ctypes
            _LIBC = ctypes.CDLL(None)
        _LIBC.fflush(None)
    except Exception:
        pass


# Written on stdout and stderr, after every earlier byte of each, right before
# the `ready` reply: the worker reads each stream up to it, so the lines Blender
# printed while loading (warnings, missing files) are in hand when it reads
# `ready`, without waiting on a guess. Never Blender's own output.
OUTPUT_MARK = b"\x1btessera-loaded\n"


def mark_output_end():
    """Flush what Python and C hold for stdout and stderr, then write
    OUTPUT_MARK on each (through the tee, if it runs: it copies the mark too)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _flush_c_stdio()
    for fd in (1, 2):
        try:
            os.write(fd, OUTPUT_MARK)
        except OSError:
            pass


# ---------------------------------------------------------------- files outside the job

def _abs(path, library=None):
    return os.path.normpath(bpy.path.abspath(path, library=library))


def outside_files(root=None):
    """Every external file the scene would read from this machine's disk.

    The job is the .blend alone (packed data inside it), so any file it refers
    to that is not packed lies outside the job: images (FILE / SEQUENCE / TILED,
    UDIM tiles expanded), linked libraries and everything else
    `bpy.utils.blend_paths(absolute=True)` lists. Returns absolute, deduplicated
    paths, each with whether it exists here.
    """
    found = []
    seen = set()

    def add(path):
        if not path:
            return
        p = os.path.normpath(path)
        if root is not None and (p == root or p.startswith(root + os.sep)):
            return  # part of the job's file set
        if p not in seen:
            seen.add(p)
            found.append({"path": p, "missing": not os.path.exists(p)})

    for img in bpy.data.images:
        if img.source not in {"FILE", "SEQUENCE", "TILED"}:
            continue
        if img.packed_file is not None or len(getattr(img, "packed_files", ())) > 0:
            continue
        path = _abs(img.filepath_raw or img.filepath, library=img.library)
        if img.source == "TILED":
            tokens = [t for t in ("<UDIM>", "<UVTILE>") if t in path]
            if tokens:
                for tile in img.tiles:
                    n = tile.number
                    u, v = (n - 1001) % 10 + 1, (n - 1001) // 10 + 1
                    add(path.replace("<UDIM>", str(n)).replace("<UVTILE>", "u%d_v%d" % (u, v)))
                continue
        add(path)
    for lib in bpy.data.libraries:
        if lib.packed_file is None:
            add(_abs(lib.filepath, library=lib.parent))
    # Everything else Blender knows about (sounds, fonts, caches, volumes, movie clips...).
    # packed=False leaves out packed data (the docstring has the meaning inverted in 3.4).
    for path in bpy.utils.blend_paths(absolute=True, packed=False, local=False):
        if "<UDIM>" in path or "<UVTILE>" in path:
            continue  # tiled images were expanded above
        add(path)
    return found


def newer_file():
    """The version that saved the scene when it is newer than this Blender, else None."""
    saved = tuple(bpy.data.version)
    if saved[:2] > tuple(bpy.app.version)[:2]:
        return "%d.%d.%d" % saved
    return None


# ---------------------------------------------------------------- outputs

def _safe_name(name):
    """A folder name made from a node's name: no separators, no dot-names."""
    out = "".join(c if (c.isalnum() or c in " ._-") else "_" for c in name).strip(" .")
    return out[:64] or "output"


def _safe_slot_path(path):
    """A File Output slot's path made relative and kept inside its node's folder."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        parts = [p for p in parts if p != ".."][-1:]
    return "/".join(parts) or "Image"


def file_output_nodes():
    """(owner, node) for every compositor File Output node: the scenes' trees and
    the node groups they use."""
    found = []
    seen = set()

    def walk(tree, owner):
        if tree is None or tree.as_pointer() in seen:
            return
        seen.add(tree.as_pointer())
        for node in tree.nodes:
            if node.bl_idname == "CompositorNodeOutputFile":
                found.append((owner, node))
            elif getattr(node, "node_tree", None) is not None:
                walk(node.node_tree, owner + "_" + node.node_tree.name)

    for scene in bpy.data.scenes:
        # 5.0 keeps the compositor in a node group; 3.x and 4.x in node_tree.
        tree = getattr(scene, "compositing_node_group", None) or getattr(scene, "node_tree", None)
        if tree is not None:
            walk(tree, scene.name)
    return found


class OutputMap:
    """Points every File Output node into the task's folder: `passes/<node>/`.

    Folder names are fixed per node for the whole session, so a pass has the
    same name in every task; the original path is logged once.
    """

    def __init__(self, scene):
        self.names = {}
        used = set()
        for owner, node in file_output_nodes():
            base = _safe_name(node.name if owner == scene.name else owner + "_" + node.name)
            name, n = base, 2
            while name.lower() in used:
                name, n = "%s_%d" % (base, n), n + 1
            used.add(name.lower())
            self.names[node.as_pointer()] = (node, name)
            print("tessera: File Output node %r (%s) writes into the task folder, "
                  "passes/%s/, instead of %r" % (node.name, owner, name, node.base_path),
                  flush=True)
            for slot in node.file_slots:
                safe = _safe_slot_path(slot.path)
                if safe != slot.path:
                    slot.path = safe

    def point_into(self, passes_dir):
        for node, name in self.names.values():
            node.base_path = os.path.join(passes_dir, name) + os.sep


def list_files(root):
    """Relative paths of the files under root."""
    found = set()
    for dirpath, _, files in os.walk(root):
        for f in files:
            found.add(os.path.relpath(os.path.join(dirpath, f), root))
    return found


# ---------------------------------------------------------------- image size

def image_size(path):
    with open(path, "rb") as f:
        head = f.read(33)
        if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
            w, h = struct.unpack(">II", head[16:24])
            return w, h
        if head[:4] == b"\x76\x2f\x31\x01":  # OpenEXR
            f.seek(8)
            data = f.read(1 << 16)
            return _exr_size(data)
    # Other formats: let Blender decode it.
    img = bpy.data.images.load(path, check_existing=False)
    try:
        w, h = img.size[0], img.size[1]
    finally:
        bpy.data.images.remove(img)
    return w, h


def _exr_size(data):
    pos = 0
    while True:
        end = data.index(b"\0", pos)
        name = data[pos:end]
        if not name:
            break
        tend = data.index(b"\0", end + 1)
        size = struct.unpack("<i", data[tend + 1:tend + 5])[0]
        value = data[tend + 5:tend + 5 + size]
        if name == b"dataWindow":
            xmin, ymin, xmax, ymax = struct.unpack("<iiii", value[:16])
            return xmax - xmin + 1, ymax - ymin + 1
        pos = tend + 5 + size
    raise ValueError("EXR header has no dataWindow")


# ---------------------------------------------------------------- commands

class CommandError(Exception):
    """A command that cannot run: its words go back in an `error` reply, with
    the command's id when it had a readable one."""

    def __init__(self, msg, cmd_id=None):
        super().__init__(msg)
        self.cmd_id = cmd_id


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_tile(v):
    return (isinstance(v, dict) and set(v) == {"border", "size", "frame"}
            and isinstance(v["border"], list) and len(v["border"]) == 4
            and all(_is_number(x) for x in v["border"])
            and all(isinstance(v[k], list) and len(v[k]) == 2
                    and all(_is_int(x) and x > 0 for x in v[k]) for k in ("size", "frame")))


# What each command may carry: field -> (required, check, what it must be).
# The worker's side of the same protocol is worker/src/session_protocol.rs.
COMMANDS = {
    "render": {
        "id": (True, lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
        "frame": (True, _is_int, "an integer"),
        "output_dir": (True, lambda v: isinstance(v, str) and os.path.isabs(v),
                       "an absolute path"),
        "threads": (False, lambda v: v is None or (_is_int(v) and v >= 1),
                    "a positive integer or null"),
        "tile": (False, lambda v: v is None or _is_tile(v),
                 "null or {border:[min_x,max_x,min_y,max_y], size:[w,h], frame:[W,H]}"),
    },
    "quit": {},
    # The first line of a --spare session, and nothing else (see open_scene).
    "open": {
        "scene": (True, lambda v: isinstance(v, str) and os.path.isabs(v), "an absolute path"),
        "job_root": (False, lambda v: v is None or (isinstance(v, str) and os.path.isabs(v)),
                     "an absolute path or null"),
        "mappings": (False, lambda v: v is None or (isinstance(v, str) and os.path.isabs(v)),
                     "an absolute path or null"),
        "scene_python": (True, lambda v: isinstance(v, bool), "true or false"),
    },
}


def command_id(cmd):
    """The id a reply to `cmd` carries: its own when it is one, else None."""
    v = cmd.get("id") if isinstance(cmd, dict) else None
    return v if _is_int(v) and v >= 0 else None


# What a session with its scene loaded takes; a --spare one first takes `open`.
SERVING = ("quit", "render")


def parse_command(line, allowed=SERVING):
    """One line of stdin as a checked command (a dict with a `cmd` among
    `allowed` and the fields that command takes, of the right types);
    CommandError naming what is wrong and what is expected otherwise."""
    try:
        cmd = json.loads(line)
    except ValueError as e:
        raise CommandError("bad JSON command: %s" % e)
    if not isinstance(cmd, dict):
        raise CommandError("a command must be a JSON object, got %s" % type(cmd).__name__)
    cmd_id = command_id(cmd)
    kind = cmd.get("cmd")
    if kind not in allowed:
        raise CommandError("unknown cmd %s; the commands are %s"
                           % (json.dumps(kind), ", ".join(sorted(allowed))), cmd_id)
    fields = COMMANDS[kind]
    unknown = sorted(set(cmd) - set(fields) - {"cmd"})
    if unknown:
        raise CommandError("%s: unknown field(s) %s; it takes %s" % (
            kind, ", ".join(repr(k) for k in unknown), ", ".join(fields) or "no fields"), cmd_id)
    for name, (required, check, what) in fields.items():
        if name not in cmd:
            if required:
                raise CommandError("%s: missing field %r (%s)" % (kind, name, what), cmd_id)
            continue
        if not check(cmd[name]):
            raise CommandError("%s: %r must be %s, got %s"
                               % (kind, name, what, json.dumps(cmd[name])), cmd_id)
    return cmd


class Session:
    def __init__(self, replier, tee, fail_renders=False):
        self.replier = replier
        self.tee = tee
        self.scene = bpy.context.scene
        r = self.scene.render
        self.orig_threads = (r.threads_mode, r.threads)
        r.use_persistent_data = True
        self.outputs = OutputMap(self.scene)
        self.fail_renders = fail_renders

    def render(self, cmd):
        """Renders a command that parse_command checked."""
        cmd_id = cmd["id"]
        scene = self.scene
        r = scene.render
        frame = cmd["frame"]
        out_dir = cmd["output_dir"]
        threads = cmd.get("threads")
        tile = cmd.get("tile")

        # Threads: explicit count, or back to the scene's own setting.
        if threads is None:
            r.threads_mode, r.threads = self.orig_threads[0], self.orig_threads[1]
        else:
            r.threads_mode = "FIXED"
            r.threads = threads

        # Border.
        if tile is None:
            r.use_border = False
        else:
            border = [float(v) for v in tile["border"]]
            size = tile["size"]
            want = tile["frame"]
            have = [r.resolution_x * r.resolution_percentage // 100,
                    r.resolution_y * r.resolution_percentage // 100]
            if have != want:
                raise CommandError("render: tile frame is %dx%d but the scene renders %dx%d"
                                   % (want[0], want[1], have[0], have[1]))
            r.use_border = True
            r.use_crop_to_border = True
            r.border_min_x, r.border_max_x, r.border_min_y, r.border_max_y = border

        expected = [r.resolution_x * r.resolution_percentage // 100,
                    r.resolution_y * r.resolution_percentage // 100]
        if tile is not None:
            expected = size

        # Output path: frame_path expands '#' and adds the extension; write_still
        # writes render.filepath literally.
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise CommandError("render: cannot create output_dir %s: %s" % (out_dir, e.strerror or e))
        r.filepath = os.path.join(out_dir, "frame_####")
        path = scene.render.frame_path(frame=frame)
        r.filepath = path
        if os.path.lexists(path):
            try:
                os.remove(path)  # never report a stale file as this render's output
            except OSError as e:
                raise CommandError("render: cannot replace %s: %s" % (path, e.strerror or e))
        # Every other output of the scene (compositor File Output nodes) goes
        # into the task's folder too.
        passes_dir = os.path.join(out_dir, "passes")
        self.outputs.point_into(passes_dir)
        before = list_files(passes_dir)

        t0 = time.monotonic()
        scene.frame_set(frame)
        if self.tee is not None:
            self.tee.start_command(cmd_id)
        samples = None
        try:
            if self.fail_renders:
                msg = ("Error: CUDA error: Launch failed in cuCtxSynchronize() "
                       "(simulated by the worker's --fail-first-render, for tests)")
                print(msg, flush=True)
                raise CommandError("render failed: " + msg)
            result = bpy.ops.render.render(write_still=True)
        except RuntimeError as e:
            msg = " ".join(str(e).split())
            raise CommandError("render failed: %s" % msg)
        finally:
            if self.tee is not None:
                samples = self.tee.end_command()
        seconds = time.monotonic() - t0
        if "FINISHED" not in result:
            raise CommandError("render failed: operator returned %s" % ",".join(sorted(result)))
        try:
            st = os.stat(path)
        except OSError:
            raise CommandError("render finished but %s was not written (see Blender's stdout)" % path)
        if st.st_size == 0:
            raise CommandError("render finished but %s is empty" % path)
        try:
            w, h = image_size(path)
        except Exception as e:
            raise CommandError("cannot read the size of %s: %s" % (path, e))
        passes = [{"name": name, "path": os.path.join(passes_dir, name)}
                  for name in sorted(list_files(passes_dir) - before)]
        return {"event": "done", "id": cmd_id, "path": path, "width": w, "height": h,
                "expected": expected, "engine": r.engine,
                "samples_done": None if samples is None else samples[0],
                "samples_total": None if samples is None else samples[1],
                "counted": self.tee is not None,
                "passes": passes, "seconds": round(seconds, 4)}

    def serve(self, stdin):
        while True:
            line = stdin.readline()
            if not line:
                return  # EOF
            line = line.strip()
            if not line:
                continue
            cmd_id = None
            try:
                cmd = parse_command(line)
                if cmd["cmd"] == "quit":
                    return
                cmd_id = cmd["id"]
                reply = self.render(cmd)
            except CommandError as e:
                reply = {"event": "error", "id": cmd_id if e.cmd_id is None else e.cmd_id,
                         "error": str(e)}
            except Exception as e:
                traceback.print_exc()
                msg = " ".join(("%s: %s" % (type(e).__name__, e)).split())
                reply = {"event": "error", "id": cmd_id, "error": msg}
            finally:
                try:
                    sys.stdout.flush()
                except Exception:
                    pass
            self.replier.send(reply)


def use_gpu(kind):
    """Cycles device preferences for a GPU slot.

    Blender's own `--cycles-device` picks the device type, but enables every
    device of that type; the worker has already narrowed CUDA/OptiX to the
    slot's GPU with CUDA_VISIBLE_DEVICES, and here only devices of `kind` are
    enabled, the CPU is left out, and the scene renders on the GPU. Setting
    `scene.cycles.device = 'GPU'` with no usable device would silently render
    on the CPU, so that case is an error, worded as Blender words it.
    """
    prefs = bpy.context.preferences.addons["cycles"].preferences
    prefs.compute_device_type = kind
    prefs.refresh_devices()
    found = [d for d in prefs.devices if d.type == kind]
    if not found:
        print("Error: Found no Cycles device of the specified type (%s)" % kind, flush=True)
        sys.exit(1)
    for d in prefs.devices:
        d.use = d.type == kind
    for scene in bpy.data.scenes:
        scene.cycles.device = "GPU"


def remap_into_root(args):
    """Rewrites the scene's absolute references into the job root (remap.py,
    written beside this script by the worker). Returns the root and what could
    not be remapped."""
    if not args.job_root:
        return None, []
    root = os.path.normpath(os.path.abspath(args.job_root))
    mapping = {}
    if args.mappings:
        with open(args.mappings, encoding="utf-8") as f:
            mapping = json.load(f)
    if not mapping:
        return root, []
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import remap  # noqa: E402 (beside this script, with deps.py)
    return root, remap.remap(root, mapping)


def open_scene(args):
    """A --spare session's first step: read the `open` command on stdin and
    load its scene as the command line would have (`SCENE.blend` before
    `--python`, or bpy_run.py's `--scene`): stored Python runs only when
    `scene_python` is true. What the command names joins `args`. A line that
    is not a readable `open`, or a file Blender cannot read, ends the process
    with exit status 1 and the error on stdout, as a failed load does."""
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)  # the worker closed the spare unused
    try:
        cmd = parse_command(line.strip(), allowed=("open",))
    except CommandError as e:
        print("Error: a spare session's first line must be `open`: %s" % e, flush=True)
        os._exit(1)
    args.job_root = cmd.get("job_root")
    args.mappings = cmd.get("mappings")
    try:
        bpy.ops.wm.open_mainfile(filepath=cmd["scene"], load_ui=False,
                                 use_scripts=cmd["scene_python"])
    except RuntimeError as e:
        msg = " ".join(str(e).split())
        print("Error: Cannot read file '%s': %s" % (cmd["scene"], msg), flush=True)
        os._exit(1)


def main():
    args = parse_args()
    if args.spare:
        open_scene(args)
    if args.cycles_device in ("CUDA", "OPTIX"):
        use_gpu(args.cycles_device)
    replier = Replier(args.reply_fd)
    tee = None if args.no_progress else StdoutTee(replier)
    try:
        root, problems = remap_into_root(args)
        session = Session(replier, tee, fail_renders=args.fail_first_render)
        skipped = bpy.app.autoexec_fail_message if bpy.app.autoexec_fail else None
        # Text blocks registered to run on load run only with auto-run on.
        scripts = [t.name for t in bpy.data.texts if t.use_module] if skipped is not None else []
        outside = outside_files(root) + [{"path": p, "missing": False} for p in problems]
        mark_output_end()
        replier.send({"event": "ready", "pid": os.getpid(), "blender": bpy.app.version_string,
                      "outside": outside, "newer": newer_file(),
                      "scripts_skipped": skipped or None, "scripts": scripts,
                      "engine": session.scene.render.engine,
                      # The real output size, for the worker's pixel limit.
                      "width": session.scene.render.resolution_x
                      * session.scene.render.resolution_percentage // 100,
                      "height": session.scene.render.resolution_y
                      * session.scene.render.resolution_percentage // 100})
        session.serve(sys.stdin)
    finally:
        if tee is not None:
            tee.close()
        try:
            os.close(args.reply_fd)
        except OSError:
            pass


main()
