#!/usr/bin/env python3
"""Checks that modules depend one way: no import circle among the top-level
modules of each crate (and among the add-on's modules), and no import from a
lower layer to a higher one where ARCHITECTURE.md gives a crate layers.

Modules are compared with their siblings, at every level: the top-level
modules of a crate (`coordinator/src/farm.rs` and everything under
`coordinator/src/farm/` are `farm`), the children of `model`, and so on.
Module A depends on its sibling B when a file of A names B by a path
(`crate::…`, `super::…`, `self::…`, in a `use` tree or in code). A module's own children and `#[cfg(test)]` files (`tests.rs`,
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


def parse_tree(text: str, i: int) -> tuple:
    """Parses a path tree at `i` (`a::b::{c, d::e}`); returns the paths it
    names (lists of segments) and where it ends."""
    m = re.match(r"\s*(" + IDENT + r"|\*)", text[i:])
    if not m:
        return [], i
    head, i = m.group(1), i + m.end()
    if text.startswith("::", i):
        i += 2
        if text.startswith("{", i):
            paths, i = parse_group(text, i)
        else:
            paths, i = parse_tree(text, i)
        return [[head] + p for p in paths], i
    return [[head]], i


def parse_group(text: str, i: int) -> tuple:
    """Parses `{tree, tree, ...}` at `i`."""
    paths, i = [], i + 1
    while i < len(text):
        sub, j = parse_tree(text, i)
        paths += sub
        m = re.match(r"\s*(?:as\s+" + IDENT + r")?\s*([,}])", text[j:])
        if not m:
            return paths, j
        i = j + m.end()
        if m.group(1) == "}":
            break
    return paths, i


def references(text: str, me: list) -> list:
    """Absolute module paths named in `text` by a file of module `me`."""
    out = []
    for m in re.finditer(r"\b(crate|(?:super::)+|self)::", text):
        if m.start() > 0 and text[m.start() - 1] == ":":
            continue
        start = m.group(1)
        if start == "crate":
            base = []
        elif start == "self":
            base = list(me)
        else:
            base = me[: len(me) - start.count("super")]
        j = m.end()
        if text.startswith("{", j):
            paths, _ = parse_group(text, j)
        else:
            paths, _ = parse_tree(text, j)
        out += [base + [s for s in p if s not in ("self", "*")] for p in paths]
    return out


def rust_edges(crate: str, src: Path) -> dict:
    """Edges between sibling modules, by parent: {parent: {a: {b: file}}}."""
    modules = set()
    for f in src.rglob("*.rs"):
        rel = f.relative_to(src)
        if "bin" in rel.parts[:1]:
            continue
        mp = tuple(module_path(rel))
        for k in range(1, len(mp) + 1):
            modules.add(mp[:k])
    graphs = {}
    for mod in modules:
        graphs.setdefault(mod[:-1], {}).setdefault(mod[-1], {})
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        if is_test_file(rel) or "bin" in rel.parts[:1]:
            continue
        me = module_path(rel)
        text = cfg_test_free(strip_comments(f.read_text()))
        for target in references(text, me):
            # The module it names: its longest prefix that is a module.
            while target and tuple(target) not in modules:
                target.pop()
            k = 0
            while k < min(len(me), len(target)) and me[k] == target[k]:
                k += 1
            if k < len(me) and k < len(target):
                graphs[tuple(me[:k])][me[k]].setdefault(target[k], str(rel))
    return graphs


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
    graphs = {}
    for c, p in CRATES.items():
        for parent, edges in sorted(rust_edges(c, p).items()):
            graphs["::".join((c,) + parent)] = edges
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
