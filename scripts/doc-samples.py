#!/usr/bin/env python3
"""Regenerates the command-output samples in docs/cli.md and docs/safetensors.md from real runs, or checks that
they still match (--check), so that the docs show what the program prints.

    scripts/doc-samples.py --gdskit build/ci/apps/gdskit/gdskit            # rewrite the samples in place
    scripts/doc-samples.py --gdskit build/ci/apps/gdskit/gdskit --check    # exit 1 and show the drift

A sample is a fenced block right after a marker naming its commands, separated by " ; ":

    <!-- sample: gdskit docter ; gdskit verify --jsn -->
    ```
    $ gdskit docter
    gdskit: unknown command 'docter'; did you mean 'doctor'?
    ...
    ```

The commands of a sample run one after the other in a fresh sandbox folder (HOME, XDG_CACHE_HOME and
XDG_RUNTIME_DIR inside it, no GDSKIT_* variables, stderr with stdout; its path reads as ~) that holds the files
the samples use: `model.safetensors` (four F32 tensors, as docs/safetensors.md describes), `cut.safetensors` (its
first 12 KiB), `notes.txt`, `data` (1 MiB of zeros) and a learned profile for `gdskit tune --show`. A command is
`gdskit ...` (leading VAR=value assignments allowed) or `ls ...`. Samples are only those that come out the same on
any machine without a GPU driver; what varies from run to run (times, rates, process ids, the sandbox's path, whether
io_uring is allowed) is compared in a normalised form, and a line whose normalised form did not change keeps
the text the doc has, so that rewriting changes nothing but real drift. On a machine with an NVIDIA driver
(libcuda.so.1) the samples cannot be reproduced: the script says so and exits 77.

Exit status: 0 the samples match (or were rewritten), 1 drift (--check), 2 usage, 77 skipped.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = ("docs/cli.md", "docs/safetensors.md")
MARKER = re.compile(r"^<!-- sample: (.+?) -->\s*$")

# What varies between runs, replaced before lines are compared: decimals followed by a unit of time or rate,
# process ids in verify's file name, and the io_uring answer (a container may forbid io_uring).
VOLATILE = [
    (re.compile(r"\b\d+\.\d+(?= ?(?:s|secs|us|usecs|GiB/s|GiB/sec|MiB/s)\b)"), "#.#"),
    (re.compile(r"gdskit-verify\.\d+\.dat"), "gdskit-verify.#.dat"),
    (re.compile(r"^io_uring: .*$"), "io_uring: #"),
]


def normalised(line: str) -> str:
    for pattern, repl in VOLATILE:
        line = pattern.sub(repl, line)
    return line


def f32(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def write_model(path: Path) -> None:
    """The 16 KiB file of docs/safetensors.md: f = arange(prod(shape)) / n, and ones for "norm"."""
    tensors = [
        ("embed.weight", [64, 32], f32([i / 7 for i in range(64 * 32)])),
        ("layers.0.w", [32, 32], f32([i / 11 for i in range(32 * 32)])),
        ("layers.1.w", [32, 32], f32([i / 13 for i in range(32 * 32)])),
        ("norm", [32], f32([1.0] * 32)),
    ]
    header, data = {}, b""
    for name, shape, raw in tensors:
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def write_learned(cache: Path) -> None:
    """A learned profile as a load on an NVMe disk leaves it, for `gdskit tune --show`."""
    folder = cache / "gdskit"
    folder.mkdir(parents=True, exist_ok=True)
    profile = {
        "version": 2,
        "device": {"key": "wwid=eui.00253856a1b2c3d4", "block": "nvme0n1"},
        "shapes": {
            "host-read": {"depth": 8, "request_bytes": 1 << 20, "gib_per_s": 5.82, "updated": "2026-12-03T10:14:07Z"},
            "staged-write": {"depth": 4, "request_bytes": 8 << 20, "gib_per_s": 3.1, "updated": "2026-12-03T10:15:42Z"},
        },
    }
    f = folder / "learned-nvme0n1-9f3c2a1b7d5e6f80.json"
    f.write_text(json.dumps(profile, indent=2) + "\n")
    f.chmod(0o644)


def sandbox(parent: str | None) -> Path:
    root = Path(tempfile.mkdtemp(prefix="gdskit-samples.", dir=parent))
    write_model(root / "model.safetensors")
    (root / "cut.safetensors").write_bytes((root / "model.safetensors").read_bytes()[:12288])
    (root / "notes.txt").write_text("These are notes, not tensors.\n")
    (root / "data").write_bytes(bytes(1 << 20))
    (root / "run").mkdir(mode=0o700)
    write_learned(root / ".cache")
    return root


def run(command: str, gdskit: str, root: Path) -> list[str]:
    words = shlex.split(command)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C", "LC_ALL": "C", "HOME": str(root),
           "XDG_CACHE_HOME": str(root / ".cache"), "XDG_RUNTIME_DIR": str(root / "run")}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not words or words[0] not in ("gdskit", "ls"):
        raise SystemExit(f"doc-samples: {command!r}: only gdskit and ls commands can be samples")
    if words[0] == "gdskit":
        words[0] = gdskit
    p = subprocess.run(words, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    return p.stdout.decode("utf-8", "backslashreplace").replace(str(root), "~").splitlines()


def regenerate(path: Path, gdskit: str, work: str | None) -> tuple[str, str]:
    """The doc's text and the text with every sample run again."""
    old = path.read_text()
    lines = old.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        m = MARKER.match(lines[i])
        i += 1
        if not m:
            continue
        if i >= len(lines) or lines[i].rstrip("\n") != "```":
            raise SystemExit(f"{path}:{i}: a sample marker must be followed by a ``` block")
        end = i + 1
        while end < len(lines) and lines[end].rstrip("\n") != "```":
            end += 1
        if end == len(lines):
            raise SystemExit(f"{path}:{i + 1}: the sample's block is not closed")
        before = [l.rstrip("\n") for l in lines[i + 1:end]]
        fresh: list[str] = []
        root = sandbox(work)  # one per sample: its commands see what the ones before them wrote
        try:
            for command in (c.strip() for c in m.group(1).split(" ; ")):
                fresh.append(f"$ {command}")
                fresh += run(command, gdskit, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        # Lines whose normalised form is unchanged keep the doc's text (its times and rates).
        kept = {}
        for line in before:
            kept.setdefault(normalised(line), line)
        fresh = [kept.get(normalised(line), line) for line in fresh]
        out.append("```\n")
        out += [line + "\n" for line in fresh]
        out.append("```\n")
        i = end + 1
    return old, "".join(out)


def driver_present(gdskit: str) -> bool:
    """Whether this machine has an NVIDIA driver (libcuda.so.1): the samples are those of one without."""
    p = subprocess.run([gdskit, "version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    return re.search(rb"^gpu: no \(libcuda\.so\.1 not found", p.stdout, re.M) is None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gdskit", required=True, help="the gdskit program to run")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent), help="the source tree")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a sample drifted")
    ap.add_argument("--work", help="where the sandbox folders go (default: the folder of the gdskit program: a file "
                    "system that takes O_DIRECT, as the samples' was; /tmp may be tmpfs)")
    a = ap.parse_args()
    gdskit = str(Path(a.gdskit).resolve())
    if not os.access(gdskit, os.X_OK):
        print(f"doc-samples: {a.gdskit}: not an executable gdskit", file=sys.stderr)
        return 2
    if driver_present(gdskit):
        print("doc-samples: skipped: the samples are those of a machine without an NVIDIA driver")
        return 77
    drift = False
    for rel in DOCS:
        path = Path(a.root) / rel
        old, new = regenerate(path, gdskit, a.work or str(Path(gdskit).parent))
        if old == new:
            continue
        if a.check:
            drift = True
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                                       f"{rel} (doc)", f"{rel} (program)"))
        else:
            path.write_text(new)
            print(f"rewrote the samples of {rel}")
    if drift:
        print("doc-samples: the docs' samples differ from what the program prints; run "
              "scripts/doc-samples.py --gdskit <program> to rewrite them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
