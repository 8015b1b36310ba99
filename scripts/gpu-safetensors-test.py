#!/usr/bin/env python3
"""Round trips of gdskit's safetensors loader against files written by the real `safetensors` library.

Run on the GPU machine (needs torch, safetensors, and gdskit built with -DGDSKIT_BUILD_PYTHON=ON):

    PYTHONPATH=build/release/python python3 scripts/gpu-safetensors-test.py \
        --cli build/release/apps/gdskit/gdskit [--dir /path/with/6GiB/free] [--skip-big]

Checks, each printed as PASS/FAIL/SKIP with the reason:
  1. every dtype torch has (that safetensors can save), empty and 0-dim tensors: gdskit.load_safetensors on
     cuda:0 and on cpu equals safetensors.torch.load_file bit for bit;
  2. a file whose tensors lie past 4 GiB (offsets > 2^32) loads correctly (set --skip-big to skip; needs ~4.1 GiB
     of disk and of GPU memory);
  3. `gdskit load --checksum --json` prints for every tensor the sha256 that hashlib computes on the same bytes;
  4. a sharded checkpoint (index.json) and subset/tensor-parallel slices equal the torch slicing reference;
  5. gdskit.read() fills an existing CUDA tensor, and gdskit.plan() names a path and reasons.
Exit status: 0 when every check passed or skipped, 1 otherwise.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import traceback

results = []


def check(name):
    def wrap(fn):
        def run(*a, **k):
            try:
                fn(*a, **k)
                results.append((name, "PASS", ""))
            except SkipTest as e:
                results.append((name, "SKIP", str(e)))
            except Exception as e:  # noqa: BLE001 - report every failure and go on
                results.append((name, "FAIL", f"{type(e).__name__}: {e}"))
                traceback.print_exc()
        return run
    return wrap


class SkipTest(Exception):
    pass


def raw_bytes(t):
    """The tensor's bytes as safetensors stores them (little-endian, C order)."""
    import torch
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def make_tensors(torch):
    g = torch.Generator().manual_seed(1)
    out = {}
    candidates = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
                  "uint16", "uint32", "uint64", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"]
    for name in candidates:
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        base = torch.randint(0, 256, (3, 5, 7), generator=g, dtype=torch.uint8)
        itemsize = torch.empty((), dtype=dt).element_size()
        t = torch.randint(0, 256, (3, 5, 7 * itemsize), generator=g, dtype=torch.uint8).view(dt) if itemsize > 1 \
            else base.view(dt) if dt != torch.bool else (base % 2).bool()
        out[f"t_{name}"] = t
        out[f"scalar_{name}"] = t.reshape(-1)[0].clone().reshape(())
        out[f"empty_{name}"] = t.reshape(-1)[:0].reshape(0, 4)
    return out


