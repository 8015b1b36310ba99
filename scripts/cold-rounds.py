#!/usr/bin/env python3
"""Cold reads in alternating rounds: raw O_DIRECT cells and gdskit variants measured one after another, so a
machine whose rate wanders is seen by all of them alike, and medians instead of the best single sample.

    python3 scripts/cold-rounds.py FILE [--bin build/release] [--size-gib 3] [--rounds 3] [-x staged|host]
        [--cells 4x1,2x2,2x4,8x1,4x4] [--pinned 2x2,4x2] [--profiles DIR]

FILE is created (random bytes) when missing. Each round reads the whole file once per raw cell (T dd streams
of R MiB O_DIRECT requests, each its own slice) and once per gdskit variant (`gdskit bench -f FILE -w 1 -s SIZE
-i 1G -x X -I 0 --cold`): the learned profile in --profiles (the first process there learns it), a fresh search
with GDSKIT_LEARN=off, and each --pinned shape (GDSKIT_DIRECT_DEPTH and GDSKIT_STAGING_SLOT_BYTES, or
GDSKIT_CHUNK_BYTES for -x host). The page cache is dropped before every read. Prints each round, then per row
the median and every sample, then each gdskit row's median over the best raw median.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_common import cells_of

MIB = 1 << 20
GIB = 1 << 30


def compare_bench():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("compare_bench", os.path.join(here, "compare-bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--bin", default="build/release")
    ap.add_argument("--size-gib", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-x", dest="xfer", default="staged", choices=["staged", "host"])
    ap.add_argument("--cells", default="4x1,2x2,2x4,8x1,4x4", help="raw cells, THREADSxMIB")
    ap.add_argument("--pinned", default="2x2,4x2", help="gdskit shapes to pin, DEPTHxMIB")
    ap.add_argument("--profiles", help="profile folder for the learned row (default: a new temporary one)")
    a = ap.parse_args()
    cb = compare_bench()
    size = a.size_gib * GIB
    gdskit = os.path.join(a.bin, "apps/gdskit/gdskit")
    if not os.path.exists(a.file):
        cb.write_random(a.file, size)
    profiles = a.profiles or tempfile.mkdtemp(prefix="gdskit-rounds.")
    size_var = "GDSKIT_STAGING_SLOT_BYTES" if a.xfer == "staged" else "GDSKIT_CHUNK_BYTES"
    variants = {"gdskit learned": {"XDG_CACHE_HOME": profiles},
                "gdskit GDSKIT_LEARN=off": {"GDSKIT_LEARN": "off"}}
    for d, r in cells_of(a.pinned):
        variants[f"gdskit pinned {d}x{r}M"] = {"GDSKIT_LEARN": "off", "GDSKIT_DIRECT_DEPTH": str(d), size_var: f"{r}M"}
    rows, last_reason = {}, {}

    def bench(env):
        e = dict(os.environ)
        e.update(env)
        cb.drop_cache([a.file])
        p = subprocess.run([gdskit, "bench", "-f", a.file, "-w", "1", "-s", str(size), "-i", str(min(GIB, size)),
                            "-x", a.xfer, "--json", "-I", "0", "--cold"], env=e, capture_output=True, text=True)
        if p.returncode != 0:
            return None, p.stderr.strip()[-200:]
        r = json.loads(p.stdout)["results"][0]
        reasons = r["path"]["reasons"]
        schedule = [x for x in reasons if "O_DIRECT" in x or "adaptive" in x]
        return r["throughput_gib_s"], (schedule or reasons or ["-"])[-1]

    for k in range(a.rounds):
        for t, r in cells_of(a.cells):
            cb.drop_cache([a.file])
            rows.setdefault(f"raw {t}x{r}M", []).append(cb.dd_parallel(a.file, t, r * MIB, size))
        for name, env in variants.items():
            v, why = bench(env)
            rows.setdefault(name, []).append(v)
            last_reason[name] = why
        print(f"round {k}: " + ", ".join(f"{n} {v[-1]:.2f}" if v[-1] else f"{n} -" for n, v in rows.items()),
              flush=True)
    print("\nrow                          median   samples")
    med = {}
    for n, v in rows.items():
        got = [x for x in v if x]
        med[n] = statistics.median(got) if got else None
        shown = " ".join(f"{x:.2f}" for x in got)
        print(f"{n:28} {med[n]:7.2f}   {shown}" if got else f"{n:28}       -")
    raw = [m for n, m in med.items() if n.startswith("raw") and m]
    if raw:
        best = max(raw)
        print(f"\nbest raw median {best:.2f} GiB/s")
        for n, m in med.items():
            if n.startswith("gdskit") and m:
                print(f"  {n:28} {m / best:.3f} of it   ({last_reason[n]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
