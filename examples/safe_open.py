#!/usr/bin/env python3
"""Read one tensor, and a slice of another, from a safetensors file without loading the rest.

    PYTHONPATH=build/release/python python3 examples/safe_open.py model.safetensors [cuda:0]
"""
import sys

import gdskit


def main():
    path = sys.argv[1]
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    with gdskit.safe_open(path, framework="pt", device=device) as f:
        print("metadata:", f.metadata())
        names = f.keys()
        print(f"{len(names)} tensors; first: {names[0]}")
        first = f.get_tensor(names[0])
        print(f"{names[0]}: {first.dtype} {tuple(first.shape)} on {first.device}")
        sl = f.get_slice(names[-1])
        shape = sl.get_shape()
        if shape:
            part = sl[: max(1, shape[0] // 2)]  # the first half of the rows: only those bytes are read
            print(f"{names[-1]}[:{max(1, shape[0] // 2)}]: {sl.get_dtype()} {tuple(part.shape)} of {tuple(shape)}")


if __name__ == "__main__":
    main()
