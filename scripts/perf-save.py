#!/usr/bin/env python3
"""Saving speed from GPU memory: gdskit.save_file and gdskit.save_sharded against safetensors.torch.save_file
and torch.save, and a raw O_DIRECT write ceiling measured in the same run.

Run on the GPU machine (torch with CUDA, safetensors, gdskit built with -DGDSKIT_BUILD_PYTHON=ON):

    PYTHONPATH=build/release/python python3 scripts/perf-save.py --dir /data [--size-gib 8] [--runs 2] \
        [--device cuda:0] [--cli build/release/apps/gdskit/gdskit]

It builds a Llama-shaped bf16 state dict of about --size-gib on the device (hidden 4096, MLP 11008, vocabulary
32000, as many layers as fit), then times each writer end to end with the data on disk: gdskit syncs by design,
and safetensors and torch.save are followed by fsync of the file they wrote, so every number includes the
flush. The ceiling is a plain O_DIRECT writer (aligned requests from host memory, then fdatasync) of the same
byte count in the same folder, the best cell of a small grid of writer threads x request sizes, into a file
grown by the writes or one whose space was reserved first (fallocate, as gdskit's saves do), or
`gdskit bench -I 1` when --cli is given. --precondition-gib N first writes N GiB to the folder once and deletes
it: a RAM-backed loop device allocates its backing pages on a block's first write, a cost a real disk does not
have, so measure such a device both fresh and preconditioned and report which. Prints, per
writer, the best of --runs: seconds, GiB/s, ratio to the ceiling, CPU-s per GiB (getrusage of this process,
all threads) and GPU memory the writer allocated beyond the state dict (torch.cuda.max_memory_allocated delta).
Copy the table into docs/performance.md with the command, the machine and the date.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

import gdskit
from bench_common import fsync_path, llama_state, timed, write_once


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="folder on the disk to measure")
    ap.add_argument("--size-gib", type=float, default=8)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cli", help="gdskit binary: use `gdskit bench -I 1` for the ceiling")
    ap.add_argument("--skip", default="", help="comma-separated writers to skip (torch.save, ...)")
    ap.add_argument("--precondition-gib", type=float, default=0,
                    help="write and delete this many GiB in --dir before measuring (0: measure the disk as it is)")
    args = ap.parse_args()
    from safetensors.torch import save_file as st_save

    sd, layers = llama_state(args.size_gib, args.device)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    gib = nbytes / 2**30
    print(f"state dict: {len(sd)} bf16 tensors, {layers} layers, {gib:.2f} GiB on {args.device}")
    work = tempfile.mkdtemp(prefix="gdskit-perf-save.", dir=args.dir)
    try:
        if args.precondition_gib > 0:
            want = int(args.precondition_gib * 2**30)
            rate = write_once(os.path.join(work, "ceiling.bin"), "grown", want, 16, 8 << 20)
            print(f"preconditioned: {want / 2**30:.1f} GiB written once and deleted, {rate:.2f} GiB/s")
        def out(name):
            p = os.path.join(work, name)
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.unlink(p)
            return p

        def run_gdskit_file():
            gdskit.save_file(sd, out("g.safetensors"))

        def run_gdskit_sharded():
            gdskit.save_sharded(sd, out("g-sharded"), max_shard_size="5GB")

        def run_safetensors():
            p = out("s.safetensors")
            st_save(sd, p)
            fsync_path(p)

        def run_torch_save():
            p = out("t.pt")
            torch.save(sd, p)
            fsync_path(p)

        writers = [("gdskit.save_file", run_gdskit_file), ("gdskit.save_sharded", run_gdskit_sharded),
                   ("safetensors.save_file", run_safetensors), ("torch.save", run_torch_save)]
        skip = set(filter(None, args.skip.split(",")))
        best = {}
        for _ in range(args.runs):
            for name, fn in writers:
                if name in skip:
                    continue
                r = timed(fn, args.device)
                if name not in best or r[0] < best[name][0]:
                    best[name] = r
                if name == "gdskit.save_file":
                    st = gdskit.last_save_stats()
                    print(f"  {name}: {r[0]:.2f} s, path {st['path']} ({'; '.join(st['reasons'])}), "
                          f"syncs {st['sync_seconds']:.2f} s")
        # The files gdskit wrote equal safetensors' (checked once, from the last run).
        if "safetensors.save_file" not in skip:
            same = subprocess.run(["cmp", "-s", os.path.join(work, "g.safetensors"),
                                   os.path.join(work, "s.safetensors")]).returncode == 0
            print(f"gdskit.save_file bytes == safetensors.save_file bytes: {same}")
        if args.cli:
            # gdsio's -s is the size per worker: 16 workers write the state dict's size between them.
            per_worker = max(8 << 20, nbytes // 16 // (8 << 20) * (8 << 20))
            res = subprocess.run([args.cli, "bench", "-f", os.path.join(work, "ceiling.bin"), "-s", str(per_worker),
                                  "-i", "8M", "-w", "16", "-I", "1", "--json", "--quiet"], capture_output=True,
                                 text=True, check=True)
            ceiling = json.loads(res.stdout)["results"][0]["throughput_gib_s"]
            how = "gdskit bench -I 1 -i 8M -w 16"
        else:
            cells = {}
            for _ in range(args.runs):
                for reserve in (False, True):
                    for threads in (2, 4, 16):
                        for request in (4 << 20, 8 << 20):
                            rate = write_once(os.path.join(work, "ceiling.bin"),
                                                     "fallocate" if reserve else "grown", nbytes, threads, request)
                            key = (reserve, threads, request)
                            cells[key] = max(cells.get(key, 0.0), rate)
            ceiling = max(cells.values())
            grid = ", ".join(f"{'reserved ' if res else ''}{t}x{r >> 20}M {v:.2f}"
                             for (res, t, r), v in sorted(cells.items()))
            how = f"O_DIRECT, best of {grid}; fdatasync"
        print(f"\nraw write ceiling ({how}): {ceiling:.2f} GiB/s")
        print(f"{'writer':24} {'s':>7} {'GiB/s':>7} {'x ceil':>7} {'CPU-s/GiB':>10} {'GPU MiB extra':>14}")
        for name, (dt, cpu, extra) in best.items():
            rate = gib / dt
            print(f"{name:24} {dt:7.2f} {rate:7.2f} {rate / ceiling:7.2f} {cpu / gib:10.2f} {extra / 2**20:14.1f}")
        if "gdskit.save_file" in best:
            g = gib / best["gdskit.save_file"][0]
            for other in ("safetensors.save_file", "torch.save"):
                if other in best:
                    print(f"gdskit.save_file vs {other}: {g / (gib / best[other][0]):.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
