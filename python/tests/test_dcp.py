#!/usr/bin/env python3
"""Tests of gdskit's storage backend for PyTorch Distributed Checkpoint (gloo, CPU tensors, 2 processes).

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_dcp.py
Skips, with the reason, when torch >= 2.1 with torch.distributed.checkpoint, or gloo, is missing.
"""
import json
import os
import sys
import tempfile

WORLD = 2


def _skip_reason():
    from test_distributed import _skip_reason as base_reason
    why = base_reason()  # gdskit, torch and gloo
    if why:
        return why
    import torch
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 1):
        return f"torch {torch.__version__}: the checkpoint backend needs torch >= 2.1 (torch.distributed.checkpoint)"
    try:
        import gdskit.torch  # noqa: F401  (imports torch.distributed.checkpoint)
    except ImportError as e:
        return f"torch.distributed.checkpoint cannot be imported ({e})"
    return None


def _state(torch, rank, fill):
    """A state dict with replicated tensors of several dtypes, per-rank tensors and a non-tensor item."""
    g = torch.Generator().manual_seed(1234)

    def make(shape, dtype):
        x = torch.randn(shape, generator=g)
        return (x * 100).to(dtype) if fill else torch.zeros(shape, dtype=dtype)
    sd = {
        "w": make((33, 17), torch.float32),
        "b": make((17,), torch.bfloat16),
        "h": make((5, 4, 3), torch.float16),
        "i": make((9,), torch.int64),
        "s": make((), torch.float64),
        "e": make((0, 4), torch.float32),
        "big": make((3, 300000), torch.float32),
        f"rank{rank}.own": make((7, 7), torch.float32) + (rank if fill else 0),
        "step": 12 if fill else 0,
        "name": "run" if fill else "",
    }
    return sd


def _equal(torch, a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import gdskit.torch as gt
    from test_distributed import init_group
    rank, _ = init_group(args)
    res = {"rank": rank, "bad": []}
    try:
        for writer_kind, reader_kind in (("gdskit", "gdskit"), ("torch", "gdskit"), ("gdskit", "gdskit-threads")):
            folder = os.path.join(args["folder"], f"{writer_kind}-{reader_kind}")
            src = _state(torch, rank, True)
            if writer_kind == "torch":
                writer = dcp.FileSystemWriter(folder)
            else:  # three files per rank, written in parallel, in the last round
                writer = gt.FileSystemWriter(folder, thread_count=3 if reader_kind == "gdskit-threads" else 1)
            dcp.save(src, storage_writer=writer)
            dst = _state(torch, rank, False)
            dcp.load(dst, storage_reader=gt.FileSystemReader(folder))
            for k, v in src.items():
                if not _equal(torch, v, dst[k]):
                    res["bad"].append(f"{writer_kind}->{reader_kind}: {k} differs")
            dist.barrier()
            names = sorted(os.listdir(folder))
            if any(n.endswith(".tmp") for n in names):
                res["bad"].append(f"{writer_kind}: temporary files left: {names}")
            ours = [n for n in names if n.endswith(gt.SUFFIX)]
            if writer_kind == "gdskit" and (not ours or ".metadata" not in names):
                res["bad"].append(f"gdskit writer wrote {names}")
            if writer_kind == "torch" and ours:
                res["bad"].append(f"torch writer wrote gdskit files {names}")
        # A sharded tensor saved as rows and loaded as columns: every read narrows a stored chunk.
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard, distribute_tensor
        except ImportError:
            res["dtensor"] = "skip: no DTensor in this torch"
        else:
            mesh = init_device_mesh("cpu", (args["world"],))
            full = torch.arange(12 * 10, dtype=torch.float32).reshape(12, 10)
            folder = os.path.join(args["folder"], "dtensor")
            dcp.save({"t": distribute_tensor(full, mesh, [Shard(0)])},
                     storage_writer=gt.FileSystemWriter(folder))
            back = {"t": distribute_tensor(torch.zeros(12, 10), mesh, [Shard(1)])}
            dcp.load(back, storage_reader=gt.FileSystemReader(folder))
            if not torch.equal(back["t"].full_tensor(), full):
                res["bad"].append("DTensor rows -> columns differs")
            res["dtensor"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["bad"].append(f"{type(e).__name__}: {e}")
    with open(args["out"], "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def test_save_load_round_trips():
    why = _skip_reason()
    if why:
        return f"skip: {why}"
    from test_distributed import spawn
    with tempfile.TemporaryDirectory() as d:
        results = spawn(__file__, WORLD, {"folder": d}, d)
        for r in results:
            assert not r["bad"], r


if __name__ == "__main__":
    from test_distributed import main
    sys.exit(main(sys.argv, worker))
