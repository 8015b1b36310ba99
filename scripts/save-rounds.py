#!/usr/bin/env python3
"""Saves from GPU (or CPU) memory in alternating rounds: raw O_DIRECT writers and gdskit variants measured one
after another, so a disk whose rate wanders is seen by all of them alike, with medians instead of best samples.

    python3 scripts/save-rounds.py --dir DIR [--size-gib 8] [--rounds 3] [--cells 2x8,4x4,4x8,8x4]
        [--source-cells 4x8] [--pinned 4x8,2x4] [--precondition-gib 0] [--device cuda:0] [--profiles PROFILES]

Each round writes the same byte count once per raw cell and once per gdskit variant, every writer followed by
fdatasync, into a new file in DIR that is deleted afterwards:
  raw TxM         T threads of M MiB O_DIRECT requests into a reserved file (fallocate, as gdskit's saves do),
                  each thread writing one reused buffer (the source stays in the CPU's cache);
  raw source TxM  the same, writing from a 1 GiB host buffer walked in order (a source the cache cannot hold,
                  as data copied from a GPU is);
  gdskit ...      a child process per variant (its own settings) that builds a Llama-shaped bf16 state dict on
                  --device (cuda:N, or cpu for host memory) and measures gdskit.save_file twice (the first save of a process also pins its staging
                  lanes and starts the scheduler), then one single extent of the same size (FileHandle.write of
                  one device buffer into a reserved file): the gathered write's cost against one transfer's.
  peers           a child process that times safetensors.torch.save_file and torch.save of the same state
                  dict (each followed by fsync of its file), then saves it with gdskit and checks that the two
                  safetensors files are byte-identical (--peers none leaves it out).
Variants: the default (profiles in PROFILES, so the first process learns and later ones hold), a fresh search
(GDSKIT_LEARN=off), and each --pinned DEPTHxMIB shape. Prints each round, then each row's median and samples, then
each row's median over the best raw median, gdskit's median over each peer's, and per variant the CPU time per GiB
of its saves and the GPU memory they allocated beyond the state dict.
"""

import argparse
import filecmp
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import GIB, MIB, cells_of, fill_random, fsync_path, llama_state, timed, write_once


def raw_write(path, nbytes, threads, request, source_bytes=0):
    """The raw writer into a reserved file (fallocate, as gdskit's saves do); GiB/s."""
    return write_once(path, "fallocate", nbytes, threads, request, source_bytes)


def peers_child(a, torch, gdskit, sd, nbytes):
    from safetensors.torch import save_file as st_save  # noqa: PLC0415
    out = {"bytes": nbytes}
    s_path = os.path.join(a.dir, f"save-rounds.{os.getpid()}.s.safetensors")
    t_path = os.path.join(a.dir, f"save-rounds.{os.getpid()}.t.pt")
    g_path = os.path.join(a.dir, f"save-rounds.{os.getpid()}.g.safetensors")
    dt, cpu, _ = timed(lambda: (st_save(sd, s_path), fsync_path(s_path)), a.device)
    out["safetensors.save_file"], out["safetensors_cpu"] = nbytes / dt / GIB, cpu / (nbytes / GIB)
    dt, cpu, _ = timed(lambda: (torch.save(sd, t_path), fsync_path(t_path)), a.device)
    out["torch.save"], out["torch_cpu"] = nbytes / dt / GIB, cpu / (nbytes / GIB)
    os.unlink(t_path)
    gdskit.save_file(sd, g_path)
    out["identical"] = filecmp.cmp(s_path, g_path, shallow=False)
    os.unlink(s_path)
    os.unlink(g_path)
    print(json.dumps(out), flush=True)
    return 0


