#!/usr/bin/env python3
"""In-process load timing for gdskit.load_safetensors, measured the way the peer benchmark for fastsafetensors
measures (so the two compare): one untimed run first absorbs one-time initialisation (CUDA context, pinned
staging lanes) and checks sampled tensors against the file's bytes; then each timed run covers what a user does - call
the loader on the files, get every tensor on the device, synchronize - and GiB/s is the files' total bytes
(headers included) over those seconds, median of --runs.

    PYTHONPATH=build/release/python python3 scripts/load-bench.py CHECKPOINT [--device cuda:0] [--runs 3] \
        [--cold] [--warm]

CHECKPOINT is what gdskit.load_safetensors takes: a .safetensors file, an index or a folder, loaded with one
call (so reads flow across its shards).

Cold: before each run every file is fdatasync'ed and dropped from the page cache (posix_fadvise DONTNEED);
warm: every file is read once with read() first. Prints `gdskit load_cold <GiB/s> ...` and `gdskit load_warm
<GiB/s> ...` lines with the runs, the load's own statistics and the share of the files still cached before the
cold runs.
"""

import argparse
import mmap
import os
import statistics
import sys
import time

import torch

import gdskit

MIB = 1 << 20


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def prime_cache(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(64 * MIB):
            pass


def resident_fraction(path):
    """Share of the file's pages in the page cache (mincore), or None where unknown."""
    import ctypes
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        p = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if p is None or p == ctypes.c_void_p(-1).value:
            return None
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        ok = libc.mincore(ctypes.c_void_p(p), size, vec) == 0
        libc.munmap(ctypes.c_void_p(p), size)
        return sum(b & 1 for b in vec) / pages if ok else None
    finally:
        os.close(fd)


def check(files, tensors):
    """Three sampled tensors per file (first, middle, last) equal the file's bytes, read here with plain I/O."""
    import json
    import struct
    picked = 0
    for path in files:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
            names = list(header)
            for name in {names[0], names[len(names) // 2], names[-1]}:
                begin, end = header[name]["data_offsets"]
                f.seek(8 + n + begin)
                want = f.read(end - begin)
                got = tensors[name].contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
                if got != want:
                    raise SystemExit(f"load-bench: bytes of {name} differ from the file")
                picked += 1
    return picked


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--warm", action="store_true")
    a = ap.parse_args()
    if not (a.cold or a.warm):
        a.cold = a.warm = True
    a.files = [f for f, _ in gdskit._gdskit.resolve_shards(a.checkpoint)]
    nbytes = sum(os.path.getsize(p) for p in a.files)
    device = torch.device(a.device)

    def run():
        t0 = time.perf_counter()
        tensors = gdskit.load_safetensors(a.checkpoint, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0, tensors

    _, tensors = run()  # untimed: initialisation, and the bytes are checked once
    print(f"# checked {check(a.files, tensors)} sampled tensors against the files")
    del tensors
    for state in ("warm", "cold"):
        if not getattr(a, state):
            continue
        times, resident = [], []
        for _ in range(a.runs):
            for p in a.files:
                drop_cache(p) if state == "cold" else prime_cache(p)
            if state == "cold":
                r = [resident_fraction(p) for p in a.files]
                resident.append(sum(x for x in r if x is not None) / len(r))
            dt, tensors = run()
            del tensors
            times.append(dt)
        med = statistics.median(times)
        extra = f" resident_before_pct={100 * max(resident):.1f}" if resident else ""
        print(f"gdskit load_{state} {nbytes / med / 2**30:.3f} runs={','.join(f'{t:.3f}' for t in times)}"
              f" files={len(a.files)} bytes={nbytes}{extra}")
        st = gdskit.last_stats()
        if st:
            print(f"#   last run's statistics: {st}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
