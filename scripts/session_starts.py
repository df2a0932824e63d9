#!/usr/bin/env python3
"""Blender session starts in a worker's log, for the bench scripts that
compare this tree with a baseline run by run (bench-render-start.sh,
bench-job-switch.sh).

  session_starts.py record NAME SECONDS LOG   prints one run's line: NAME, its
      wall time, the median of the log's "Blender session started ... ms=",
      how many of those sessions were a spare Blender (spare=true), and how
      many there were
  session_starts.py table TIMES TITLE         prints the medians of the runs'
      lines in TIMES by name (new, baseline) and the ratio new / baseline
"""
import re
import statistics
import sys


def record(name, secs, log):
    starts = [l for l in open(log, errors="replace") if "Blender session started" in l]
    ms = [int(m.group(1)) for l in starts if (m := re.search(r" ms=(\d+)", l))]
    spares = sum("spare=true" in l for l in starts)
    print(name, secs, statistics.median(ms) if ms else "nan", spares, len(starts))


def table(times, title):
    runs = {"new": [], "baseline": []}
    for l in open(times):
        name, secs, ms, spares, sessions = l.split()
        runs[name].append((float(secs), float(ms), int(spares), int(sessions)))
    print(f"{title}: this tree (new) against the baseline, {len(runs['new'])} runs each, alternating")
    print(f"{'':10} {'wall s':>8} {'session ms':>11}  spare took the scene   walls")
    med = {}
    for name, rs in runs.items():
        med[name] = (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        took = f"{sum(r[2] for r in rs)}/{sum(r[3] for r in rs)}"
        walls = " ".join(f"{r[0]:.3f}" for r in rs)
        print(f"{name:10} {med[name][0]:8.3f} {med[name][1]:11.0f}  {took:<20} {walls}")
    (nw, nm), (bw, bm) = med["new"], med["baseline"]
    print(f"{'ratio':10} {nw / bw:8.2f} {nm / bm:11.2f}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "record":
        record(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "table":
        table(*sys.argv[2:])
    else:
        sys.exit(__doc__)
