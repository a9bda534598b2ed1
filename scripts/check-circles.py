#!/usr/bin/env python3
"""No circle of files within a crate (issue 43, item 6).

For each crate under crates/, the top-level modules of its src/ (a file
`x.rs` or a folder `x/`, with what is below it) are the nodes, and a
`crate::x` reference in one module's files (in a path, or in a
`use crate::{…}` list) is an arrow to `x`. Prints every set of modules
that reach each other (a strongly connected component of more than one)
with the arrows inside it, and exits 1; prints one line and exits 0
when there is none."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def modules(src):
    mods = {}
    for p in sorted(src.rglob("*.rs")):
        top = p.relative_to(src).parts[0].removesuffix(".rs")
        if top not in ("lib", "main", "bin"):
            mods.setdefault(top, []).append(p)
    return mods


def arrows(mods, src):
    graph = {m: {} for m in mods}
    for m, paths in mods.items():
        for p in paths:
            text = p.read_text()
            names = re.findall(r"crate::(\w+)", text)
            for block in re.findall(r"use crate::\{([^;]*)\}", text, re.S):
                names += re.findall(r"(?:^|[,{\s])(\w+)(?=::|\s*[,}]|$)", block)
            for n in names:
                if n in mods and n != m:
                    graph[m].setdefault(n, set()).add(str(p.relative_to(src)))
    return graph


def circles(graph):
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main():
    bad = 0
    crates = sorted(p for p in (ROOT / "crates").iterdir() if (p / "src").is_dir())
    for crate in crates + [ROOT / "xtask", ROOT / "fuzz"]:
        src = crate / "src"
        if not src.is_dir():
            continue
        mods = modules(src)
        graph = arrows(mods, src)
        for comp in circles(graph):
            bad += 1
            print(f"{crate.name}: a circle of files: {', '.join(comp)}")
            for a in comp:
                for b, where in sorted(graph[a].items()):
                    if b in comp:
                        print(f"    {a} -> {b} ({', '.join(sorted(where))})")
    if bad:
        sys.exit(1)
    print(f"check-circles: no circle of files in {len(crates) + 2} crates")


main()
