#!/usr/bin/env python3
"""The symbols libgdskit.so exports are the public API of include/gdskit, and nothing else.

    scripts/check-exports.py            check that cmake/gdskit.map matches the public headers
    scripts/check-exports.py --write    rewrite cmake/gdskit.map from the public headers
    scripts/check-exports.py --library build/x/libgdskit.so.0.1.0   also check what a built library exports
    scripts/check-exports.py --names    print the public names found

The map is made from the names declared at namespace scope in include/gdskit/*.hpp (classes, structs and
functions of namespaces gdskit, gdskit::safetensors and gdskit::kv; nested `detail` namespaces are left
out). Each name
becomes one pattern that takes its members, overloads and template instances, and each class its type
information and virtual table. Everything else stays local: the internal namespaces (engine, gpu, posix, shim,
formats, detail), the internal helpers of namespace gdskit, and the built-in copies of fmt, nlohmann-json and
liburing.

With --library, each defined dynamic symbol is demangled (c++filt) and must be one of the public names; a
symbol of an internal namespace, of fmt, nlohmann-json, liburing or CLI11 fails the check.
Exit status: 0 clean, 1 a mismatch (printed), 2 usage.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "cmake" / "gdskit.map"
PUBLIC_NAMESPACES = ("gdskit", "gdskit::safetensors", "gdskit::kv")
INTERNAL = re.compile(r"\bgdskit::(?:safetensors::|kv::)?(engine|gpu|posix|shim|formats|detail|tools|bench|doctor|patch|cli)::")
PRIVATE_DEPS = re.compile(r"^(fmt::|nlohmann::|io_uring_|__io_uring|CLI::)")

DECL_CLASS = re.compile(r"^(?:template\s*<.*>\s*)?(class|struct)\s+([A-Za-z_]\w*)\b(?!\s*;)")
DECL_FUNC = re.compile(r"^(?!using\b|typedef\b|enum\b|template\b|static_assert\b|#)[^=;(]*?\b([A-Za-z_]\w*)\s*\(")


def _code(line: str) -> str:
    """The line without // comments and string or character literals (enough for brace counting)."""
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])*'", "''", line)
    return line.split("//", 1)[0]


def public_names(include_dir: Path) -> dict[str, set[str]]:
    """{namespace: {names}} declared at namespace scope in the public headers (Google style: declarations
    of namespace scope start at column 0, members are indented)."""
    names: dict[str, set[str]] = {ns: set() for ns in PUBLIC_NAMESPACES}
    for header in sorted(include_dir.glob("*.hpp")):
        stack: list[str | None] = []  # namespace names; None for a class, enum or function body
        for raw in header.read_text(encoding="utf-8").splitlines():
            line = _code(raw)
            if not line.strip() or line[0].isspace():
                # Indented lines are members or bodies; their braces open and close within the block.
                continue
            opens, closes = line.count("{"), line.count("}")
            m = re.match(r"^(?:inline\s+)?namespace\s+([\w:]+)\s*\{", line)
            if m:
                stack.extend(m.group(1).split("::"))
                continue
            if line.startswith("}"):
                for _ in range(closes - opens):
                    if stack:
                        stack.pop()
                continue
            in_public = None not in stack and "::".join(s for s in stack if s) in PUBLIC_NAMESPACES
            if in_public:
                m = DECL_CLASS.match(line) or None
                if m:
                    names["::".join(stack)].add(m.group(2))
                elif (f := DECL_FUNC.match(line)) and not line.startswith(("}", "{")):
                    names["::".join(stack)].add(f.group(1))
            if opens > closes:
                stack.extend([None] * (opens - closes))
    return names


