#!/usr/bin/env python3
"""Saving from GPU memory, checked: every dtype from cuda:0, 0-d and empty tensors, non-contiguous tensors (and
the GPU memory their staging takes), a sharded save, and the bytes against safetensors.torch.save_file where the
safetensors package is installed.

Run on the GPU machine (torch with CUDA, gdskit built with -DGDSKIT_BUILD_PYTHON=ON):

    PYTHONPATH=build/release/python python3 scripts/gpu-save-test.py [--dir /var/tmp] [--device cuda:0]

Prints PASS/FAIL per check and exits 1 on any failure, 77 when no CUDA device is usable.
"""

import argparse
import json
import os
import sys
import tempfile

try:
    import torch
except ImportError:
    print("SKIP: torch not installed")
    sys.exit(77)
import gdskit

DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"]


def state(device):
    g = torch.Generator(device="cpu").manual_seed(7)
    out = {}
    for name in DTYPES:
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        base = torch.randint(0, 100, (37, 129), generator=g)
        try:
            x = base.to(torch.float32).to(dt) if (dt.is_floating_point or dt.is_complex) else base.to(dt)
            x = x.to(device)
        except (RuntimeError, TypeError):
            continue  # a dtype this torch cannot make on this device
        out[f"m.{name}"] = x
        out[f"s.{name}"] = x[0, 0].clone()
        out[f"e.{name}"] = torch.empty((3, 0), dtype=dt, device=device)
    out["big"] = torch.randn(4096, 4099, generator=g).to(device)  # 64 MiB, ragged
    return out


def raw(t):
    """The tensor's bytes through torch alone (host copy), for comparison."""
    c = t.detach().to("cpu").contiguous()
    if c.numel() == 0:
        return b""
    return c.reshape(-1).view(torch.uint8).numpy().tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    ok, why = gdskit.gpu_available()
    if not ok or not torch.cuda.is_available():
        print(f"SKIP: no usable GPU ({why or 'torch.cuda unavailable'})")
        return 77
    failures = 0

    def check(name, cond, detail=""):
        nonlocal failures
        print(f"{'PASS' if cond else 'FAIL'} {name}{': ' + detail if detail and not cond else ''}")
        failures += 0 if cond else 1

    try:
        from safetensors.torch import save_file as st_save
    except ImportError:
        st_save = None
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        t = state(args.device)
        p = os.path.join(d, "gpu.safetensors")
        gdskit.save_file(t, p, metadata={"format": "pt"})
        stats = gdskit.last_save_stats()
        print(f"     path {stats['path']}: {'; '.join(stats['reasons'])}; {stats['gib_per_s']:.2f} GiB/s")
        back, _ = gdskit.load_safetensors_raw(p, device="cpu")
        bad = [k for k in t if back[k].tobytes() != raw(t[k]) or list(back[k].shape) != list(t[k].shape)]
        check(f"every dtype from {args.device} round trips ({len(t)} tensors)", not bad, f"differ: {bad}")
        if st_save is not None:
            q = os.path.join(d, "ref.safetensors")
            st_save(t, q, metadata={"format": "pt"})
            check("bytes equal safetensors.torch.save_file's", open(p, "rb").read() == open(q, "rb").read())
        else:
            print("SKIP bytes vs safetensors.torch.save_file (safetensors not installed)")

        # Non-contiguous: staged a block of rows at a time; GPU memory beyond the tensors stays within the budget.
        base = torch.randn(8192, 4096, device=args.device)  # 128 MiB
        nc = {"t": base.t(), "cols": torch.randn(4096, 8192, device=args.device)[:, ::2]}
        budget = 16 << 20
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        p2 = os.path.join(d, "nc.safetensors")
        gdskit.save_file(nc, p2, staging_bytes=budget)
        extra = torch.cuda.max_memory_allocated() - before
        back, _ = gdskit.load_safetensors_raw(p2, device="cpu")
        check("non-contiguous tensors round trip", all(back[k].tobytes() == raw(v) for k, v in nc.items()))
        check(f"non-contiguous staging took {extra / 2**20:.1f} MiB of GPU memory (budget 16 MiB + a row)",
              extra <= budget + 8192 * 4 * 2)
        if st_save is not None:
            q2 = os.path.join(d, "ncref.safetensors")
            st_save({k: v.contiguous() for k, v in nc.items()}, q2)
            check("non-contiguous bytes equal safetensors'", open(p2, "rb").read() == open(q2, "rb").read())

        # Sharded, straight from the GPU.
        out = os.path.join(d, "ckpt")
        written = gdskit.save_sharded(t, out, max_shard_size="20MB")
        index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
        check("sharded: index written last and names every tensor",
              written[-1].endswith("model.safetensors.index.json") and set(index["weight_map"]) == set(t))
        back = gdskit.load_safetensors(out, device=args.device, framework="torch")
        check("sharded: loads back to the GPU equal",
              all(raw(back[k]) == raw(v) for k, v in t.items()))
        check("no temporary files left", not [f for f in os.listdir(d) + os.listdir(out) if ".gdskit-tmp." in f])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
