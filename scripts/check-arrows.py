#!/usr/bin/env python3
"""docs/ARCHITECTURE.md's crate map against `cargo metadata` (issue 43).

Each line `crate ──► a, b[features], …` of the map must list exactly the
crate's normal dependencies inside the workspace (short names: `format`
for gkq-format). A crate of the map without an arrow may use only crates
above it in the map ("nothing points up"). Prints what disagrees and
exits 1; prints one line and exits 0 when the map is true."""

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def the_map():
    text = (ROOT / "docs/ARCHITECTURE.md").read_text()
    text = text[text.index("An arrow points at") :]
    block = text.split("```", 2)[1]
    order, arrows = [], {}
    for line in block.splitlines():
        m = re.match(r"^\s*([a-z0-9-]+)\s", line)
        if not m:
            continue
        crate = m.group(1)
        order.append(crate)
        if "──►" in line:
            rest = line.split("──►", 1)[1]
            rest = re.split(r"\s{2,}|\s\(", rest.strip(), maxsplit=1)[0]
            rest = re.sub(r"\[[^\]]*\]", "", rest)
            arrows[crate] = {x.strip() for x in rest.split(",") if x.strip()}
    return order, arrows


def short(name):
    return name[4:] if name.startswith("gkq-") and name != "gkq-fuzz" else name


def workspace_deps():
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
            cwd=ROOT,
        )
    )
    names = {p["name"] for p in meta["packages"]}
    deps = {}
    for p in meta["packages"]:
        deps[p["name"]] = {
            short(d["name"])
            for d in p["dependencies"]
            if d["name"] in names and d.get("kind") is None
        }
    return deps


def main():
    order, arrows = the_map()
    deps = workspace_deps()
    wrong = []
    for crate in sorted(deps):
        if crate not in order:
            wrong.append(f"{crate}: not in the map")
            continue
        have = deps[crate]
        if crate in arrows:
            if arrows[crate] != have:
                missing = sorted(have - arrows[crate])
                extra = sorted(arrows[crate] - have)
                wrong.append(f"{crate}: the map misses {missing}, lists {extra} it does not use")
        else:
            above = {short(c) for c in order[: order.index(crate)]}
            up = sorted(have - above)
            if up:
                wrong.append(f"{crate}: uses {up}, not above it in the map")
    if wrong:
        print("check-arrows: docs/ARCHITECTURE.md's crate map is not what cargo metadata says:", file=sys.stderr)
        for w in wrong:
            print(f"  {w}", file=sys.stderr)
        return 1
    print(f"check-arrows: the crate map of docs/ARCHITECTURE.md matches cargo metadata ({len(deps)} crates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
