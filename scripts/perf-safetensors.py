#!/usr/bin/env python3
"""Loading speed: gdskit.load_safetensors against safetensors.torch.load_file and safe_open(...).get_tensor.

Run on the GPU machine (torch, safetensors, gdskit built with -DGDSKIT_BUILD_PYTHON=ON):

    PYTHONPATH=build/release/python python3 scripts/perf-safetensors.py --dir /data --size-gib 8 \
        [--cli build/release/apps/gdskit/gdskit] [--runs 3] [--keep]

It writes a bf16 model-like file of --size-gib (tensors of 16-256 MiB) unless --file is given, then measures
each loader warm (file in the page cache, best of --runs) and cold (page cache dropped with
posix_fadvise(DONTNEED) before every run; dropping needs no root, but a file system that ignores it makes "cold"
warm: check the printed cached fraction). Every loader's result is checked against safetensors' bytes once.
If --cli is given, `gdskit bench`-style ceiling: `gdskit load --json` on the same file (host and GPU).
Prints a table of seconds, GiB/s and ratios gdskit/other; the targets are >= 5x over load_file warm,
and >= 0.85 of gdskit's own warm read rate for the same bytes. Copy the table into docs/performance.md with the
command, the machine and the date.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_fraction(path):
    """Share of the file's pages in the page cache (mincore through mmap), or None if unknown."""
    try:
        import ctypes
        import mmap
        size = os.path.getsize(path)
        if size == 0:
            return None
        libc = ctypes.CDLL(None, use_errno=True)
        with open(path, "rb") as f:
            # A private (copy-on-write) mapping is writable for ctypes and, untouched, shows the page cache.
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
            page = mmap.PAGESIZE
            n = (size + page - 1) // page
            vec = (ctypes.c_ubyte * n)()
            buf = (ctypes.c_char * size).from_buffer(m)
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec)
            del buf
            m.close()
            if rc != 0:
                return None
            return sum(v & 1 for v in vec) / n
    except Exception:  # noqa: BLE001
        return None


def write_model(path, size_gib, torch, save_file):
    g = torch.Generator().manual_seed(0)
    tensors, total, i = {}, 0, 0
    target = int(size_gib * (1 << 30))
    sizes = [16, 32, 64, 128, 256]
    while total < target:
        mib = sizes[i % len(sizes)]
        n = min(mib << 20, target - total) // 2
        if n == 0:
            break
        tensors[f"layers.{i}.weight"] = torch.randn(n, generator=g).to(torch.bfloat16).reshape(-1, 1024) \
            if n % 1024 == 0 else torch.randn(n, generator=g).to(torch.bfloat16)
        total += n * 2
        i += 1
    save_file(tensors, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", help="an existing .safetensors file (default: write one)")
    ap.add_argument("--dir", default=None, help="where to write the test file")
    ap.add_argument("--size-gib", type=float, default=8.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cli", default=None, help="gdskit binary, for `gdskit load --json` figures")
    ap.add_argument("--keep", action="store_true", help="keep the written file")
    args = ap.parse_args()

    try:
        import torch
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file
        import gdskit
    except ImportError as e:
        print(f"SKIP: {e} (needs torch, safetensors and PYTHONPATH=<build>/python)")
        return 77
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return 77

    path = args.file
    written = False
    if path is None:
        path = os.path.join(args.dir or tempfile.gettempdir(), f"gdskit-perf-{args.size_gib:g}g.safetensors")
        if not os.path.exists(path):
            print(f"writing {path} ({args.size_gib:g} GiB) ...", flush=True)
            write_model(path, args.size_gib, torch, save_file)
            written = True
    nbytes = os.path.getsize(path)
    gib = nbytes / (1 << 30)
    dev = args.device

    def sync():
        torch.cuda.synchronize()

    def run_load_file():
        out = load_file(path, device=dev)
        sync()
        return out

    def run_safe_open():
        out = {}
        with safe_open(path, framework="pt", device=dev) as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
        sync()
        return out

    def run_gdskit():
        out = gdskit.load_safetensors(path, device=dev)
        sync()
        return out

    loaders = {"gdskit": run_gdskit, "load_file": run_load_file, "safe_open": run_safe_open}

    # Correctness once (on the GPU, compared to safetensors' own result).
    ref = run_load_file()
    got = run_gdskit()
    for k, v in ref.items():
        if not torch.equal(got[k], v):
            print(f"FAIL: tensor {k} differs between gdskit and safetensors")
            return 1
    del ref, got
    st = gdskit.last_stats()
    print(f"file {path}: {gib:.2f} GiB, {st['files']} file(s); gdskit path: {st['path']} ({'; '.join(st['reasons'])})")

    results = {}
    for mode in ("warm", "cold"):
        for name, fn in loaders.items():
            times = []
            for _ in range(args.runs):
                if mode == "cold":
                    drop_cache(path)
                    frac = cached_fraction(path)
                else:
                    fn()  # make sure it is cached
                    frac = cached_fraction(path)
                torch.cuda.empty_cache()
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
                del out
            best = min(times)
            results[(mode, name)] = best
            fr = "?" if frac is None else f"{frac:.0%}"
            extra = ""
            if name == "gdskit":
                st = gdskit.last_stats()
                extra = (f"  [last run: reads {st['seconds']:.3f} s ({st['gib_per_s']:.2f} GiB/s), headers "
                         f"{st['header_seconds'] * 1e3:.1f} ms, allocation {st['alloc_seconds'] * 1e3:.1f} ms, "
                         f"whole C++ load {st['load_seconds'] * 1e3:.1f} ms]")
            print(f"{mode:4} {name:10} best {best:7.3f} s  {gib / best:6.2f} GiB/s  (cached before run: {fr}){extra}",
                  flush=True)

    cli_rate = {}
    if args.cli:
        for mode in ("warm", "cold"):
            if mode == "cold":
                drop_cache(path)
            out = subprocess.run([args.cli, "load", path, "--device", dev.split(":")[-1], "--json"], check=True,
                                 capture_output=True, text=True).stdout
            cli_rate[mode] = json.loads(out)["gib_per_s"]
            print(f"{mode:4} gdskit load (CLI) {cli_rate[mode]:6.2f} GiB/s")

    bench_warm = None
    if args.cli:
        # gdskit bench's warm staged read of the same bytes: 16 workers, each a contiguous sixteenth, 8 MiB requests.
        per = (nbytes // 16) // 4096 * 4096
        with open(path, "rb") as f:  # the cold runs above read around the page cache: make it warm again
            while f.read(64 << 20):
                pass
        out = subprocess.run([args.cli, "bench", "-f", path, "-x", "staged", "-d", dev.split(":")[-1], "-w", "16",
                              "-s", str(per), "-i", "8M", "--json", "--quiet"], check=True, capture_output=True,
                             text=True).stdout
        bench_warm = json.loads(out)["results"][0]["throughput_gib_s"]
        print(f"warm gdskit bench -x staged -w 16 (same file) {bench_warm:6.2f} GiB/s")

    print("\nratios (gdskit speed / other speed; >1 means gdskit is faster)")
    for mode in ("warm", "cold"):
        g = results[(mode, "gdskit")]
        for other in ("load_file", "safe_open"):
            print(f"  {mode:4} gdskit vs {other:9}: {results[(mode, other)] / g:5.2f}x")
    if bench_warm:
        print(f"  warm gdskit vs gdskit bench warm read: {gib / results[('warm', 'gdskit')] / bench_warm:5.2f}")
    print("targets: warm vs load_file >= 5x; gdskit warm >= 0.85 x `gdskit bench` warm read rate of the same bytes")
    if written and not args.keep:
        os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
