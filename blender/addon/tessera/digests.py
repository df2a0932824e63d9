"""BLAKE3 digests of a job's files: by the `tessera` binary when found
(`tessera hash --stdin`: native speed, and the CLI's own hash cache), else by
the pure-Python fallback in blake3.py with a cache of its own keyed by path,
size and modification time. No bpy here: this runs in the upload thread.
"""

import json
import os
import shutil
import subprocess

from . import blake3
from .api import Cancelled, FarmError


def find_tessera(configured=""):
    """The `tessera` executable: the preference, $TESSERA_BIN, then $PATH."""
    for candidate in (configured, os.environ.get("TESSERA_BIN", "")):
        if candidate:
            path = os.path.expanduser(candidate)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return shutil.which("tessera")


def _cache_path():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tessera", "addon-hashes.json")


def _stamp(path):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _hash_python(paths, progress, cancelled):
    cache_file = _cache_path()
    try:
        with open(cache_file, encoding="utf-8") as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    out, changed = {}, False
    for p in paths:
        size, mtime = _stamp(p)
        known = cache.get(p)
        if known and known[0] == size and known[1] == mtime and mtime:
            out[p] = (known[2], size)
            if progress:
                progress(size)
            continue
        try:
            digest, size = blake3.hash_file(p, progress, cancelled)
        except InterruptedError:
            raise Cancelled() from None
        out[p] = (digest, size)
        cache[p] = [size, mtime, digest]
        changed = True
    if changed:
        try:
            os.makedirs(os.path.dirname(cache_file), exist_ok=True)
            tmp = cache_file + ".tmp%d" % os.getpid()
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(cache, f)
            os.replace(tmp, cache_file)
        except OSError:
            pass  # only costs speed next time
    return out


def _hash_tessera(exe, paths, progress, cancelled):
    proc = subprocess.Popen([exe, "hash", "--stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate("\n".join(paths).encode("utf-8") + b"\n")
    finally:
        if proc.poll() is None:
            proc.kill()
    if cancelled and cancelled():
        raise Cancelled()
    if proc.returncode != 0:
        raise FarmError("`%s hash` failed: %s" % (exe, err.decode("utf-8", "replace").strip()))
    result = {}
    for line in out.decode("utf-8").splitlines():
        r = json.loads(line)
        result[r["path"]] = (r["digest"], r["size"])
        if progress:
            progress(r["size"])
    return result


def hash_files(paths, tessera=None, progress=None, cancelled=None):
    """{path: (hex digest, size)} for every path; `tessera` is the binary or None."""
    paths = list(dict.fromkeys(paths))
    if tessera:
        return _hash_tessera(tessera, paths, progress, cancelled)
    return _hash_python(paths, progress, cancelled)


def describe(tessera):
    """How digests are computed, for the preferences."""
    if tessera:
        return "BLAKE3 by %s" % tessera
    return "BLAKE3 in pure Python (%.1f MB/s here): install `tessera` for native speed" % (
        blake3.speed(0.05) / 1e6)
