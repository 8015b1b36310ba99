#!/usr/bin/env python3
"""Distributed load and checkpoint test on a GPU machine (one GPU is enough). Prints one line per check and
the timing ratios; exit status 0 when every check passed, 77 when no GPU or torch.

    PYTHONPATH=build/ci/python python3 scripts/gpu-distributed-test.py [--gib 2] [--folder /tmp/gdskit-dist]

1. NCCL, one rank, CUDA tensors: gdskit.load_safetensors(group=...) against the single-process load, byte for
   byte, with the Llama rule set; storage bytes read = checkpoint bytes; gdskit.save_sharded(group=...) of the
   loaded tensors against the single-process save, file for file.
2. gloo, 2 ranks, CPU tensors and (where this gloo build broadcasts CUDA tensors) CUDA tensors on the one GPU:
   column/row/replicated slices against the single-process load; the node reads each byte once; the save.
3. Distributed Checkpoint (torch >= 2.1): save and load of a state dict with torch's FileSystemWriter/Reader and
   with gdskit.torch's, both with sync_files=True, NCCL with one rank and CUDA tensors, then gloo with two ranks
   and CPU DTensors sharded by rows; prints seconds (the slowest rank's) and ratios.
--only load runs 1 and 2, --only dcp runs 3. Sizes scale with --gib (checkpoint and state dict bytes); the default run takes well under 3 minutes.
"""
import argparse
import datetime
import filecmp
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 170


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------------------
# A Llama-shaped checkpoint of about `gib` GiB, written in two shards and an index, streamed to disk.

