"""Cycles' progress lines: how many samples of a frame are rendered.

Imported by session.py (the worker writes it beside the session script), and
run on its own by the worker's unit tests:

    python3 cycles_progress.py < lines     # one JSON [done, total] or null per line

Blender prints a status line for every progress update of Cycles, e.g.

    Fra:1 Mem:10M (Peak 10M) | Time:00:00.16 | Mem:0.9M, Peak:0.9M | Scene, ViewLayer | Sample 4/4

and, when the frame is larger than Cycles' tile size (`cycles.tile_size`,
2048 by default, with `use_auto_tile` on), the same with tiles:

    ... | Scene, ViewLayer | Rendered 3/12 Tiles, Sample 1/4

Cycles builds that text in Session::update_status_time (3.0 up to 5.0): an
optional `Rendered R/N Tiles, ` and then `Sample S/M`, with an optional device
status in brackets after it (`Sample 1/4 (Compiling kernels)`). Measured with
Blender 3.4.1 and 4.5.15: R counts the tiles finished, and S the samples of
the tile being rendered, or of the one that just finished. So at a tile's end
Cycles prints `Rendered k-1/N Tiles, Sample M/M` and at once
`Rendered k/N Tiles, Sample M/M`, then `Rendered k/N Tiles, Sample 1/M`; and
after the last tile it prints `Rendered N-1/N Tiles, Sample 0/M`.

Samples done over the frame are R*M + S while the tile is under way. A line
with S == M is ambiguous (tile R+1 just finished, or tile R was just counted),
so it counts R*M (M for R == 0, where only the first tile can have finished):
a lower bound, corrected by the next line. Callers keep the highest value of
a render, so progress never runs backwards.
"""

import json
import re
import sys

# "| Sample S/M" or "| Rendered R/N Tiles, Sample S/M": the bar keeps scene,
# layer or object names that contain these words from matching.
PROGRESS_RE = re.compile(rb"\| (?:Rendered (\d+)/(\d+) Tiles, )?Sample (\d+)/(\d+)")


def samples(match):
    """(done, total) samples over the whole frame for one PROGRESS_RE match,
    or None when the numbers cannot be progress."""
    rendered, tiles, sample, per_tile = match.groups()
    s, m = int(sample), int(per_tile)
    if m <= 0 or s > m:
        return None
    if tiles is None:
        return s, m
    r, n = int(rendered), int(tiles)
    if n <= 0 or r > n:
        return None
    done = r * m + s if s < m else max(r, 1) * m
    return min(done, n * m), n * m


def scan(text):
    """Every (done, total) in `text` (bytes), in order."""
    found = []
    for match in PROGRESS_RE.finditer(text):
        value = samples(match)
        if value is not None:
            found.append(value)
    return found


def main():
    for line in sys.stdin.buffer:
        values = scan(line)
        print(json.dumps(list(values[-1]) if values else None))


if __name__ == "__main__":
    main()
