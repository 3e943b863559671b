#!/usr/bin/env python3
"""Import circles between the workspace's Rust files: fails when one file
imports another that, through any chain of imports, imports it back.

An arrow A -> B is a `use` of an item of B's module, or a path through
B's module written in A's code (`crate::..`, `super::..`, `self::..`, or a
child module's name). Not arrows: `pub use` (a file handing names on, not
depending on them) and a module's use of an ancestor's items (`super::`:
what a child module sees of the module it sits in). Each crate is read
from its `src/`; tests, examples and benches are not.

In the crates of ROOT_ITEMS (the wgpu backend) a child's use of an item
the crate root defines in lib.rs itself is an arrow too: there lib.rs holds
the backend and its trait impl, which call into the launchers, so a
launcher reaching back for the backend would close a circle through the
nesting. A name lib.rs only hands on (`pub use`) resolves to the file that
defines it, and the files' `#[cfg(test)]` modules are not read (tests
drive the whole backend, as the crate's tests do). No launcher (LAUNCHERS)
may name the backend type at all: they take the device context.

Usage: scripts/import-circles.py [REPO]   (prints the circles and the
launchers naming the backend; exit 1 if any)
"""

import re
import sys
from pathlib import Path

CRATES = ["src", "backends/cpu/src", "backends/wgpu/src", "cli/src"]
ROOT_ITEMS = {"backends/wgpu/src"}
LAUNCHERS = ("backends/wgpu/src/ops", "WgpuBackend")
PATH = re.compile(r"(?<![\w:])([a-z_][a-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
COMMENT = re.compile(r"//[^\n]*")
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
ITEM = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum|fn|trait|const|static|type|union)\s+(\w+)",
    re.M,
)


def code(f: Path, strip_tests: bool):
    """A file's text without comments and, if asked, its test modules."""
    text = COMMENT.sub("", f.read_text())
    while strip_tests and (m := TEST_MOD.search(text)):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[: m.start()] + text[i:]
    return text


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


def root_names(mods):
    """What lib.rs defines itself, and what it hands on: name -> path."""
    text = code(mods[()], True)
    handed = {}
    for m in USE.finditer(text):
        if m.group(1) and m.group(1).strip() == "pub":
            for p in expand(m.group(2)):
                handed[p.split("::")[-1]] = p
    return set(ITEM.findall(text)), handed


def arrows(mods, root_items=False):
    edges = {m: set() for m in mods}
    defined, handed = root_names(mods) if root_items and () in mods else (set(), {})
    for here, f in mods.items():
        text = code(f, root_items)
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
            if to == () and here != ():
                # (the item the path names at the crate root, if it is one)
                segs = p.split("::")
                segs = segs[1:] if segs[0] == "crate" else segs
                segs = [x for x in segs if x not in ("super", "self")]
                name = segs[0] if segs else ""
                if name in defined:
                    edges[here].add(())
                    continue
                if name in handed:
                    to = resolve(mods, (), handed[name])
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
        for comp in circles(arrows(mods, crate in ROOT_ITEMS)):
            found += 1
            names = sorted(str(mods[m].relative_to(repo)) for m in comp)
            print("import circle: " + " <-> ".join(names))
    print(f"{found} import circle(s) between files")
    folder, name = LAUNCHERS
    named = 0
    for f in sorted((repo / folder).rglob("*.rs")):
        if re.search(rf"\b{name}\b", code(f, True)):
            named += 1
            print(f"{f.relative_to(repo)} names {name}: launchers take the device context")
    return 1 if found or named else 0


if __name__ == "__main__":
    sys.exit(main())