def child(a):
    """One gdskit variant in this process's settings (or the peers): JSON with GiB/s of each measurement."""
    import torch  # noqa: PLC0415

    import gdskit  # noqa: PLC0415
    sd, _ = llama_state(a.size_gib, a.device)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    if a.child == "peers":
        return peers_child(a, torch, gdskit, sd, nbytes)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=a.device)
    if torch.device(a.device).type == "cuda":
        flat.random_(0, 256)
    else:
        fill_random(flat, 12345)
    if torch.device(a.device).type == "cuda":
        torch.cuda.synchronize(a.device)
        dev = torch.device(a.device).index or 0
    else:
        dev = -1
    out = {"bytes": nbytes, "cpu": 0.0, "gpu_extra": 0}
    path = os.path.join(a.dir, f"save-rounds.{os.getpid()}.safetensors")
    for key in ("first_save", "save"):
        dt, cpu, extra = timed(lambda: gdskit.save_file(sd, path), a.device)
        st = gdskit.last_save_stats()
        out[key] = nbytes / dt / GIB
        out["cpu"] = max(out["cpu"], cpu / (nbytes / GIB))
        out["gpu_extra"] = max(out["gpu_extra"], extra)
        out[key + "_split"] = {"total": dt, "library": st["seconds"], "sync": st["sync_seconds"]}
        # The schedule the save's writes ran on: the gathered host writes' for host tensors.
        sched = [r for r in st["reasons"] if r.startswith("gathered host writes")]
        out["reasons"] = sched or [r for r in st["reasons"] if "O_DIRECT" in r or "adaptive" in r][-1:]
        os.unlink(path)
    one = os.path.join(a.dir, f"save-rounds.{os.getpid()}.bin")
    t0 = time.perf_counter()
    f = gdskit._gdskit.FileHandle(one, "x")
    f.reserve(nbytes)
    f.write(flat.data_ptr(), nbytes, 0, dev)
    fd = os.open(one, os.O_RDONLY)
    os.fdatasync(fd)
    os.close(fd)
    f.close()
    out["one_extent"] = nbytes / (time.perf_counter() - t0) / GIB
    os.unlink(one)
    print(json.dumps(out), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size-gib", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cells", default="2x8,4x4,4x8,8x4", help="raw cells, THREADSxMIB")
    ap.add_argument("--source-cells", default="4x8", help="raw cells writing from a 1 GiB source, THREADSxMIB")
    ap.add_argument("--pinned", default="4x8,2x4", help="gdskit shapes to pin, DEPTHxMIB")
    ap.add_argument("--precondition-gib", type=float, default=0)
    ap.add_argument("--device", default="cuda:0", help="where the state dict lives: cuda:N or cpu")
    ap.add_argument("--profiles", help="profile folder of the default row (default: a new temporary one)")
    ap.add_argument("--peers", default="safetensors,torch", help="'none' leaves the peers out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if a.precondition_gib > 0:
        rate = raw_write(os.path.join(a.dir, f"save-rounds.{os.getpid()}.precondition.bin"),
                         int(a.precondition_gib * GIB) // (8 * MIB) * 8 * MIB, 16, 8 * MIB)
        print(f"preconditioned: {a.precondition_gib:.0f} GiB written once and deleted, {rate:.2f} GiB/s", flush=True)
    profiles = a.profiles or tempfile.mkdtemp(prefix="gdskit-save-rounds.")
    variants = {"gdskit": {"XDG_CACHE_HOME": profiles}, "gdskit LEARN=off": {"GDSKIT_LEARN": "off"}}
    for d, r in cells_of(a.pinned):
        variants[f"gdskit pinned {d}x{r}M"] = {"GDSKIT_LEARN": "off", "GDSKIT_DIRECT_DEPTH": str(d),
                                               "GDSKIT_STAGING_SLOT_BYTES": f"{r}M"}
    rows, notes, costs, nbytes, identical = {}, {}, {}, None, []

    def run_child(env, what="gdskit"):
        e = dict(os.environ)
        e.update(env)
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", what, "--dir", a.dir,
                            "--size-gib", str(a.size_gib), "--device", a.device], env=e, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stderr[-2000:], file=sys.stderr)
            return None
        return json.loads(p.stdout.strip().splitlines()[-1])

    for k in range(a.rounds):
        for name, env in variants.items():
            r = run_child(env)
            if r is None:
                continue
            nbytes = r["bytes"]
            for key in ("first_save", "save", "one_extent"):
                rows.setdefault(f"{name}: {key}", []).append(r[key])
            notes[name] = (r["reasons"], r["save_split"], r["first_save_split"])
            costs.setdefault(name, []).append((r["cpu"], r["gpu_extra"]))
        if a.peers != "none":
            r = run_child({"GDSKIT_LEARN": "off"}, "peers")
            if r is not None:
                for key in ("safetensors.save_file", "torch.save"):
                    rows.setdefault(key, []).append(r[key])
                costs.setdefault("safetensors.save_file", []).append((r["safetensors_cpu"], 0))
                costs.setdefault("torch.save", []).append((r["torch_cpu"], 0))
                identical.append(r["identical"])
        size = nbytes or int(a.size_gib * GIB)
        for t, m in cells_of(a.cells):
            rows.setdefault(f"raw {t}x{m}M", []).append(
                raw_write(os.path.join(a.dir, f"save-rounds.{os.getpid()}.raw.bin"), size // (m * MIB) * m * MIB, t, m * MIB))
        for t, m in cells_of(a.source_cells):
            rows.setdefault(f"raw source {t}x{m}M", []).append(
                raw_write(os.path.join(a.dir, f"save-rounds.{os.getpid()}.raw.bin"), size // (m * MIB) * m * MIB, t, m * MIB, GIB))
        print(f"round {k}: " + ", ".join(f"{n} {v[-1]:.2f}" for n, v in rows.items() if len(v) > k), flush=True)
    print(f"\n{(nbytes or 0) / GIB:.2f} GiB each, fdatasync included, GiB/s")
    print(f"{'row':34} median   samples")
    med = {}
    for n, v in rows.items():
        med[n] = statistics.median(v)
        print(f"{n:34} {med[n]:6.2f}   " + " ".join(f"{x:.2f}" for x in v))
    raw = {n: m for n, m in med.items() if n.startswith("raw ") and not n.startswith("raw source")}
    if raw:
        best_name = max(raw, key=raw.get)
        best = raw[best_name]
        print(f"\nbest raw median: {best_name} {best:.2f} GiB/s")
        for n, m in med.items():
            if not n.startswith("raw ") or n.startswith("raw source"):
                print(f"  {n:34} {m / best:.3f} of it")
    for peer in ("safetensors.save_file", "torch.save"):
        if peer in med:
            for n, m in med.items():
                if n.startswith("gdskit") and (n.endswith(": save") or n.endswith(": first_save")):
                    print(f"{n:34} / {peer}: {m / med[peer]:.2f}x")
    if identical:
        print(f"gdskit.save_file bytes == safetensors.save_file bytes: {all(identical)} ({len(identical)} checks)")
    for name, c in costs.items():
        print(f"{name}: CPU {max(x[0] for x in c):.3f} CPU-s/GiB at most; GPU memory beyond the state dict "
              f"{max(x[1] for x in c) / MIB:.1f} MiB at most")
    for name, (reasons, split, first) in notes.items():
        print(f"{name}: last save {split['total']:.2f} s (library {split['library']:.2f} s, of it sync and publish "
              f"{split['sync']:.2f} s); first save {first['total']:.2f} s (sync {first['sync']:.2f} s); "
              f"{'; '.join(reasons)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
