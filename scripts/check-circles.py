#!/usr/bin/env python3
"""No circle of files within a crate (issues 43 and 56).

Each source file of a crate's src/ (its binaries' folders apart) is a
node. A path in a file (`crate::a::b::Item`, `super::Item`, `self::x::Y`,
a child module's `x::Y`, each path of a `use` tree) is an arrow to the file
that defines the item: the deepest module the path names, and where that
module only re-exports the item (`pub use`), the file the re-export names.
A `pub use` is a module's face, not a dependency, so it is no arrow
itself; nor is the `mod x;` that declares a file, nor a file's trailing
`#[cfg(test)]` module. Prints every set of files that reach each other (a
strongly connected component of more than one) with the arrows inside it,
and exits 1; prints one line and exits 0 when there is none."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ITEM = r"(?:fn|struct|enum|trait|type|const|static|mod|union|macro_rules!)"


def module_files(src):
    """Module path (a tuple) -> its file, for every file of the crate."""
    files = {}
    for p in sorted(src.rglob("*.rs")):
        parts = p.relative_to(src).parts
        if parts[0] == "bin":
            continue
        if parts[-1] in ("lib.rs", "main.rs") and len(parts) == 1:
            files[()] = p
        elif parts[-1] == "mod.rs":
            files[tuple(parts[:-1])] = p
        else:
            files[tuple(parts[:-1]) + (parts[-1].removesuffix(".rs"),)] = p
    return files


def source(p):
    """A file's text without its trailing #[cfg(test)] module or comments."""
    text = p.read_text()
    cut = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod \w+\s*\{", text, re.M)
    if cut:
        text = text[: cut.start()]
    return re.sub(r"//[^\n]*", "", text)


def use_paths(tree, prefix=""):
    """The paths of a `use` tree (`a::{b, c::{d, e}}`)."""
    tree = tree.strip()
    if not tree:
        return []
    if "{" not in tree:
        return [prefix + tree.split(" as ")[0].strip()]
    head, _, rest = tree.partition("{")
    body = rest[: rest.rfind("}")]
    out, depth, start = [], 0, 0
    for i, ch in enumerate(body + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            out += use_paths(body[start:i], prefix + head.strip())
            start = i + 1
    return out


def paths_of(text):
    """`(path, is a pub use)` for every path the text names."""
    found = []
    for m in re.finditer(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text, re.M):
        found += [(p, bool(m.group(1))) for p in use_paths(m.group(2))]
    rest = re.sub(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+[^;]+;", "", text, flags=re.M)
    found += [(m.group(0), False) for m in re.finditer(r"\b(?:crate|super|self)(?:::\w+)+", rest)]
    return found


def absolute(path, here, files):
    """The path's segments from the crate root, or None (another crate)."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        return segs[1:]
    base = list(here)
    if segs[0] in ("self", "super"):
        while segs and segs[0] in ("self", "super"):
            if segs.pop(0) == "super":
                if not base:
                    return None
                base.pop()
        return base + segs
    if tuple(base + segs[:1]) in files:
        return base + segs
    return None


def target(segs, files, depth=0):
    """The file that defines the item `segs` names."""
    n = len(segs)
    while n > 0 and tuple(segs[:n]) not in files:
        n -= 1
    mod = tuple(segs[:n])
    f = files[mod]
    if n == len(segs) or depth > 8:
        return f
    item = segs[n]
    text = source(f)
    if re.search(rf"\b{ITEM}\s+{re.escape(item)}\b", text):
        return f
    for path, public in paths_of(text):
        if not public:
            continue
        last = path.split("::")[-1]
        if last == item or last == "*":
            full = absolute(path, mod, files)
            if full is not None:
                if last == "*":
                    full = full[:-1] + [item]
                return target(full, files, depth + 1)
    return f


def arrows(files):
    graph = {f: {} for f in files.values()}
    for here, f in files.items():
        for path, public in paths_of(source(f)):
            if public:
                continue
            segs = absolute(path, here, files)
            if segs is None:
                continue
            t = target(segs, files)
            if t != f:
                graph[f].setdefault(t, set()).add(path)
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
    bad, nfiles = 0, 0
    crates = sorted(p for p in (ROOT / "crates").iterdir() if (p / "src").is_dir())
    for crate in crates + [ROOT / "xtask", ROOT / "fuzz"]:
        src = crate / "src"
        if not src.is_dir():
            continue
        files = module_files(src)
        if () not in files:
            continue
        nfiles += len(files)
        graph = arrows(files)
        for comp in circles(graph):
            bad += 1
            names = [str(p.relative_to(src)) for p in comp]
            print(f"{crate.name}: a circle of files: {', '.join(names)}")
            for a in comp:
                for b, what in sorted(graph[a].items()):
                    if b in comp:
                        print(
                            f"    {a.relative_to(src)} -> {b.relative_to(src)}"
                            f" ({', '.join(sorted(what))})"
                        )
    if bad:
        sys.exit(1)
    print(f"check-circles: no circle among {nfiles} files of {len(crates) + 2} crates")


main()
