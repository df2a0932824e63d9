"""End-to-end check of deps.py + remap.py on the make_asset_scenes.py cases.

Plain Python 3.10+ (standard library only), calls Blender:

    python3 tests/blender/check_file_sets.py [--work DIR] [--blender PATH] [CASE ...]

For each case it:
 1. builds the scene (make_asset_scenes.py) under WORK/orig/CASE;
 2. runs deps.py and checks that it lists exactly the expected files (members,
    missing, absolute_ref), and times it;
 3. renders the original directly (`blender -b SCENE -o REF/frame_#### -f F`);
 4. simulates the farm: copies the scene and every member into WORK/farm/CASE,
    mirroring the tree from the deepest common folder of the scene and all its
    files, builds the mapping {abs: new abs} for absolute references, and renames
    WORK/orig/CASE away so nothing can be read from the original place;
 5. renders the copy with render_remapped.py (remap.py + the mapping) and compares
    the pixels with step 3 (exactly equal, every frame);
 6. for cases with absolute references, renders the copy once more with an empty
    mapping: those pixels must differ, which shows the remap was needed and worked;
 7. checks the submit-time alternative: rewrite_library.py makes the absolute
    references of every file that holds one (the scene, and each `owner` in
    deps.py's output) relative, the copies replace those files in a second job
    root, and that root renders with NO mapping, pixel-equal to step 3.

Every case also checks that no file of the original tree changed (sha256 of
each file after the build and at the end). Prints one JSON line per case and a
Markdown table; exit 0 when every case passes.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The scripts under test are the ones the worker and the CLI ship.
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(HERE)), "blender")
sys.path.insert(0, HERE)
from check_png import read_png  # noqa: E402

KINDS_ABS = (["fonts/DejaVuSerif-Bold.ttf", "audio/beep.wav", "caches/mover.pc2"]
             + ["caches/cloth_b/436C6F746842_%06d_00.bphys" % i for i in (1, 2, 3)]
             + ["fluid_cache/config/config_%04d.uni" % i for i in (1, 2, 3)]
             + ["fluid_cache/data/fluid_data_%04d.vdb" % i for i in (1, 2, 3)])
KINDS_REL = (["clip/c_0001.png", "clip/c_0002.png", "strips/s_0001.png", "strips/s_0002.png"]
             + ["vdb/smoke_%04d.vdb" % i for i in (1, 2, 3)]
             + ["blendcache_scene/436C6F746841_%06d_00.bphys" % i for i in (1, 2, 3)])

# members / missing relative to the case folder; "abs": members referred to by absolute path
EXPECT = {
    "subfolder": {"members": ["tex/checker.png"], "abs": [], "frames": [1]},
    "absolute": {"members": ["elsewhere/wood.png"], "abs": ["elsewhere/wood.png"],
                 "frames": [1]},
    "library": {"members": ["lib/prop.blend", "lib/tex/bark.png", "shots/tex/grey.png"],
                "abs": [], "frames": [1]},
    "linked-absolute": {"members": ["lib/crate.blend", "assets/materials.blend",
                                    "textures/stone.png", "shots/tex/grey.png"],
                        "abs": ["lib/crate.blend", "assets/materials.blend",
                                "textures/stone.png"], "frames": [1]},
    "sequence": {"members": ["seq/frame_%04d.png" % i for i in (1, 2, 3)], "abs": [],
                 "frames": [1, 2, 3]},
    "udim": {"members": ["udim/tile.1001.png", "udim/tile.1002.png"], "abs": [],
             "frames": [1]},
    "missing": {"members": [], "missing": ["tex/not_there.png"], "abs": [], "frames": [1]},
    "many": {"members": ["many/f_%04d.png" % i for i in range(1, 2001)], "abs": [],
             "frames": [1, 2000]},
    "nested": {"members": ["lib/deep/prop.blend", "assets/mats.blend", "assets/tex/rock.png"],
               "abs": [], "frames": [1]},
    "kinds": {"members": KINDS_REL + KINDS_ABS, "abs": KINDS_ABS, "frames": [1, 3]},
    # The shot links only objects: the sound, clip and the "Edit" scene's strip stay behind.
    "linked-kinds": {"members": ["lib/scene.blend"] + [
        "lib/" + p for p in KINDS_REL + KINDS_ABS
        if not p.startswith(("audio/", "clip/", "strips/"))],
        "abs": ["lib/" + p for p in KINDS_ABS if not p.startswith("audio/")], "frames": [1, 3]},
}


def run(cmd, log):
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    return rc, time.monotonic() - t0


def blender_cmd(blender, *args):
    return [blender, "-b"] + list(args)


def check_deps(case, case_dir, data):
    """Compare deps.py's JSON with EXPECT; return a list of differences."""
    exp = EXPECT[case]
    rel = lambda p: os.path.relpath(p, case_dir)  # noqa: E731
    members = sorted(rel(m) for f in data["files"] for m in f["members"])
    missing = sorted(rel(m) for f in data["files"] for m in f["missing"])
    absolute = sorted(rel(m) for f in data["files"] if f["absolute_ref"] for m in f["members"])
    errs = []
    if members != sorted(exp["members"]):
        errs.append("members %s != %s" % (members[:6], sorted(exp["members"])[:6]))
    if missing != sorted(exp.get("missing", [])):
        errs.append("missing %s != %s" % (missing, exp.get("missing", [])))
    if absolute != sorted(exp["abs"]):
        errs.append("absolute_ref %s != %s" % (absolute, exp["abs"]))
    if data["version"] != 1 or data["engine"] != "CYCLES" or data["denoise"] is not False:
        errs.append("header %r" % {k: data[k] for k in ("version", "engine", "denoise")})
    return errs


