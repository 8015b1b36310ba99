#!/usr/bin/env python3
"""How a file's space is prepared changes how fast parallel O_DIRECT writes go into it.

    python3 scripts/reserve-bench.py DIR [--gib 4] [--threads 1,2,4,8] [--request-mib 4] [--passes 2]

For each pass, each way of preparing the file (`ftruncate` to the final size: a hole; `fallocate`: reserved,
unwritten blocks, as gdskit's saves do; nothing: the writes grow the file) and each thread count, writes --gib GiB
of --request-mib MiB O_DIRECT requests into a new file in DIR, fdatasync included, and prints GiB/s. The first
pass on a fresh RAM-backed loop device also pays for allocating its backing pages; later passes do not.
"""

import argparse
import os
import sys

from bench_common import write_once


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="folder on the disk to measure (O_DIRECT must work there)")
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--request-mib", type=int, default=4)
    ap.add_argument("--passes", type=int, default=2)
    a = ap.parse_args()
    request = a.request_mib << 20
    nbytes = int(a.gib * 2**30) // request * request
    threads = [int(t) for t in a.threads.split(",")]
    path = os.path.join(a.dir, f"reserve-bench.{os.getpid()}.bin")
    print(f"{nbytes / 2**30:.1f} GiB of {a.request_mib} MiB O_DIRECT writes, fdatasync included, GiB/s")
    print(f"{'pass':>4} {'file':10} " + " ".join(f"{t:>3} thr" for t in threads))
    for p in range(a.passes):
        for prepare in ("ftruncate", "fallocate", "grown"):
            rates = [write_once(path, prepare, nbytes, t, request) for t in threads]
            print(f"{p:>4} {prepare:10} " + " ".join(f"{r:7.2f}" for r in rates), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
