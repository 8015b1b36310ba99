#!/usr/bin/env python3
"""Row gathers, cold, in one run: gdskit.gather_rows of random rows of a .npy file into GPU memory against what
users do today (numpy.load(mmap_mode="r")[idx], then torch.from_numpy(...).to(device)) and against the raw
io_uring ring's rate at the same request size and depth, and at the size of the pages each row needs (batch_bench's
ring, run by this script when given).

    scripts/gather-bench.py --file /mnt/fast/emb.npy --size-gib 8 --row-bytes 4096 --rows 100000 \\
        [--device cuda:0] [--rounds 3] [--ring build/release/bench/batch_bench] [--json out.json]

The file is created once (np.lib.format.open_memmap, random bytes) and dropped from the page cache before every
run (posix_fadvise DONTNEED after fdatasync; the resident fraction is printed). Each method runs --rounds times,
alternating; medians are compared. With --ring the ring runs in every round too, right after the gathers of that
round (a file of its own beside the .npy, made once): a device whose rate drifts between runs (virtual machines)
would otherwise make one ring measurement decide the ratio; each round's ratio is against its own ring, and the
ratio printed is the median of the rounds'.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import gdskit


def drop(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def make(path, size_gib, row_bytes):
    rows = int(size_gib * (1 << 30)) // row_bytes
    if os.path.lexists(path):
        # Reused only when it is what this bench made: never overwrite someone's file.
        try:
            a = np.load(path, mmap_mode="r") if os.path.isfile(path) and not os.path.islink(path) else None
        except (OSError, ValueError):
            a = None
        if a is not None and a.shape == (rows, row_bytes // 4) and a.dtype == np.float32:
            return rows
        sys.exit(f"gather-bench: {path!r} exists and is not a float32 .npy of {rows} x {row_bytes // 4} made by this "
                 "bench; remove it or pass another --file")
    a = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, row_bytes // 4))
    rng = np.random.default_rng(0)
    chunk = max(1, (256 << 20) // row_bytes)
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        a[start:start + n] = np.frombuffer(rng.bytes(n * row_bytes), dtype=np.float32).reshape(n, row_bytes // 4)
    a.flush()
    del a
    return rows


def cpu():
    t = os.times()
    return t.user + t.system


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", required=True)
    p.add_argument("--size-gib", type=float, default=8)
    p.add_argument("--row-bytes", type=int, default=4096)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--depth", type=int, default=64)
    p.add_argument("--ring", help="batch_bench binary: measure the raw ring at the row size and depth")
    p.add_argument("--json")
    a = p.parse_args()
    import torch

    nrows = make(a.file, a.size_gib, a.row_bytes)
    dev = torch.device(a.device)
    gib = a.rows * a.row_bytes / (1 << 30)
    results = {"gdskit": [], "numpy_mmap_then_to": []}
    cpus = {"gdskit": [], "numpy_mmap_then_to": []}
    rng = np.random.default_rng(1)
    # O_DIRECT reads whole pages: a row that does not start on a page boundary (a .npy's data starts after its
    # header, 128 bytes in) costs the pages it touches, one more than its size for 4 KiB rows.
    data_offset = np.load(a.file, mmap_mode="r").offset
    cover = ((data_offset % 4096 + a.row_bytes + 4095) // 4096) * 4096
    rings, ring_covers = [], []
    ring_file = a.file + ".ring.dat"
    # A file already there is someone's (batch_bench reuses one of the right size): it is never removed.
    ring_file_ours = not os.path.lexists(ring_file)
    try:
        for rnd in range(a.rounds):
            gather_round(a, dev, gib, nrows, rng, rnd, results, cpus)
            if a.ring:
                ring, ring_cover = measure_ring(a, ring_file, cover)
                rings.append(ring)
                ring_covers.append(ring_cover)
    finally:
        # The ring's file is this bench's own (batch_bench makes it at the size asked for): removed afterwards.
        if a.ring and ring_file_ours and os.path.isfile(ring_file) and not os.path.islink(ring_file):
            os.unlink(ring_file)
    report(a, results, cpus, rings, ring_covers, cover, data_offset)
    return 0


def gather_round(a, dev, gib, nrows, rng, rnd, results, cpus):
    """One round: each method once, cold, on the same random indices."""
    import torch

    idx = rng.integers(0, nrows, a.rows)
    for method in results:
        drop(a.file)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        c0, t0 = cpu(), time.perf_counter()
        if method == "gdskit":
            out = gdskit.gather_rows(a.file, idx, device=a.device, queue_depth=a.depth)
        else:
            host = np.load(a.file, mmap_mode="r")[idx]
            out = torch.from_numpy(host).to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        results[method].append(gib / dt)
        cpus[method].append((cpu() - c0) / gib)
        if rnd == 0 and method == "gdskit":
            check = np.load(a.file, mmap_mode="r")[idx[:2000]]
            assert out[:2000].cpu().numpy().tobytes() == check.tobytes(), "gather_rows returned wrong bytes"
        del out


def measure_ring(a, ring_file, cover):
    """The raw ring at the row size and at the pages each row needs, 2 s each: (GiB/s, GiB/s or None)."""
    cases = f"{a.row_bytes}:{a.depth}" + (f",{cover}:{a.depth}" if cover != a.row_bytes else "")
    ring_json = a.file + ".ring.json"
    r = subprocess.run([a.ring, ring_file, f"{int(a.size_gib * 1024)}M", "2", cases, "--json", ring_json,
                        "--ring-only"], capture_output=True, text=True)
    print(r.stdout.strip())
    if r.returncode != 0:
        sys.exit(f"gather-bench: the ring failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    ring = ring_cover = None
    with open(ring_json) as f:
        for row in json.load(f):
            if row["what"] == "ring" and row["io"] == a.row_bytes:
                ring = row["gib_s"]
            if row["what"] == "ring" and row["io"] == cover:
                ring_cover = row["gib_s"]
    os.unlink(ring_json)
    return ring, ring_cover


def report(a, results, cpus, rings, ring_covers, cover, data_offset):
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"gather_rows: {a.rows} random rows of {a.row_bytes} B from {a.size_gib:g} GiB .npy into {a.device}, cold, "
          f"{a.rounds} rounds (medians):")
    for k in results:
        print(f"  {k:22s} {med[k]:7.3f} GiB/s  ({', '.join(f'{x:.3f}' for x in results[k])})  "
              f"{statistics.median(cpus[k]):.3f} CPU-s/GiB")
    print(f"  gdskit / numpy mmap + to(): {med['gdskit'] / med['numpy_mmap_then_to']:.2f}x")
    out = {"medians": med, "runs": results, "cpu": cpus, "row_read_bytes": cover}
    if rings and all(rings):
        # Each round against the ring of that round; the median of those ratios.
        ratios = [g / r for g, r in zip(results["gdskit"], rings)]
        print(f"  raw io_uring ring at {a.row_bytes} B, depth {a.depth}: {statistics.median(rings):.3f} GiB/s "
              f"({', '.join(f'{x:.3f}' for x in rings)}); gdskit / ring: {statistics.median(ratios):.3f} "
              f"[rounds {' '.join(f'{x:.2f}' for x in ratios)}]")
        out.update(ring_gib_s=rings, ratio_to_ring=ratios)
    if ring_covers and all(ring_covers):
        # Rows per second against reads per second of the pages every row needs.
        ratios = [(g / a.row_bytes) / (r / cover) for g, r in zip(results["gdskit"], ring_covers)]
        print(f"  each row is a read of {cover} B (data at byte {data_offset} of the file): ring at {cover} B, "
              f"depth {a.depth}: {statistics.median(ring_covers):.3f} GiB/s "
              f"({', '.join(f'{x:.3f}' for x in ring_covers)}); gdskit rows/s / ring reads/s: "
              f"{statistics.median(ratios):.3f} [rounds {' '.join(f'{x:.2f}' for x in ratios)}]")
        out.update(ring_row_read_gib_s=ring_covers, rows_ratio_to_ring=ratios)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
