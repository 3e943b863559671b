#!/usr/bin/env python3
"""Import circles between the workspace's Rust files: fails when one file
imports another that, through any chain of imports, imports it back.

An arrow A -> B is a `use` of an item of B's module, or a path through
B's module written in A's code (`crate::..`, `super::..`, `self::..`, or a
child module's name). Not arrows: `pub use` (a file handing names on, not
depending on them) and a module's use of an ancestor's items (`super::`:
what a child module sees of the module it sits in). Each crate is read
from its `src/`; tests, examples and benches are not.

Usage: scripts/import-circles.py [REPO]   (prints the circles; exit 1 if any)
"""

import re
import sys
from pathlib import Path

CRATES = ["src", "backends/cpu/src", "backends/wgpu/src", "cli/src"]
PATH = re.compile(r"(?<![\w:])([a-z_][a-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
COMMENT = re.compile(r"//[^\n]*")


def modules(src: Path):
    """Module path (a tuple) -> file, for one crate."""
    out = {}
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("lib", "main", "mod"):
            parts = parts[:-1]
        if f.name == "main.rs" and (src / "lib.rs").exists():
            continue
        out[tuple(parts)] = f
    return out


def expand(tree: str):
    """The paths of a `use` tree: `a::{b, c::{d}}` -> a::b, a::c::d."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [re.sub(r"\bas\w+$", "", tree)]
    head, body = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    return [p for i in items if i for p in expand(head + i)]


def resolve(mods, here, path):
    """The module a path names an item of: its longest prefix that is a file."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            base = base[:-1] if segs[0] == "super" else base
            segs = segs[1:]
        rest = segs
    else:
        base, rest = here, segs
    for n in range(len(rest), -1, -1):
        if base + tuple(rest[:n]) in mods:
            return base + tuple(rest[:n])
    return None


def arrows(mods):
    edges = {m: set() for m in mods}
    for here, f in mods.items():
        text = COMMENT.sub("", f.read_text())
        paths = []
        for m in USE.finditer(text):
            if not m.group(1) or "pub(super)" in m.group(1) or "pub(crate)" in m.group(1):
                paths += expand(m.group(2))
        body = USE.sub("", text)
        for m in PATH.finditer(body):
            # (a bare first segment is a path only where it names a child module)
            if m.group(1) in ("crate", "super", "self") or here + (m.group(1),) in mods:
                paths.append(m.group(1) + m.group(2))
        for p in paths:
            to = resolve(mods, here, p)
            # (a child's use of an ancestor is the language's nesting)
            if to is not None and to != here and here[: len(to)] != to:
                edges[here].add(to)
    return edges


def circles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main():
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent.parent)
    found = 0
    for crate in CRATES:
        src = repo / crate
        if not src.is_dir():
            continue
        mods = modules(src)
        for comp in circles(arrows(mods)):
            found += 1
            names = sorted(str(mods[m].relative_to(repo)) for m in comp)
            print("import circle: " + " <-> ".join(names))
    print(f"{found} import circle(s) between files")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
