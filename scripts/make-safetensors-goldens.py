#!/usr/bin/env python3
"""Writes the safetensors golden files that gdskit's reader and writer are tested against.

Every file is written by the real `safetensors.torch.save_file`, and manifest.json records what the real
library's `safe_open`, `get_slice` and `load_file` returned for it: key order, metadata, dtype, shape and the
SHA-256 of every tensor's raw bytes, and the shape and SHA-256 (or the exception type) of a set of slices.
Tests regenerate nothing: a writer test loads a golden file, saves its tensors again and compares bytes; a reader
test compares its answers with the manifest.

    python3 scripts/make-safetensors-goldens.py OUT_DIR

Needs torch and safetensors (the GPU machine has both); the tensors are made on the CPU from a fixed seed, so a
rerun with the same library versions writes the same bytes.
"""
import hashlib
import json
import os
import sys

import torch
import safetensors
from safetensors import safe_open
from safetensors.torch import load_file, save_file

# safetensors' dtype name -> torch attribute, for every dtype the format names; those this torch lacks are skipped
# and listed in the manifest.
DTYPES = [
    ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("F8_E5M2", "float8_e5m2"),
    ("F8_E4M3", "float8_e4m3fn"), ("F8_E8M0", "float8_e8m0fnu"), ("F4", "float4_e2m1fn_x2"),
    ("I16", "int16"), ("U16", "uint16"), ("F16", "float16"), ("BF16", "bfloat16"), ("I32", "int32"),
    ("U32", "uint32"), ("F32", "float32"), ("C64", "complex64"), ("F64", "float64"), ("I64", "int64"),
    ("U64", "uint64"),
]

GEN = torch.Generator().manual_seed(20261201)


def random_tensor(dtype, shape):
    """Random bytes viewed as `dtype` (bool from 0/1 so every value is valid)."""
    numel = 1
    for d in shape:
        numel *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), dtype=torch.uint8, generator=GEN).to(torch.bool).reshape(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=GEN)
    if dtype.is_floating_point and itemsize >= 2:
        # Finite values only for the wide float types: NaN payloads survive byte copies, but keep tests readable.
        return torch.randn(shape, generator=GEN, dtype=torch.float64).to(dtype)
    return raw.view(dtype).reshape(shape)


def saves(dtype):
    """Whether this safetensors and torch can write and read back a tensor of `dtype`."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        try:
            t = random_tensor(dtype, [2])
            save_file({"x": t}, os.path.join(d, "x.safetensors"))
            return raw_bytes(load_file(os.path.join(d, "x.safetensors"))["x"]) == raw_bytes(t)
        except Exception:
            return False


def raw_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return bytes(t.view(torch.uint8).numpy().tobytes())


def sha(b):
    return hashlib.sha256(b).hexdigest()


def encode_index(spec):
    out = []
    for s in spec:
        if s is Ellipsis:
            out.append("...")
        elif isinstance(s, slice):
            out.append([s.start, s.stop, s.step])
        else:
            out.append(s)
    return out


SLICES = [
    (slice(1, 3),), (slice(None), slice(2, 5)), (-1,), (0,), (slice(None, None, 2),), (Ellipsis, slice(0, 2)),
    (slice(-2, None),), (slice(5, 1),), (slice(0, 100),), (1, slice(1, 4)),
]


def cases():
    available, skipped = [], []
    for name, attr in DTYPES:
        dt = getattr(torch, attr, None)
        if dt is None or not saves(dt):
            skipped.append(name)
        else:
            available.append((name, dt))
    all_dtypes = {f"t_{name.lower()}": random_tensor(dt, [3, 5]) for name, dt in available}
    yield "all_dtypes", all_dtypes, {"format": "pt", "source": "golden"}, ["t_f32", "t_bf16", "t_u8"]

    shapes = {
        "scalar_f32": random_tensor(torch.float32, []), "scalar_i64": random_tensor(torch.int64, []),
        "empty_f16": random_tensor(torch.float16, [0]), "empty_bf16": random_tensor(torch.bfloat16, [3, 0, 2]),
        "one_u8": random_tensor(torch.uint8, [1]), "cube_f32": random_tensor(torch.float32, [2, 3, 4]),
        "wide_f32": random_tensor(torch.float32, [64, 33]), "bits": random_tensor(torch.bool, [13]),
    }
    yield "shapes", shapes, None, ["cube_f32", "wide_f32", "bits"]

    unaligned = {
        "b": random_tensor(torch.uint8, [7]), "a": random_tensor(torch.int16, [3]),
        "a.b": random_tensor(torch.bfloat16, [5, 3]), "A": random_tensor(torch.float64, [3]),
        "10": random_tensor(torch.int8, [1]), "9": random_tensor(torch.float32, [11]),
        "z" * 200: random_tensor(torch.int32, [2]), "\u00fcn\u00ef.w": random_tensor(torch.float16, [9]),
    }
    yield "unaligned", unaligned, {"k": "v", "": "empty key", "\u00e9": "\u00e8"}, ["a.b"]

    llama = {}
    for layer in range(2):
        p = f"model.layers.{layer}."
        llama[p + "self_attn.q_proj.weight"] = random_tensor(torch.bfloat16, [64, 64])
        llama[p + "self_attn.o_proj.weight"] = random_tensor(torch.bfloat16, [64, 64])
        llama[p + "mlp.up_proj.weight"] = random_tensor(torch.bfloat16, [96, 64])
        llama[p + "input_layernorm.weight"] = random_tensor(torch.bfloat16, [64])
    llama["model.embed_tokens.weight"] = random_tensor(torch.bfloat16, [128, 64])
    llama["lm_head.weight"] = random_tensor(torch.float32, [128, 64])
    yield "llama_like", llama, {"format": "pt"}, ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"]

    yield "empty_dict", {}, {"only": "metadata"}, []
    return skipped


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    manifest = {"safetensors": safetensors.__version__, "torch": torch.__version__, "files": []}
    gen = cases()
    while True:
        try:
            stem, tensors, metadata, slice_names = next(gen)
        except StopIteration as stop:
            manifest["skipped_dtypes"] = stop.value
            break
        path = os.path.join(out, stem + ".safetensors")
        save_file(tensors, path, metadata=metadata)
        with open(path, "rb") as f:
            file_bytes = f.read()
        entry = {"file": stem + ".safetensors", "sha256": sha(file_bytes), "nbytes": len(file_bytes),
                 "save_metadata": metadata, "tensors": {}, "slices": []}
        with safe_open(path, framework="pt", device="cpu") as f:
            entry["keys"] = list(f.keys())
            entry["metadata"] = f.metadata()
            for name in f.keys():
                t = f.get_tensor(name)
                entry["tensors"][name] = {"dtype": f.get_slice(name).get_dtype(), "shape": list(t.shape),
                                          "sha256": sha(raw_bytes(t)), "nbytes": len(raw_bytes(t))}
                assert raw_bytes(t) == raw_bytes(tensors[name]), name
            for name in slice_names:
                for spec in SLICES:
                    rec = {"name": name, "index": encode_index(spec)}
                    try:
                        t = f.get_slice(name)[spec]
                        rec["shape"] = list(t.shape)
                        rec["sha256"] = sha(raw_bytes(t))
                    except Exception as e:  # the library's answer is what we record
                        rec["error"] = type(e).__name__
                    entry["slices"].append(rec)
        entry["load_file_keys"] = list(load_file(path).keys())
        manifest["files"].append(entry)
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(manifest['files'])} files and manifest.json to {out}; skipped dtypes: {manifest['skipped_dtypes']}")


if __name__ == "__main__":
    main()
