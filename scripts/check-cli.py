#!/usr/bin/env python3
"""Binaries own their command line (issue 56): no library crate depends on
clap, anyhow or indicatif, and no library source prints or parses flags.

- A package of crates/ without a binary target may not list clap, anyhow
  or indicatif among its [dependencies] (gkq-cli excepted: it is the
  binaries' shared command line, the flags a node takes among it).
- The files of every library target (src/lib.rs and the modules it
  declares, test modules aside) may not use clap or anyhow, nor print
  (print!, println!, eprint!, eprintln!, io::stdout, io::stderr).
- Every binary's main file is at most 200 lines.

Exits 1 naming each file and line that breaks a rule.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXEMPT = {"gkq-cli"}
CLI_DEPS = ("clap", "anyhow", "indicatif")
FORBIDDEN = [
    (re.compile(r"\bclap::|#\[derive\([^)]*\bParser\b"), "clap"),
    (re.compile(r"\banyhow\b"), "anyhow"),
    (re.compile(r"\b(e?print(ln)?)!\s*\("), "printing"),
    (re.compile(r"\bio::std(out|err)\b|\bstd(out|err)\(\)"), "printing"),
]
MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
TEST_ATTR = re.compile(r"#\[cfg\(test\)\]")


def dependencies(manifest: Path) -> list[str]:
    """Names in the [dependencies] table of a manifest."""
    names, section = [], None
    for line in manifest.read_text().splitlines():
        s = line.strip()
        if s.startswith("["):
            section = s
            continue
        if section == "[dependencies]" and "=" in s and not s.startswith("#"):
            names.append(s.split("=")[0].strip().split(".")[0])
    return names


def has_bin(crate: Path) -> bool:
    text = (crate / "Cargo.toml").read_text()
    return (crate / "src/main.rs").exists() or (crate / "src/bin").is_dir() or "[[bin]]" in text


def library_files(crate: Path) -> list[Path]:
    """src/lib.rs and every module it declares (not `#[cfg(test)]` ones)."""
    lib = crate / "src/lib.rs"
    if not lib.exists():
        return []
    out, todo = [], [lib]
    while todo:
        f = todo.pop()
        out.append(f)
        lines = f.read_text().splitlines()
        base = f.parent if f.name in ("lib.rs", "mod.rs") else f.with_suffix("")
        for i, line in enumerate(lines):
            m = MOD.match(line)
            if not m or (i > 0 and TEST_ATTR.search(lines[i - 1])):
                continue
            for cand in (base / f"{m.group(1)}.rs", base / m.group(1) / "mod.rs"):
                if cand.exists():
                    todo.append(cand)
                    break
    return out


def main() -> int:
    problems = []
    for crate in sorted((ROOT / "crates").iterdir()):
        if not (crate / "Cargo.toml").exists() or crate.name in EXEMPT:
            continue
        if not has_bin(crate):
            for d in dependencies(crate / "Cargo.toml"):
                if d in CLI_DEPS:
                    problems.append(f"{crate.name}/Cargo.toml: a library crate depends on {d}")
        for f in library_files(crate):
            # the item after #[cfg(test)], to its closing brace, is a test's
            skipping, depth = False, 0
            for n, line in enumerate(f.read_text().splitlines(), 1):
                code = line.split("//")[0]
                if TEST_ATTR.search(line):
                    skipping, depth = True, 0
                    continue
                if skipping:
                    depth += code.count("{") - code.count("}")
                    if depth <= 0 and ("}" in code or code.rstrip().endswith(";")):
                        skipping = False
                    continue
                if not code.strip():
                    continue
                for pattern, what in FORBIDDEN:
                    if pattern.search(code):
                        rel = f.relative_to(ROOT)
                        problems.append(f"{rel}:{n}: {what} in a library: {line.strip()}")
        mains = [crate / "src/main.rs", *sorted((crate / "src/bin").glob("*.rs")),
                 *sorted((crate / "src/bin").glob("*/main.rs"))]
        for m in mains:
            if m.exists() and len(m.read_text().splitlines()) > 200:
                n = len(m.read_text().splitlines())
                problems.append(f"{m.relative_to(ROOT)}: {n} lines, over 200 for a binary's main file")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