def llama_specs(gib):
    hidden = 2048 if gib >= 1 else 256  # small runs keep the embeddings small too
    inter = hidden * 11 // 4
    per_layer = (4 * hidden * hidden + 3 * hidden * inter) * 2
    layers = max(1, int(gib * (1 << 30) // per_layer))
    specs = [("model.embed_tokens.weight", "BF16", (32003, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        specs += [(p + "input_layernorm.weight", "BF16", (hidden,)),
                  (p + "self_attn.q_proj.weight", "BF16", (hidden, hidden)),
                  (p + "self_attn.k_proj.weight", "BF16", (hidden, hidden)),
                  (p + "self_attn.v_proj.weight", "BF16", (hidden, hidden)),
                  (p + "self_attn.o_proj.weight", "BF16", (hidden, hidden)),
                  (p + "post_attention_layernorm.weight", "BF16", (hidden,)),
                  (p + "mlp.gate_proj.weight", "BF16", (inter, hidden)),
                  (p + "mlp.up_proj.weight", "BF16", (inter, hidden)),
                  (p + "mlp.down_proj.weight", "BF16", (hidden, inter))]
    specs += [("model.norm.weight", "F32", (hidden,)), ("lm_head.weight", "BF16", (32003, hidden))]
    return specs


def write_checkpoint(folder, gib):
    import torch
    os.makedirs(folder, exist_ok=True)
    specs = llama_specs(gib)
    half = len(specs) // 2
    weight_map, total = {}, 0
    g = torch.Generator().manual_seed(7)
    for k, part in enumerate((specs[:half], specs[half:])):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        header, off = {}, 0
        for n, dt, shape in part:
            nb = (2 if dt == "BF16" else 4)
            for s in shape:
                nb *= s
            header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
            weight_map[n] = name
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for n, dt, shape in part:
                nb = header[n]["data_offsets"][1] - header[n]["data_offsets"][0]
                f.write(torch.randint(0, 256, (nb,), dtype=torch.uint8, generator=g).numpy().tobytes())
        total += off
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return os.path.join(folder, "model.safetensors.index.json"), total


# ---------------------------------------------------------------------------------------------------------------
# Workers

def init(args, backend):
    import torch.distributed as dist
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{args['port']}", rank=args["rank"],
                            world_size=args["world"], timeout=datetime.timedelta(seconds=120))
    return dist


def as_bytes(torch, x):
    x = x.contiguous().reshape(-1)
    return x.view(torch.uint8) if x.numel() else x.to(torch.uint8)


def check_load(args, backend, device):
    """One rank of a distributed load; returns its result dict."""
    import torch
    import gdskit
    import gdskit.distributed as gd
    dist = init(args, backend)
    rank, world = args["rank"], args["world"]
    if device.startswith("cuda"):
        torch.cuda.set_device(0)
    res = {"rank": rank, "bad": []}
    dist.barrier()
    t0 = time.perf_counter()
    got = gdskit.load_safetensors(args["index"], device, group=dist.group.WORLD, tp_rank=rank, tp_world=world,
                                  placement=gd.llama_tp)
    res["seconds"] = time.perf_counter() - t0
    st = gdskit.last_stats()
    res["stats"] = {k: st[k] for k in ("bytes_read", "bytes_sent", "bytes_received", "read_seconds",
                                       "comm_seconds", "path")}
    t0 = time.perf_counter()
    ref = gdskit.load_safetensors(args["index"], device)
    res["single_seconds"] = time.perf_counter() - t0
    for name, full in ref.items():
        spec = gd.llama_tp(name, list(full.shape), "")
        exp = full if spec == gd.REPLICATED or spec[1] >= full.dim() else \
            torch.tensor_split(full, world, dim=spec[1])[rank]
        if name not in got or not torch.equal(as_bytes(torch, got[name]), as_bytes(torch, exp)):
            res["bad"].append(name)
    del got
    # Save: every rank holds every tensor; the files must be those of the single-process save.
    out = os.path.join(args["folder"], f"save-{backend}-{device.replace(':', '')}")
    limit = max(1, sum(t.numel() * t.element_size() for t in ref.values()) // 4)
    dist.barrier()
    t0 = time.perf_counter()
    written = gdskit.save_sharded(ref, out, max_shard_size=limit, group=dist.group.WORLD, overwrite=True)
    res["save_seconds"] = time.perf_counter() - t0
    res["save_stats"] = {k: gd.last_stats()[k] for k in ("files_written", "bytes_written", "sync_seconds")}
    dist.barrier()
    if rank == 0:
        t0 = time.perf_counter()
        single = gdskit.save_sharded(ref, out + "-single", max_shard_size=limit, overwrite=True)
        res["single_save_seconds"] = time.perf_counter() - t0
        for a_, b_ in zip(written, single):
            if not filecmp.cmp(a_, b_, shallow=False):
                res["bad"].append(f"saved {os.path.basename(a_)} differs from the single-process save")
        shutil.rmtree(out + "-single", ignore_errors=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(out, ignore_errors=True)
    del ref
    dist.destroy_process_group()
    return res


def drop_folder_cache(folder):
    """Evicts every file of `folder` from the page cache (they are synced), so the next read is cold."""
    for root, _, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def dcp_state(args, torch, mesh):
    """The state dict the DCP check saves: 16 bf16 matrices and a step counter. With one rank, CUDA tensors; with
    a device mesh of several ranks, CPU DTensors sharded by rows (FSDP-style: each rank holds and writes its
    share)."""
    n = 16
    numel = int(args["gib"] * (1 << 30) // 2 // n)
    if mesh is None:
        g = torch.Generator(device="cuda").manual_seed(3)
        src = {f"layer{i}.w": torch.randn(numel // 1024, 1024, device="cuda", generator=g).to(torch.bfloat16)
               for i in range(n)}
    else:
        from torch.distributed.tensor import Shard, distribute_tensor
        g = torch.Generator().manual_seed(3)
        src = {f"layer{i}.w": distribute_tensor(torch.randn(numel // 1024, 1024, generator=g).to(torch.bfloat16),
                                                mesh, [Shard(0)]) for i in range(n)}
    src["step"] = 1000
    return src


def check_dcp(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import gdskit.torch as gt
    sharded = args["world"] > 1
    init(args, "gloo" if sharded else "nccl")
    mesh = None
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (args["world"],))
    else:
        torch.cuda.set_device(0)
    src = dcp_state(args, torch, mesh)

    def local(v):
        return v.to_local() if hasattr(v, "to_local") else v

    def same(a, b):
        return torch.equal(local(a), local(b)) if isinstance(a, torch.Tensor) else a == b

    def sync():
        if sharded:
            dist.barrier()
        else:
            torch.cuda.synchronize()

    nbytes = sum(local(v).numel() * v.element_size() for v in src.values() if isinstance(v, torch.Tensor))
    res = {"rank": args["rank"], "bytes": nbytes, "bad": []}  # this rank's share
    for kind in ("torch", "gdskit", "torch", "gdskit"):  # twice each, alternating; the second pair is reported
        folder = os.path.join(args["folder"], f"dcp-{kind}")
        if args["rank"] == 0:
            shutil.rmtree(folder, ignore_errors=True)
        sync()
        w = dcp.FileSystemWriter(folder, sync_files=True) if kind == "torch" else \
            gt.FileSystemWriter(folder, sync_files=True)
        sync()
        t0 = time.perf_counter()
        dcp.save(src, storage_writer=w)
        sync()
        res[f"{kind}_save_s"] = time.perf_counter() - t0
        # Cold: torch's writer leaves its files in the page cache, gdskit's O_DIRECT writes do not; both are
        # evicted before the first load. The second load is warm for whatever that load left cached.
        if args["rank"] == 0:
            drop_folder_cache(folder)
        for temp in ("load", "warm_load"):
            dst = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in src.items()}
            r = dcp.FileSystemReader(folder) if kind == "torch" else gt.FileSystemReader(folder)
            sync()
            t0 = time.perf_counter()
            dcp.load(dst, storage_reader=r)
            sync()
            res[f"{kind}_{temp}_s"] = time.perf_counter() - t0
            for k, v in src.items():
                if not same(v, dst[k]):
                    res["bad"].append(f"{kind} {temp}: {k}")
    # gdskit's reader on torch's checkpoint (handed to torch's reader item by item).
    dst = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in src.items()}
    dcp.load(dst, storage_reader=gt.FileSystemReader(os.path.join(args["folder"], "dcp-torch")))
    if not all(same(v, dst[k]) for k, v in src.items()):
        res["bad"].append("gdskit reader on torch's checkpoint")
    import inspect
    from torch.distributed.checkpoint import filesystem as fs
    text = inspect.getsource(fs)
    res["torch_sync"] = (f"torch {torch.__version__} FileSystemWriter(sync_files=True): os.fsync per data file "
                         f"({'yes' if 'os.fsync(stream.fileno())' in text else 'not found'}), .metadata fsync'd "
                         f"and renamed ({'yes' if 'os.fsync(metadata_file.fileno())' in text else 'not found'}), "
                         f"folder fsync ({'yes' if 'O_DIRECTORY' in text else 'no'})")
    dist.destroy_process_group()
    return res


def worker(args):
    kind = args["kind"]
    try:
        if kind == "dcp":
            res = check_dcp(args)
        else:
            res = check_load(args, args["backend"], args["device"])
    except Exception as e:  # noqa: BLE001
        res = {"rank": args["rank"], "bad": [f"{type(e).__name__}: {e}"]}
    with open(args["out"], "w") as f:
        json.dump(res, f)


def launch(kind, world, common, **extra):
    port = free_port()
    procs, outs = [], []
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    for r in range(world):
        out = os.path.join(common["folder"], f"{kind}-{r}.json")
        if os.path.exists(out):
            os.unlink(out)
        a = dict(common, kind=kind, rank=r, world=world, port=port, out=out, **extra)
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(a)], env=env))
        outs.append(out)
    deadline = time.monotonic() + TIMEOUT_S
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return [{"rank": -1, "bad": [f"{kind}: hung past {TIMEOUT_S} s"]}]
    res = []
    for r, out in enumerate(outs):
        if not os.path.exists(out):
            res.append({"rank": r, "bad": [f"{kind}: rank {r} exited {procs[r].returncode} without a result"]})
        else:
            with open(out) as f:
                res.append(json.load(f))
    return res


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="checkpoint and state dict size in GiB (default 2)")
    ap.add_argument("--folder", default="/tmp",
                    help="where the test makes a scratch folder of its own (that one is removed at the end)")
    ap.add_argument("--only", choices=("load", "dcp"), help="run only the load/save checks (1, 2) or only the "
                                                           "Distributed Checkpoint check (3)")
    a = ap.parse_args()
    try:
        import torch
        import gdskit
    except ImportError as e:
        print(f"SKIP: {e}")
        return 77
    ok, why = gdskit.gpu_available()
    if not torch.cuda.is_available() or not ok:
        print(f"SKIP: no usable GPU ({why or 'torch.cuda.is_available() is False'})")
        return 77
    print(f"torch {torch.__version__}, gdskit {gdskit.__version__}, {torch.cuda.get_device_name(0)}")
    os.makedirs(a.folder, exist_ok=True)
    a.folder = tempfile.mkdtemp(prefix="gdskit-dist-", dir=a.folder)  # nothing of the given folder is touched
    failed = 0
    try:
        common = {"folder": a.folder, "index": None, "gib": a.gib}
        runs = []
        if a.only != "dcp":
            t0 = time.perf_counter()
            common["index"], total = write_checkpoint(os.path.join(a.folder, "ckpt"), a.gib)
            print(f"checkpoint: {total / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")
            runs = [("nccl-cuda-1", "load", 1, {"backend": "nccl", "device": "cuda:0"}),
                    ("gloo-cpu-2", "load", 2, {"backend": "gloo", "device": "cpu"}),
                    ("gloo-cuda-2", "load", 2, {"backend": "gloo", "device": "cuda:0"})]
        for label, kind, world, extra in runs:
            res = launch(kind, world, common, **extra)
            bad = [b for r in res for b in r["bad"]]
            read = sum(r.get("stats", {}).get("bytes_read", 0) for r in res)
            if label == "gloo-cuda-2" and bad and all("gloo" in b.lower() or "cuda" in b.lower() for b in bad):
                print(f"SKIP {label}: this gloo build does not broadcast CUDA tensors ({bad[0][:120]})")
                continue
            good = not bad and read == total
            failed += not good
            for r in res:
                if "stats" in r:
                    s = r["stats"]
                    print(f"  {label} rank {r['rank']}: {r['seconds']:.2f} s (single-process load "
                          f"{r['single_seconds']:.2f} s), read {s['bytes_read'] / 2**30:.2f} GiB in "
                          f"{s['read_seconds']:.2f} s, sent {s['bytes_sent'] / 2**30:.2f} GiB, received "
                          f"{s['bytes_received'] / 2**30:.2f} GiB in {s['comm_seconds']:.2f} s, path {s['path']}")
            for r in res:
                if "save_seconds" in r:
                    s = r["save_stats"]
                    print(f"  {label} rank {r['rank']}: save {r['save_seconds']:.2f} s, {s['files_written']} files, "
                          f"{s['bytes_written'] / 2**30:.2f} GiB, sync {s['sync_seconds']:.2f} s"
                          + (f" (single-process save {r['single_save_seconds']:.2f} s)" if "single_save_seconds" in r
                             else ""))
            print(f"{'PASS' if good else 'FAIL'} {label}: storage bytes read {read} of {total}"
                  + (f"; {bad[:5]}" if bad else ""))
        dcp = None
        if a.only != "load":
            try:
                import gdskit.torch  # noqa: F401
                dcp = True
            except ImportError as e:
                print(f"SKIP dcp: {e}")
        if dcp:
            for label, world in (("dcp", 1), ("dcp-sharded", 2)):
                res_all = launch("dcp", world, common)
                bad = [b for r in res_all for b in r["bad"]]
                failed += bool(bad)
                if all("torch_save_s" in r for r in res_all):
                    # The job's time is its slowest rank's.
                    res = {k: max(r[k] for r in res_all) for k in res_all[0] if k.endswith("_s")}
                    gb = sum(r["bytes"] for r in res_all) / 2**30
                    what = ("one rank, CUDA tensors" if world == 1 else
                            f"{world} ranks (gloo), CPU DTensors sharded by rows, slowest rank")
                    print(f"  {label} {what}")
                    print(f"  {label} save {gb:.2f} GiB: torch {res['torch_save_s']:.2f} s, gdskit "
                          f"{res['gdskit_save_s']:.2f} s -> gdskit {res['torch_save_s'] / res['gdskit_save_s']:.2f}x "
                          f"as fast")
                    for temp, cw in (("load", "cold"), ("warm_load", "warm")):
                        t, g = res[f"torch_{temp}_s"], res[f"gdskit_{temp}_s"]
                        print(f"  {label} load {cw} {gb:.2f} GiB: torch {t:.2f} s, gdskit {g:.2f} s -> gdskit "
                              f"{t / g:.2f}x as fast")
                    if world == 1:
                        print(f"  {res_all[0]['torch_sync']}; gdskit: fdatasync per data file, folder fsync, then "
                              f"torch's .metadata")
                print(f"{'PASS' if not bad else 'FAIL'} {label}" + (f": {bad[:5]}" if bad else ""))
    finally:
        shutil.rmtree(a.folder, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