def tree_digest(folder):
    """{relative path: sha256} of every file below folder."""
    out = {}
    for dirpath, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def same_pixels(a, b):
    pa, pb = read_png(a), read_png(b)
    return pa == pb


def check_rewrite(case, data, scene, common, files, frames, ref_dir, farm, logs, blender,
                  away, orig, empty_map):
    """Step 7; runs while the original tree is renamed away, so rewrite_library.py is run
    on the files at `away` (the same tree under another name: every reference it
    rewrites becomes relative, and relative paths do not care about the name)."""
    holders = {scene} | {f["owner"] for f in data["files"]
                         if f["absolute_ref"] and f["owner"]}
    if not any(f["absolute_ref"] and not f["owner"] for f in data["files"]):
        holders.discard(scene)
    root = os.path.join(farm, "root-rewritten")
    for src in files:
        dst = os.path.join(root, os.path.relpath(src, common))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src.replace(orig, away, 1), dst)
    # Absolute references still name the original tree: give it back while rewriting.
    os.rename(away, orig)
    try:
        for n, holder in enumerate(sorted(holders)):
            only = os.path.join(farm, "only.json")
            json.dump([f["abs"] for f in data["files"] if f["absolute_ref"]], open(only, "w"))
            tmp = os.path.join(farm, "rewritten-%d.blend" % n)
            rc, _ = run(blender_cmd(blender, holder, "--python-exit-code", "3", "--python",
                                    os.path.join(SHIPPED, "rewrite_library.py"), "--", "--out", tmp,
                                    "--only", only), os.path.join(logs, "rewrite-%d.log" % n))
            if rc != 0:
                return False
            shutil.copyfile(tmp, os.path.join(root, os.path.relpath(holder, common)))
    finally:
        os.rename(orig, away)
    out = os.path.join(farm, "out-rewritten")
    probs = os.path.join(farm, "problems-rewritten.json")
    job_scene = os.path.join(root, os.path.relpath(scene, common))
    rc, _ = run(blender_cmd(blender, job_scene, "--python-exit-code", "3", "--python",
                            os.path.join(HERE, "render_remapped.py"), "--", "--root", root,
                            "--map", empty_map, "--out", out, "--frames",
                            ",".join(map(str, frames)), "--problems", probs),
                os.path.join(logs, "rewritten.log"))
    if rc != 0 or json.load(open(probs)):
        return False
    return all(same_pixels(os.path.join(ref_dir, "frame_%04d.png" % fr),
                           os.path.join(out, "frame_%04d.png" % fr)) for fr in frames)


