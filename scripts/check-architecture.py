#!/usr/bin/env python3
"""docs/ARCHITECTURE.md's code map is true (issue 56, item 5).

The "## Code map" section has one bullet a crate, opening with its folder's
name in backquotes (`gkq-format`, `fixtures`, `fuzz`, `xtask`). Fails,
naming what is wrong, when:
- a crate of the workspace has no bullet;
- a folder of a crate's src/ is not named in its bullet (`run/`, or a path
  through it, such as `quant/{mod,k}.rs`);
- a path its bullet names (a backquoted word ending in `.rs` or `/`, braces
  expanded) is no file or folder of the crate.
Prints one line and exits 0 when the map holds."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/ARCHITECTURE.md"


def crate_dirs():
    dirs = {p.name: p for p in (ROOT / "crates").iterdir() if (p / "Cargo.toml").exists()}
    for extra in ("fixtures", "fuzz", "xtask"):
        dirs[extra] = ROOT / extra
    return dirs


def bullets(text):
    """Crate folder name -> the text of its bullet."""
    section = text.split("## Code map", 1)[1].split("\n## ", 1)[0]
    out = {}
    for b in re.split(r"\n(?=- `)", "\n" + section):
        m = re.match(r"\s*- `([\w-]+)`", b)
        if m:
            out[m.group(1)] = out.get(m.group(1), "") + b
    return out


def expand(token):
    """`a/{b,c}.rs` -> [`a/b.rs`, `a/c.rs`] (nested braces too)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for alt in m.group(1).split(","):
        out += expand(token[: m.start()] + alt + token[m.end():])
    return out


def named_paths(bullet):
    paths = []
    for token in re.findall(r"`([^`\s]+)`", bullet):
        if token.endswith(".rs") or token.endswith("/") or token.endswith("/}"):
            paths += expand(token)
    return paths


def exists(crate, path):
    """A file or folder of the crate whose path ends with `path`."""
    path = path.rstrip("/")
    for p in crate.rglob(path.split("/")[-1]):
        if "target" in p.parts:
            continue
        if p.relative_to(crate).as_posix().endswith(path):
            return True
    return False


def main():
    text = DOC.read_text()
    marks = bullets(text)
    bad = []
    for name, crate in sorted(crate_dirs().items()):
        bullet = marks.get(name)
        if bullet is None:
            bad.append(f"{name}: no bullet in the code map")
            continue
        paths = named_paths(bullet)
        for p in paths:
            if not exists(crate, p):
                bad.append(f"{name}: the map names `{p}`, which is not in {crate.relative_to(ROOT)}")
        src = crate / "src"
        for d in sorted(x for x in src.rglob("*") if x.is_dir()):
            rel = d.relative_to(src).as_posix()
            inside = [p.removeprefix("src/").rstrip("/") for p in paths]
            if not any(p == rel or p.startswith(rel + "/") for p in inside):
                bad.append(f"{name}: the map does not name src/{rel}/")
    for b in bad:
        print(f"check-architecture: {b}")
    if bad:
        sys.exit(1)
    print(f"check-architecture: the code map names every source folder of {len(marks)} crates, and nothing gone")


main()