def opaque_members(include_dir: Path) -> dict[str, set[str]]:
    """{class name: {nested types only declared there}}: `struct impl;` inside a class is the class's
    private implementation, defined in src/, and stays local."""
    out: dict[str, set[str]] = {}
    for header in include_dir.glob("*.hpp"):
        current = None
        for line in header.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^(?:class|struct)\s+(\w+)[^;{]*\{", line)
            if m:
                current = m.group(1)
            elif line.startswith("};"):
                current = None
            elif current and (n := re.match(r"^\s+(?:struct|class)\s+(\w+)\s*;", line)):
                out.setdefault(current, set()).add(n.group(1))
    return out


def not_under(prefix: str, word: str) -> list[str]:
    """Glob patterns for the names that start with `prefix` and do not continue with `word::`. (ld's version
    scripts cannot write ':' in a set, so a longer member name `word...` is matched by its next character
    being part of a name; a member named `word` itself cannot exist beside the nested type `word`.)"""
    pats = [f"{prefix}{word[:i]}[!{word[i]}]*" for i in range(len(word))]
    pats.append(f"{prefix}{word}[_a-zA-Z0-9]*")
    return pats


def render_map(names: dict[str, set[str]], classes: set[str], opaque: dict[str, set[str]]) -> str:
    lines = [
        "/* The symbols libgdskit.so exports: the public API declared in include/gdskit, nothing else.",
        "   Generated by scripts/check-exports.py --write from the public headers; CI checks that it is current.",
        "   NAME[!_a-zA-Z0-9]* takes a name's members, overloads, ABI-tagged and template forms, and no longer",
        "   name that merely starts with it. */",
        "{",
        "  global:",
        '    extern "C++" {',
    ]
    for ns in PUBLIC_NAMESPACES:
        for name in sorted(names[ns]):
            hidden = sorted(opaque.get(name, ())) if f"{ns}::{name}" in classes else []
            if not hidden:
                lines.append(f"      {ns}::{name}[!_a-zA-Z0-9]*;")
            else:
                # Every member of the class but its opaque implementation type (a class that is not a template
                # has no symbol outside NAME::).
                if len(hidden) > 1:
                    raise SystemExit(f"check-exports: {ns}::{name} declares more than one opaque type: {hidden}")
                for pat in not_under(f"{ns}::{name}::", hidden[0]):
                    lines.append(f"      {pat};")
            if f"{ns}::{name}" in classes:
                for what in ("typeinfo for", "typeinfo name for", "vtable for"):
                    lines.append(f'      "{what} {ns}::{name}";')
    lines += ["    };", "  local:", "    *;", "};", ""]
    return "\n".join(lines)


def class_names(include_dir: Path) -> set[str]:
    out = set()
    for header in include_dir.glob("*.hpp"):
        text = header.read_text(encoding="utf-8")
        for m in re.finditer(r"^(?:class|struct)\s+(\w+)[^;{]*\{", text, re.M):
            for ns in PUBLIC_NAMESPACES:
                out.add(f"{ns}::{m.group(1)}")
    return out


def check_library(lib: Path, names: dict[str, set[str]], opaque: dict[str, set[str]]) -> list[str]:
    try:
        nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return [f"{lib}: nm failed: {e}"]
    raw = [line.split()[-1] for line in nm.stdout.splitlines() if line.strip()]
    demangled = subprocess.run(["c++filt"], input="\n".join(raw), capture_output=True, text=True,
                               check=True).stdout.splitlines()
    prefixes = tuple(f"{ns}::{n}" for ns in PUBLIC_NAMESPACES for n in names[ns])
    problems = []
    for sym in demangled:
        plain = re.sub(r"^(typeinfo name for|typeinfo for|vtable for) ", "", sym)
        if INTERNAL.search(plain.split("(")[0]) or PRIVATE_DEPS.match(plain) or any(
                plain.startswith(f"{ns}::{c}::{o}::") for ns in PUBLIC_NAMESPACES for c, os_ in opaque.items()
                for o in os_):
            problems.append(f"{lib.name} exports {sym}")
        elif plain.startswith("gdskit::") and not any(
                plain.startswith(p) and (len(plain) == len(p) or not (plain[len(p)].isalnum() or plain[len(p)] == "_"))
                for p in prefixes):
            problems.append(f"{lib.name} exports {sym}, which include/gdskit does not declare")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite cmake/gdskit.map")
    ap.add_argument("--names", action="store_true", help="print the public names")
    ap.add_argument("--library", type=Path, help="a built libgdskit.so to check")
    args = ap.parse_args()
    include_dir = ROOT / "include" / "gdskit"
    names = public_names(include_dir)
    if args.names:
        for ns in PUBLIC_NAMESPACES:
            for n in sorted(names[ns]):
                print(f"{ns}::{n}")
        return 0
    text = render_map(names, class_names(include_dir), opaque_members(include_dir))
    if args.write:
        MAP.write_text(text, encoding="utf-8")
        print(f"check-exports: wrote {MAP.relative_to(ROOT)} ({sum(len(v) for v in names.values())} public names)")
        return 0
    problems = []
    current = MAP.read_text(encoding="utf-8") if MAP.exists() else ""
    if current != text:
        problems.append("cmake/gdskit.map does not match include/gdskit: run scripts/check-exports.py --write")
    if args.library:
        problems += check_library(args.library, names, opaque_members(include_dir))
    for p in problems:
        print(f"check-exports: {p}", file=sys.stderr)
    if not problems:
        print("check-exports: the export map is the public API" + (f"; {args.library.name} exports nothing else"
                                                                   if args.library else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