def same(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and raw_bytes(a) == raw_bytes(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default="build/release/apps/gdskit/gdskit", help="path of the gdskit binary")
    ap.add_argument("--dir", default=None, help="folder for test files (default: a temp folder)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--skip-big", action="store_true", help="skip the file with offsets past 4 GiB")
    args = ap.parse_args()

    try:
        import torch
        from safetensors.torch import load_file, save_file
        import gdskit
    except ImportError as e:
        print(f"SKIP all: {e} (needs torch, safetensors, and PYTHONPATH pointing at <build>/python)")
        return 77
    if not torch.cuda.is_available():
        print("SKIP all: torch sees no CUDA device")
        return 77
    ok, why = gdskit.gpu_available()
    print(f"gdskit {gdskit.__version__}; gpu_available={ok} {why}")

    workdir = tempfile.mkdtemp(prefix="gdskit-st-", dir=args.dir)
    tensors = make_tensors(torch)
    # Older safetensors releases cannot save some newer torch dtypes: drop those, saying so.
    for k in sorted(tensors):
        if not k.startswith("t_"):
            continue
        try:
            save_file({k: tensors[k]}, os.path.join(workdir, "probe.safetensors"))
        except Exception as e:  # noqa: BLE001
            dt = k[2:]
            print(f"  note: safetensors cannot save {dt} here ({type(e).__name__}); left out")
            for prefix in ("t_", "scalar_", "empty_"):
                tensors.pop(prefix + dt, None)
    path = os.path.join(workdir, "dtypes.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    ref = load_file(path)

    @check("dtypes, empty and 0-dim: cuda and cpu equal safetensors.load_file")
    def t_dtypes():
        for device in (args.device, "cpu"):
            got = gdskit.load_safetensors(path, device=device)
            missing = set(ref) - set(got)
            assert not missing, f"missing {sorted(missing)}"
            for k, v in ref.items():
                assert str(got[k].device).startswith(device.split(":")[0]), (k, got[k].device)
                assert same(got[k], v), f"{k} on {device}: {got[k].dtype}{tuple(got[k].shape)} vs {v.dtype}{tuple(v.shape)}"
        st = gdskit.last_stats()
        print(f"  dtypes file: {st['tensor_bytes']} bytes, path {st['path']} ({'; '.join(st['reasons'])})")
    t_dtypes()

    @check("--checksum --json equals hashlib.sha256 of the same bytes")
    def t_checksum():
        if not os.path.exists(args.cli):
            raise SkipTest(f"{args.cli} not found (pass --cli)")
        out = subprocess.run([args.cli, "load", path, "--device", args.device.split(":")[-1], "--checksum", "--json"],
                             check=True, capture_output=True, text=True).stdout
        sums = {c["name"]: c for c in json.loads(out)["checksums"]}
        for k, v in ref.items():
            want = hashlib.sha256(raw_bytes(v)).hexdigest()
            assert sums[k]["sha256"] == want, f"{k}: {sums[k]['sha256']} != {want}"
            assert sums[k]["shape"] == list(v.shape), k
        # The text form too.
        out = subprocess.run([args.cli, "load", path, "--checksum"], check=True, capture_output=True, text=True).stdout
        first = out.splitlines()[0].split()
        assert first[0] == hashlib.sha256(raw_bytes(ref[first[1]])).hexdigest()
    t_checksum()

    @check("sharded checkpoint, --only prefixes, tensor-parallel slices")
    def t_shards():
        d = os.path.join(workdir, "sharded")
        os.makedirs(d, exist_ok=True)
        g = torch.Generator().manual_seed(2)
        full = {f"layers.{i}.w": torch.randn(12, 10, generator=g) for i in range(4)}
        full["layers.0.b"] = torch.randn(12, generator=g)
        names = sorted(full)
        shards = [names[:3], names[3:]]
        wm = {}
        for i, part in enumerate(shards):
            fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: full[k] for k in part}, os.path.join(d, fn))
            wm.update({k: fn for k in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wm}, f)
        got = gdskit.load_safetensors(d, device=args.device)
        assert set(got) == set(full)
        for k in full:
            assert torch.equal(got[k].cpu(), full[k]), k
        got = gdskit.load_safetensors(d, device=args.device, only=["layers.0."])
        assert set(got) == {"layers.0.w", "layers.0.b"}, sorted(got)
        for world in (1, 2, 3, 5):
            for dim in (0, 1):
                for rank in range(world):
                    got = gdskit.load_safetensors(d, device=args.device, rank=rank, world=world, split_dim=dim)
                    for k, v in full.items():
                        want = torch.tensor_split(v, world, dim=dim)[rank] if dim < v.dim() else v
                        assert torch.equal(got[k].cpu(), want.contiguous()), (k, world, dim, rank)
    t_shards()

    @check("gdskit.read into a CUDA tensor; gdskit.plan")
    def t_read():
        data = os.urandom(3 << 20)
        p = os.path.join(workdir, "raw.bin")
        with open(p, "wb") as f:
            f.write(data)
        x = torch.empty(1 << 20, dtype=torch.uint8, device=args.device)
        n = gdskit.read(p, x, offset=12345)
        assert n == 1 << 20
        assert bytes(x.cpu().numpy()) == data[12345:12345 + (1 << 20)]
        kind, reasons = gdskit.plan(p, args.device)
        print(f"  plan: {kind} ({'; '.join(reasons)})")
        assert kind in ("gds", "staged", "compat") and reasons
        try:
            gdskit.load_safetensors(os.path.join(workdir, "missing.safetensors"), device=args.device)
            raise AssertionError("no error for a missing file")
        except FileNotFoundError:
            pass
    t_read()

    @check("offsets past 4 GiB")
    def t_big():
        if args.skip_big:
            raise SkipTest("--skip-big")
        p = os.path.join(workdir, "big.safetensors")
        st = os.statvfs(workdir)
        if st.f_bavail * st.f_frsize < (5 << 30):
            raise SkipTest(f"less than 5 GiB free in {workdir} (use --dir)")
        g = torch.Generator().manual_seed(3)
        # safetensors lays tensors out by dtype alignment (widest first), then name: an F64 filler comes first
        # and pushes the F32/BF16 tensors past 2^32. arange, not zeros, so a misplaced read cannot pass.
        filler = torch.arange((4 << 30) // 8 + 512, dtype=torch.float64)
        tail = {"after_4g_f32": torch.randn(1000, 3, generator=g), "after_4g_bf16": torch.randn(77, generator=g).bfloat16()}
        save_file({"a_filler": filler, **tail}, p)
        hdr, _ = gdskit.header(p)
        offs = {h["name"]: h["file_offset"] for h in hdr}
        assert all(offs[k] > (1 << 32) for k in tail), offs
        got = gdskit.load_safetensors(p, device=args.device, only=list(tail))
        for k, v in tail.items():
            assert same(got[k], v), k
        got = gdskit.load_safetensors(p, device=args.device)  # the whole 4 GiB file
        assert torch.equal(got["a_filler"].cpu(), filler)
        for k, v in tail.items():
            assert same(got[k], v), k
        os.remove(p)
    t_big()

    width = max(len(n) for n, _, _ in results)
    for name, status, why in results:
        print(f"{status:4}  {name:{width}}  {why}")
    return 1 if any(s == "FAIL" for _, s, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
