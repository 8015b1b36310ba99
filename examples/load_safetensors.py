#!/usr/bin/env python3
"""Load a safetensors file with gdskit.load_file (the safetensors API) and print what arrived and how.

    PYTHONPATH=build/release/python python3 examples/load_safetensors.py model.safetensors [cuda:0]
"""
import sys

import gdskit


def main():
    path = sys.argv[1]
    ok, why = gdskit.gpu_available()
    device = sys.argv[2] if len(sys.argv) > 2 else ("cuda:0" if ok else "cpu")
    if not ok and device != "cpu":
        sys.exit(f"no GPU ({why})")
    tensors = gdskit.load_file(path, device=device)
    for name, t in tensors.items():
        print(f"{name:48} {str(t.dtype):16} {tuple(t.shape)}")
    stats = gdskit.last_stats()
    print(f"{stats['gib_per_s']:.2f} GiB/s; path {stats['path']} ({'; '.join(stats['reasons'])})")


if __name__ == "__main__":
    main()
