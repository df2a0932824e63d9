#!/usr/bin/env python3
"""Where the time of one `tessera render` went, from its JSON log.

Usage: RUST_LOG=info tessera --log-format json render ... 2>LOG
       scripts/phases.py LOG [WALL_SECONDS]

Prints the phases of the run (set-up, scene loading in Blender, rendering,
results, stitching, shutdown) and, per slot, how long it rendered, loaded
and sat idle. WALL_SECONDS (the run's wall time, measured outside) closes
the last phase. Used by scripts/bench-tiles.sh.
"""
import datetime
import json
import sys


def when(stamp):
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main():
    events = []
    for line in open(sys.argv[1]):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        f = e.get("fields", {})
        span = e.get("span") or {}
        events.append((when(e["timestamp"]), f.get("message", ""), f, span))
    if not events:
        sys.exit("no JSON log lines: run with RUST_LOG=info and --log-format json")
    t0 = events[0][0]
    first = {}
    last = {}
    for t, msg, _, _ in events:
        first.setdefault(msg, t)
        last[msg] = t
    end = t0 + float(sys.argv[2]) if len(sys.argv) > 2 else events[-1][0]

    # Per lease: started, rendered, result received; per slot: Blender loads.
    started, rendered, received, slot_of, load_ms = {}, {}, {}, {}, {}
    for t, msg, f, span in events:
        lease = span.get("lease") or f.get("lease")
        if msg == "task started":
            started[f.get("lease", lease)] = t
        elif msg == "rendered in warm session" and lease:
            rendered[lease] = t
            slot_of[lease] = f.get("slot")
        elif msg == "task result received":
            received[f.get("lease")] = t
        elif msg == "Blender session started" and lease:
            load_ms[lease] = f.get("ms", 0) / 1000
            slot_of.setdefault(lease, f.get("slot"))

    def at(msg, default=None):
        return first.get(msg, default)

    # `tessera render` logs its first line before it reads the scene (a
    # Blender start when the scene or Blender is new to this machine, see
    # `fileset::trace_cached`), and another once that is done.
    read = at("scene and Blender runtimes read")
    rows = []
    if read is not None:
        rows.append(("scene read (a Blender start if it is new)", t0, read))
    rows += [
        ("farm start (coordinator, worker, submit)", read or t0, at("task started", t0)),
        ("Blender start + scene load (first task)", at("task started", t0), at("task started", t0) + max(load_ms.values(), default=0)),
    ]
    renders = [rendered[l] - started[l] - load_ms.get(l, 0) for l in rendered if l in started]
    results = [received[l] - rendered[l] for l in received if l in rendered]
    last_result = max(received.values(), default=end)
    stitched = last.get("frame stitched")
    if stitched:
        rows.append(("stitch (last result to frame stitched)", last_result, stitched))
    rows.append(("shutdown and delivery", stitched or last_result, end))
    print(f"  {'phase':<44}{'s':>7}")
    for name, a, b in rows:
        print(f"  {name:<44}{b - a:7.3f}")
    if renders:
        print(f"  {'render per task (mean of ' + str(len(renders)) + ')':<44}{sum(renders) / len(renders):7.3f}")
    if results:
        print(f"  {'render end to result stored (mean)':<44}{sum(results) / len(results):7.3f}")
    # Per slot: busy rendering, loading, and idle inside the render phase.
    slots = {}
    for lease, t in rendered.items():
        s = slot_of.get(lease)
        if lease in started:
            slots.setdefault(s, []).append((started[lease], t, load_ms.get(lease, 0)))
    span_start = at("task started", t0)
    span_end = last_result
    for s, tasks in sorted(slots.items(), key=lambda x: str(x[0])):
        busy = sum(b - a - l for a, b, l in tasks)
        load = sum(l for _, _, l in tasks)
        idle = (span_end - span_start) - busy - load
        print(f"  slot {s}: {len(tasks)} task(s), rendering {busy:.3f} s, loading {load:.3f} s, idle {idle:.3f} s")


main()
