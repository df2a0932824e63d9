#!/usr/bin/env python3
"""Checks that modules depend one way: no import circle among the top-level
modules of each crate (and among the add-on's modules), and no import from a
lower layer to a higher one where ARCHITECTURE.md gives a crate layers.

A module is a top-level module of a crate (`coordinator/src/job.rs` and
everything under `coordinator/src/job/` are `job`). Module A depends on B when
a file of A names `crate::B` (in a `use` tree or a path) or reaches B through
`super::`. A module's own children and `#[cfg(test)]` files (`tests.rs`,
`*_tests.rs`, `tests/`) do not count: tests may look anywhere.

Usage: scripts/check-modules.py [--graph]   (exit 1 on a circle or a breach)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Crate source roots, by name.
CRATES = {
    "coordinator": ROOT / "coordinator/src",
    "worker": ROOT / "worker/src",
    "cli": ROOT / "cli/src",
    "proto": ROOT / "proto/src",
}
ADDON = ROOT / "blender/addon/tessera"

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def is_test_file(rel: Path) -> bool:
    return (
        rel.name == "tests.rs"
        or rel.name.endswith("_tests.rs")
        or "tests" in rel.parts[:-1]
    )


def module_path(rel: Path) -> list:
    """`farm/leases.rs` -> ["farm", "leases"]; `lib.rs` -> []."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts.pop()
    return parts


def strip_comments(text: str) -> str:
    """Drops comments and empties string literals (which may hold `crate::`
    in messages), in one pass so that a `//` inside a string (a URL) is not
    taken for a comment, nor a `"` inside a comment for a string."""

    def keep(m):
        t = m.group(0)
        if t.startswith('"'):
            return '""'
        if t.startswith("'"):
            return "' '"
        return ""

    return re.sub(
        r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\\n])\'|//[^\n]*|/\*.*?\*/',
        keep,
        text,
        flags=re.S,
    )


def cfg_test_free(text: str) -> str:
    """Drops `#[cfg(test)] mod x { ... }` blocks written inline."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def heads_of_group(group: str) -> list:
    """The first identifier of each top-level item of a `{a::b, c, d::{e}}`."""
    heads, depth, item = [], 0, ""
    for ch in group:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if depth == 0 and ch == ",":
            heads.append(item)
            item = ""
        elif depth >= 0:
            item += ch
    heads.append(item)
    names = []
    for h in heads:
        m = re.match(r"\s*(" + IDENT + ")", h)
        if m and m.group(1) != "self":
            names.append(m.group(1))
    return names


def group_after(text: str, start: int) -> str:
    """The text of the brace group opening at `start`, without the braces."""
    depth, j = 0, start
    while j < len(text):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
        if depth == 0:
            break
    return text[start + 1 : j - 1]


def rust_edges(crate: str, src: Path) -> dict:
    tops = set()
    for f in src.rglob("*.rs"):
        mp = module_path(f.relative_to(src))
        if mp:
            tops.add(mp[0])
    edges = {t: {} for t in tops}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        if is_test_file(rel) or "bin" in rel.parts[:1]:
            continue
        mp = module_path(rel)
        if not mp:
            continue
        me = mp[0]
        text = cfg_test_free(strip_comments(f.read_text()))
        targets = []
        # crate::x and crate::{x, y}
        for m in re.finditer(r"\bcrate::(\{|" + IDENT + ")", text):
            if m.group(1) == "{":
                targets += heads_of_group(group_after(text, m.start(1)))
            else:
                targets.append(m.group(1))
        # super::super::x reaching a sibling of a top-level module
        for m in re.finditer(r"\b((?:super::)+)(\{|" + IDENT + ")", text):
            ups = m.group(1).count("super")
            # A file's own module is mp; `super` is its parent.
            base = mp[: len(mp) - ups]
            if base:
                continue  # stays inside the same top-level module
            if m.group(2) == "{":
                targets += heads_of_group(group_after(text, m.start(2)))
            else:
                targets.append(m.group(2))
        for t in targets:
            if t in tops and t != me:
                edges[me].setdefault(t, str(rel))
    return edges


def python_edges(pkg: Path) -> dict:
    mods = {f.stem for f in pkg.glob("*.py")}
    edges = {m: {} for m in mods}
    for f in sorted(pkg.glob("*.py")):
        text = f.read_text()
        me = f.stem
        for m in re.finditer(r"^\s*from\s+\.(" + IDENT + r")?\s+import\s+([^\n]+)", text, re.M):
            if m.group(1):
                names = [m.group(1)]
            else:
                names = [n.strip().split(" ")[0] for n in m.group(2).strip("()").split(",")]
            for t in names:
                if t in mods and t != me and not (me == "__init__"):
                    edges[me].setdefault(t, f.name)
    return edges


def cycles(edges: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layers(crate: str) -> dict:
    """Module -> layer number from ARCHITECTURE.md's `layers <crate>:` lines:
    `layers coordinator: model < store, blobs < farm < api, grpc`."""
    arch = ROOT / "ARCHITECTURE.md"
    if not arch.exists():
        return {}
    for line in arch.read_text().splitlines():
        m = re.match(r"\s*(?:<!--\s*)?layers\s+" + crate + r":\s*(.*?)\s*(?:-->)?\s*$", line)
        if m:
            out = {}
            for i, level in enumerate(m.group(1).split("<")):
                for name in level.split(","):
                    if name.strip():
                        out[name.strip()] = i
            return out
    return {}


def main() -> int:
    show = "--graph" in sys.argv
    bad = 0
    graphs = {c: rust_edges(c, p) for c, p in CRATES.items()}
    graphs["addon"] = python_edges(ADDON)
    for crate, edges in graphs.items():
        if show:
            for a in sorted(edges):
                print(f"{crate}: {a} -> {', '.join(sorted(edges[a])) or '-'}")
        for comp in cycles(edges):
            bad += 1
            print(f"error: import circle in {crate}: {' <-> '.join(comp)}")
            for a in comp:
                for b in comp:
                    if b in edges[a]:
                        print(f"  {a} -> {b} (in {edges[a][b]})")
        lv = layers(crate)
        for a in sorted(edges):
            for b, where in sorted(edges[a].items()):
                if a in lv and b in lv and lv[b] > lv[a]:
                    bad += 1
                    print(f"error: {crate}: {a} (lower layer) imports {b} (higher layer) in {where}")
    if bad:
        print(
            f"{bad} problem(s): make the lower module not name the higher one "
            "(move the shared piece down, or pass it in); see ARCHITECTURE.md",
            file=sys.stderr,
        )
        return 1
    print("modules: no import circle, no upward import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
