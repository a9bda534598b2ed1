#!/usr/bin/env python3
"""Fails when a unit test sits in a target that `cargo test` does not build.

Targets without unit tests carry `test = false` in their Cargo.toml, so that
`cargo test` compiles and links no empty harness for them (18 of them, about
a minute of a 2-core CI run). A `#[test]` or `#[cfg(test)]` added to such a
target later would never run: this names it, so that the flag is removed.
"""

import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_0-9]+)\s*;", re.M)
TEST = re.compile(r"#\[(?:tokio::)?test\b|#\[cfg\(test\)\]")


def module_files(root_file):
    """The root file and every file its `mod x;` declarations reach."""
    seen, todo = [], [root_file]
    while todo:
        f = todo.pop()
        if f in seen or not os.path.exists(f):
            continue
        seen.append(f)
        base = os.path.dirname(f)
        stem = os.path.splitext(os.path.basename(f))[0]
        if stem not in ("lib", "main", "mod"):
            base = os.path.join(base, stem)
        for name in MOD.findall(open(f, encoding="utf-8").read()):
            todo.append(os.path.join(base, name + ".rs"))
            todo.append(os.path.join(base, name, "mod.rs"))
    return seen


def untested_targets(manifest):
    """(kind, name, root file) of each target marked `test = false`."""
    pkg_dir = os.path.dirname(manifest)
    toml = tomllib.load(open(manifest, "rb"))
    lib = toml.get("lib", {})
    if lib.get("test") is False:
        yield "lib", toml["package"]["name"], os.path.join(pkg_dir, lib.get("path", "src/lib.rs"))
    for b in toml.get("bin", []):
        if b.get("test") is False:
            yield "bin", b["name"], os.path.join(pkg_dir, b["path"])


def main():
    manifests = []
    for top in ("crates", "fixtures", "fuzz", "xtask"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            if "target" in d.split(os.sep):
                continue
            if "Cargo.toml" in files:
                manifests.append(os.path.join(d, "Cargo.toml"))
    bad = []
    for m in sorted(manifests):
        for kind, name, root in untested_targets(m):
            for f in module_files(root):
                for n, line in enumerate(open(f, encoding="utf-8"), 1):
                    if TEST.search(line):
                        bad.append(f"{os.path.relpath(f, ROOT)}:{n}: a unit test in {kind} {name}, "
                                   f"which has test = false in {os.path.relpath(m, ROOT)}")
    for b in bad:
        print(f"check-test-targets: {b}", file=sys.stderr)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
