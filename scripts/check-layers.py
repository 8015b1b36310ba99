#!/usr/bin/env python3
"""Checks the layering of the tree from its own #include lines: no folder includes a folder above it.

    scripts/check-layers.py [--root DIR] [--graph]

The floors, lowest first (a folder may include its own floor's headers and any floor below; the public headers
in include/gdskit may be included from anywhere and include nothing but each other):

    common   errors, settings, log lines, JSON text, the escaping of outside text (printable)
    posix    the syscall seam, file system facts, bounded reads of untrusted files
    shim     dlopen of libcuda and libcufile with our own declarations
    engine   the transfer core: planner, scheduler, thread pool, io_uring, open files, batches, the staged
             pipeline; it reaches GPU memory only through the route interface (engine/transfer/route.hpp)
    gpu      buffers, copiers, the cuFile path: the routes the engine runs
    api, formats, kv   the public entry points (file handles, batches), safetensors and checkpoints, the KV
             block store: one floor, and none includes another
    -------- the installed library (gdskit::gdskit) ends here --------
    tools    what the CLI shares (shell_text, progress, signal_cleanup), verify, tune
    bench, doctor, patch   one tool each; none includes another
    apps     apps/gdskit, python/src, bench/, examples/, tests/ (anything may be included from here)

Beyond the floors: the library's floors never include <CLI/...> (the command-line parser belongs to the
tools), and include/gdskit never includes src/ headers, <cuda.h> or <cufile.h>.

An include written relative to its file ("../gpu/x.hpp") is judged by the folder it lands in. TEMPORARY lists
includes that break a rule and are being removed (empty now); each is printed on every run (so it stays
visible) but does not fail the check. An entry that no longer matches anything fails the check, so the
list cannot outlive the code it excuses. --graph prints the folder-to-folder include counts.
Exit status: 0 clean, 1 a violation (each printed as file:line with the rule), 2 usage.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

FLOORS = {
    "common": 1,
    "posix": 2,
    "shim": 3,
    "engine": 4,
    "gpu": 5,
    "api": 6,
    "formats": 6,
    "kv": 6,
    "tools": 7,
    "bench": 8,
    "doctor": 8,
    "patch": 8,
}
CORE_TOP = FLOORS["formats"]
APPS = 9

# (including file, included header) pairs excused while an include that breaks a rule is being removed.
TEMPORARY: set[tuple[str, str]] = set()

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCES = (".cpp", ".hpp", ".h", ".cc", ".inl")


def floor_of(rel: Path) -> tuple[str, int]:
    """The floor name and level of a file of the tree (relative path)."""
    parts = rel.parts
    if parts[0] == "include":
        return "include", 0
    if parts[0] == "src" and len(parts) > 2 and parts[1] in FLOORS:
        return parts[1], FLOORS[parts[1]]
    return parts[0] + "/", APPS


def scan(root: Path):
    files = []
    for top in ("include", "src", "apps", "python/src", "bench", "examples", "tests"):
        base = root / top
        if base.is_dir():
            files += sorted(p for p in base.rglob("*") if p.suffix in SOURCES and p.is_file())
    for path in files:
        rel = path.relative_to(root)
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as e:
            yield rel, 0, None, f"cannot read: {e.strerror}"
            continue
        for n, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if m:
                yield rel, n, (m.group(1), m.group(2)), None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--graph", action="store_true", help="print folder -> folder include counts")
    args = ap.parse_args()
    root = args.root.resolve()
    if not (root / "src").is_dir():
        print(f"check-layers: {root} has no src/ folder (--root names the source tree)", file=sys.stderr)
        return 2

    problems, excused, used = [], [], set()
    edges: Counter = Counter()
    for rel, line, inc, err in scan(root):
        if err:
            problems.append(f"{rel}: {err}")
            continue
        kind, name = inc
        src_floor, src_level = floor_of(rel)
        head = name.split("/")[0]
        where = f"{rel}:{line}"
        if kind == "<":
            if name.startswith("CLI/") and src_level <= CORE_TOP:
                problems.append(f"{where}: includes <{name}>: the command-line parser is the tools', not the library's")
            if src_floor == "include" and name in ("cuda.h", "cufile.h"):
                problems.append(f"{where}: includes <{name}>: the public headers never need CUDA's")
            continue
        if name.startswith("."):
            # A path relative to the including file ("../gpu/x.hpp"): judged by the folder it lands in.
            target = (root / rel.parent / name).resolve()
            try:
                inside = target.relative_to(root / "src").parts
            except ValueError:
                inside = ()
            if len(inside) > 1 and inside[0] in FLOORS:
                name = "/".join(inside)
                head = inside[0]
            else:
                continue
        if "/" not in name:
            continue  # a header next to this file: same floor
        if head == "gdskit":
            continue  # the public API (include/gdskit, and the generated version.hpp)
        if src_floor == "include":
            problems.append(f"{where}: includes \"{name}\": the public headers include only gdskit/...")
            continue
        if head not in FLOORS:
            continue  # a test's or a program's own folder
        dst_level = FLOORS[head]
        if src_floor != head:
            edges[(src_floor, head)] += 1
        bad = None
        if dst_level > src_level:
            bad = f"{src_floor} (floor {src_level}) includes {head} (floor {dst_level}), a floor above it"
        elif dst_level == src_level and src_floor != head and src_level < APPS:
            bad = f"{src_floor} includes {head}: folders on the same floor stay apart"
        if bad is None:
            continue
        key = (rel.as_posix(), name)
        if key in TEMPORARY:
            used.add(key)
            excused.append(f"{where}: {bad} (temporary exception, listed in scripts/check-layers.py)")
        else:
            problems.append(f"{where}: {bad}")

    for key in sorted(TEMPORARY - used):
        problems.append(f"{key[0]}: no longer includes {key[1]}: remove the temporary exception from "
                        "scripts/check-layers.py")
    if args.graph:
        for (a, b), n in sorted(edges.items(), key=lambda e: (FLOORS.get(e[0][0], APPS), e[0])):
            print(f"{a:>8} -> {b:<8} {n}")
    for e in excused:
        print(f"check-layers: allowed for now: {e}")
    for p in problems:
        print(f"check-layers: {p}", file=sys.stderr)
    if problems:
        print(f"check-layers: {len(problems)} include(s) break the layering (the floors are in "
              "scripts/check-layers.py and docs/architecture.md)", file=sys.stderr)
        return 1
    print("check-layers: no folder includes one above it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