def check_case(case, work, blender):
    orig = os.path.join(work, "orig", case)
    away = orig + ".away"
    farm = os.path.join(work, "farm", case)
    logs = os.path.join(work, "logs", case)
    for d in (orig, away, farm, logs):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(logs)
    result = {"case": case}

    # 1. build
    rc, _ = run(blender_cmd(blender, "--factory-startup", "--python-exit-code", "2", "--python",
                            os.path.join(HERE, "make_asset_scenes.py"), "--", "--dir", orig,
                            "--case", case), os.path.join(logs, "build.log"))
    if rc != 0:
        return dict(result, ok=False, why="build failed (rc %d)" % rc)
    scene = [ln.split("scene=", 1)[1].strip() for ln in open(os.path.join(logs, "build.log"))
             if ln.startswith("make_asset_scenes:")][0]
    before = tree_digest(orig)

    # 2. deps
    deps_json = os.path.join(logs, "deps.json")
    rc, secs = run(blender_cmd(blender, scene, "--python-exit-code", "3", "--python",
                               os.path.join(SHIPPED, "deps.py"), "--", "--out", deps_json),
                   os.path.join(logs, "deps.log"))
    if rc != 0:
        return dict(result, ok=False, why="deps.py failed (rc %d)" % rc)
    walk = [ln for ln in open(os.path.join(logs, "deps.log")) if ln.startswith("deps.py:")]
    result["deps_wall_s"] = round(secs, 2)
    result["deps_walk_s"] = float(walk[0].split("walked in ")[1].split(" s")[0]) if walk else None
    data = json.load(open(deps_json))
    errs = check_deps(case, orig, data)
    result["deps_ok"] = not errs
    if errs:
        result["deps_errors"] = errs

    # 3. direct render of the original
    frames = EXPECT[case]["frames"]
    ref_dir = os.path.join(work, "ref", case)
    shutil.rmtree(ref_dir, ignore_errors=True)
    rc, _ = run(blender_cmd(blender, scene, "-o", os.path.join(ref_dir, "frame_####"),
                            "-f", ",".join(map(str, frames))), os.path.join(logs, "ref.log"))
    if rc != 0:
        return dict(result, ok=False, why="reference render failed (rc %d)" % rc)

    # 4. the farm's job root: mirror from the deepest common folder
    files = [scene] + [m for f in data["files"] for m in f["members"]]
    everything = files + [m for f in data["files"] for m in f["missing"]]
    common = os.path.commonpath([os.path.dirname(p) for p in everything])
    root = os.path.join(farm, "root")
    for src in files:
        dst = os.path.join(root, os.path.relpath(src, common))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
    mapping = {f["abs"]: os.path.join(root, os.path.relpath(f["abs"], common))
               for f in data["files"] if f["absolute_ref"]}
    map_path = os.path.join(farm, "map.json")
    json.dump(mapping, open(map_path, "w"), indent=1)
    empty_map = os.path.join(farm, "empty.json")
    json.dump({}, open(empty_map, "w"))
    job_scene = os.path.join(root, os.path.relpath(scene, common))
    result["files_copied"] = len(files)
    result["mapping"] = len(mapping)

    os.rename(orig, away)  # Blender must not find anything at the original place
    try:
        # 5. remapped render
        out = os.path.join(farm, "out")
        probs = os.path.join(farm, "problems.json")
        rc, secs = run(blender_cmd(blender, job_scene, "--python-exit-code", "3", "--python",
                                   os.path.join(HERE, "render_remapped.py"), "--", "--root", root,
                                   "--map", map_path, "--out", out, "--frames",
                                   ",".join(map(str, frames)), "--problems", probs),
                       os.path.join(logs, "farm.log"))
        if rc != 0:
            return dict(result, ok=False, why="farm render failed (rc %d)" % rc)
        result["remap_problems"] = json.load(open(probs))
        equal = []
        for fr in frames:
            a = os.path.join(ref_dir, "frame_%04d.png" % fr)
            b = os.path.join(out, "frame_%04d.png" % fr)
            equal.append(os.path.exists(b) and same_pixels(a, b))
        result["pixels_equal"] = all(equal)

        # 6. control without remapping
        if mapping:
            out0 = os.path.join(farm, "out-noremap")
            run(blender_cmd(blender, job_scene, "--python-exit-code", "3", "--python",
                            os.path.join(HERE, "render_remapped.py"), "--", "--root", root,
                            "--map", empty_map, "--out", out0, "--frames", str(frames[0])),
                os.path.join(logs, "noremap.log"))
            a = os.path.join(ref_dir, "frame_%04d.png" % frames[0])
            b = os.path.join(out0, "frame_%04d.png" % frames[0])
            result["control_differs"] = not (os.path.exists(b) and same_pixels(a, b))

            # 7. rewritten copies instead of a mapping
            result["rewrite_equal"] = check_rewrite(case, data, scene, common, files, frames,
                                                    ref_dir, farm, logs, blender, away, orig,
                                                    empty_map)
    finally:
        os.rename(away, orig)

    result["originals_untouched"] = tree_digest(orig) == before
    ok = result["originals_untouched"] and result["deps_ok"] and result["pixels_equal"] and not result["remap_problems"] \
        and result.get("control_differs", True) and result.get("rewrite_equal", True)
    return dict(result, ok=ok)


def main():
    p = argparse.ArgumentParser(prog="check_file_sets.py")
    p.add_argument("--work", default="/tmp/tessera-file-sets")
    p.add_argument("--blender", default="blender")
    p.add_argument("cases", nargs="*", default=list(EXPECT))
    args = p.parse_args()
    work = os.path.abspath(args.work)
    results = []
    for case in args.cases:
        t0 = time.monotonic()
        r = check_case(case, work, args.blender)
        r["total_s"] = round(time.monotonic() - t0, 1)
        results.append(r)
        print(json.dumps(r), flush=True)
    print()
    print("| case | deps.py lists | deps.py wall (walk) | copied / mapped | remap problems "
          "| pixels equal | control w/o remap differs | rewritten copies equal | result |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print("| %s | %s | %s s (%s s) | %s / %s | %s | %s | %s | %s | %s |" % (
            r["case"], "exact" if r.get("deps_ok") else r.get("deps_errors", "-"),
            r.get("deps_wall_s", "-"), r.get("deps_walk_s", "-"), r.get("files_copied", "-"),
            r.get("mapping", "-"), len(r.get("remap_problems", [])) or "none",
            r.get("pixels_equal", "-"), r.get("control_differs", "n/a"),
            r.get("rewrite_equal", "n/a"), "PASS" if r["ok"] else "FAIL: %s" % r.get("why", "")))
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
