#!/usr/bin/env python3
"""Write a tensor to a file and read it back with gdskit.File, blocking and with awaited futures.

    PYTHONPATH=build/release/python python3 examples/file_io.py /tmp/data.bin [cuda:0]
"""
import asyncio
import sys

import torch

import gdskit


async def read_halves(f, dst):
    half = dst.numel() // 2
    a, b = dst[:half], dst[half:]
    counts = await asyncio.gather(f.pread(a), f.pread(b, file_offset=half * dst.element_size()))
    return sum(counts)


def main():
    path = sys.argv[1]
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    src = torch.arange(1 << 20, dtype=torch.float32, device=device)
    with gdskit.File(path, "w") as f:
        print("wrote", f.write(src), "bytes")
    dst = torch.empty_like(src)
    with gdskit.File(path) as f:
        kind, reasons = f.plan(dst)
        print(f"path {kind} ({'; '.join(reasons)})")
        print("read", asyncio.run(read_halves(f, dst)), "bytes; equal:", bool(torch.equal(src, dst)))


if __name__ == "__main__":
    main()
