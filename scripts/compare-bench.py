#!/usr/bin/env python3
"""Cold-read performance, compared in one run: ceilings, gdskit, KvikIO and fastsafetensors on each disk.

    python3 scripts/compare-bench.py --out OUT [--bin build/release] [--size-gib 8] [--shards 4]
        [--disks virtio,fast] [--virtio-dir /var/tmp/gdskit-compare] [--fast-gib 20] [--runs 2]
        [--peers .peers] [--skip kvikio,fst,gpu] [--rounds 3]

For every disk (virtio: a folder on the root file system; fast: ext4 on a RAM-backed loop device made with
fastdisk.sh from PEERS or ../shared/tools, or --fastdisk PATH; an existing mount at --fast-mnt is used as is) it writes a data file of --size-gib and a Llama-shaped bf16
checkpoint of --size-gib in --shards shards, then measures, cold (page cache dropped before each run) and warm:

  ceilings   raw O_DIRECT read, best over threads 1,2,4,8,16 x requests 1,4,8,16 MiB (dd, one stream per
             thread, each its own slice); raw O_DIRECT write (the same grid, fresh file); host_read_bench's
             read into a file-sized destination; host->device pinned copy (gpu_compare_bench, GPU only)
  gdskit     gdskit bench -x host / -x staged, read cold (twice: the first process on the disk learns its
             shape, the second starts from the learned profile) and warm, write; head to head (GPU only): the best
             raw cell read again --rounds times, alternating with gdskit's cold staged read (a fresh process
             each), medians compared; gdskit load (cold, warm); the
             same load in-process (scripts/load-bench.py, timed as the fastsafetensors benchmark times its
             own); gpu_compare_bench's verdicts (one large transfer against ceilings in its own process).
             gdskit's profile folder is OUT/<disk>/profiles (XDG_CACHE_HOME), empty at the start of each disk
  KvikIO     PEERS/kvikio/kvikio_bench FILE SIZE 16 4 (GPU only)
  fst        PEERS/fastsafetensors: build.sh + bench_fst.py on the shards (GPU only)

Peers and GPU parts are skipped, with the reason, where no GPU is usable. Every command's output goes to
OUT/<disk>/<step>.log; OUT/results.json holds the figures and the final table (ratios gdskit / ceiling and
gdskit / peer) is printed and written to OUT/table.txt. Sizes are configurable so that one run fits a
10-minute limit: on the GPU machine --size-gib 3 --runs 1 takes 3 to 5.5 minutes per disk (one disk per call).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30
MIB = 1 << 20


def log(msg):
    print(msg, flush=True)


class Runner:
    def __init__(self, out):
        self.out = out
        self.results = {}   # (disk, name) -> GiB/s
        self.notes = {}     # (disk, name) -> text
        self.skipped = []   # (disk, what, why)

    def run(self, disk, step, cmd, env=None, timeout=900, cwd=None):
        path = os.path.join(self.out, disk, step + ".log")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        t0 = time.time()
        e = dict(os.environ)
        if env:
            e.update(env)
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=e, timeout=timeout,
                               cwd=cwd, text=True, errors="replace")
            text, rc = p.stdout, p.returncode
        except subprocess.TimeoutExpired as x:
            text, rc = (x.stdout or "") if isinstance(x.stdout, str) else "", 124
        except OSError as x:
            text, rc = str(x), 127
        with open(path, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n" + text + f"\n# rc={rc} seconds={time.time() - t0:.1f}\n")
        if rc != 0:
            log(f"  [{disk}] {step}: exit {rc} (see {path})")
        return rc, text

    def put(self, disk, name, gib_s, note=""):
        if gib_s is None:
            return
        self.results[(disk, name)] = gib_s
        if note:
            self.notes[(disk, name)] = note
        log(f"  [{disk}] {name:<34} {gib_s:8.2f} GiB/s {note}")

    def skip(self, disk, what, why):
        self.skipped.append((disk, what, why))
        log(f"  [{disk}] {what}: skipped ({why})")


def drop_cache(paths):
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def write_random(path, nbytes):
    if os.path.exists(path) and os.path.getsize(path) == nbytes:
        return
    with open(path, "wb") as f:
        left = nbytes
        block = os.urandom(16 * MIB)
        i = 0
        while left > 0:
            n = min(left, len(block))
            # Vary the block so nothing below can deduplicate it.
            f.write(struct.pack("<Q", i) + block[8:n] if n >= 8 else block[:n])
            left -= n
            i += 1
        f.flush()
        os.fsync(f.fileno())


def llama_tensors(total_bytes):
    """(name, shape) of a Llama-like bf16 model scaled to about total_bytes."""
    hidden, inter, vocab = 4096, 14336, 128256
    layer = [("self_attn.q_proj.weight", (hidden, hidden)), ("self_attn.k_proj.weight", (1024, hidden)),
             ("self_attn.v_proj.weight", (1024, hidden)), ("self_attn.o_proj.weight", (hidden, hidden)),
             ("mlp.gate_proj.weight", (inter, hidden)), ("mlp.up_proj.weight", (inter, hidden)),
             ("mlp.down_proj.weight", (hidden, inter)), ("input_layernorm.weight", (hidden,)),
             ("post_attention_layernorm.weight", (hidden,))]
    per_layer = sum(2 * _numel(s) for _, s in layer)
    embed = 2 * vocab * hidden
    if total_bytes < 2 * embed + per_layer:
        # Small sizes (CI, quick checks): scale every dimension down.
        scale = max(1, int(((2 * embed + 4 * per_layer) / max(total_bytes, MIB)) ** 0.5))
        hidden, inter, vocab = max(64, hidden // scale), max(64, inter // scale), max(64, vocab // scale)
        hidden, inter = hidden // 8 * 8 + 1, inter // 8 * 8 + 3  # odd sizes: unaligned tensor offsets
        return llama_shapes(hidden, inter, vocab, total_bytes)
    return llama_shapes(hidden, inter, vocab, total_bytes)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def llama_shapes(hidden, inter, vocab, total_bytes):
    kv = max(8, hidden // 4)
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    layer = [("self_attn.q_proj.weight", (hidden, hidden)), ("self_attn.k_proj.weight", (kv, hidden)),
             ("self_attn.v_proj.weight", (kv, hidden)), ("self_attn.o_proj.weight", (hidden, hidden)),
             ("mlp.gate_proj.weight", (inter, hidden)), ("mlp.up_proj.weight", (inter, hidden)),
             ("mlp.down_proj.weight", (hidden, inter)), ("input_layernorm.weight", (hidden,)),
             ("post_attention_layernorm.weight", (hidden,))]
    per_layer = sum(2 * _numel(s) for _, s in layer)
    fixed = 2 * (2 * vocab * hidden + hidden)
    layers = max(1, (total_bytes - fixed) // per_layer)
    for i in range(layers):
        out += [(f"model.layers.{i}.{n}", s) for n, s in layer]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def write_checkpoint(folder, total_bytes, shards):
    """Writes model-0000i-of-0000n.safetensors + model.safetensors.index.json (random bf16 bytes)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors"))
    os.makedirs(folder, exist_ok=True)
    tensors = llama_tensors(total_bytes)
    per_shard = sum(2 * _numel(s) for _, s in tensors) / shards
    groups, cur, acc = [], [], 0
    for t in tensors:
        cur.append(t)
        acc += 2 * _numel(t[1])
        if acc >= per_shard and len(groups) < shards - 1:
            groups.append(cur)
            cur, acc = [], 0
    groups.append(cur)
    weight_map, files = {}, []
    for i, g in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        header, off = {}, 0
        for n, s in g:
            nb = 2 * _numel(s)
            header[n] = {"dtype": "BF16", "shape": list(s), "data_offsets": [off, off + nb]}
            off += nb
            weight_map[n] = name
        hb = json.dumps(header, separators=(",", ":")).encode()
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            left = off
            while left > 0:
                n = min(left, 16 * MIB)
                f.write(os.urandom(n))
                left -= n
            f.flush()
            os.fsync(f.fileno())
        files.append(path)
    with open(index, "w") as f:
        json.dump({"metadata": {"total_size": sum(os.path.getsize(p) for p in files)}, "weight_map": weight_map}, f)
    return files


def dd_parallel(path, threads, request, size, write=False):
    """Raw O_DIRECT with dd: `threads` streams, each its own contiguous slice. Returns GiB/s or None."""
    count_total = size // request
    per = (count_total + threads - 1) // threads
    procs = []
    t0 = time.time()
    for t in range(threads):
        skip = t * per
        count = max(0, min(per, count_total - skip))
        if count == 0:
            continue
        if write:
            cmd = ["dd", "if=/dev/zero", f"of={path}", f"bs={request}", f"seek={skip}", f"count={count}",
                   "oflag=direct", "conv=notrunc", "status=none"]
        else:
            cmd = ["dd", f"if={path}", "of=/dev/null", f"bs={request}", f"skip={skip}", f"count={count}",
                   "iflag=direct", "status=none"]
        procs.append(subprocess.Popen(cmd, stderr=subprocess.PIPE))
    ok = all(p.wait() == 0 for p in procs)
    if write:
        fd = os.open(path, os.O_WRONLY)
        os.fdatasync(fd)
        os.close(fd)
    dt = time.time() - t0
    return (count_total * request) / dt / GIB if ok and dt > 0 else None


def gpu_usable(gdskit):
    try:
        p = subprocess.run([gdskit, "version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=60)
    except OSError as x:
        return False, str(x)
    m = re.search(r"^gpu: (yes|no) \((.*)\)$", p.stdout, re.M)
    if not m:
        return False, "gdskit version printed no gpu line"
    return m.group(1) == "yes", m.group(2)


def first_float(pattern, text):
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else None


def measure_disk(r, a, disk, folder, gpu_ok, gpu_why):
    os.makedirs(os.path.join(r.out, disk), exist_ok=True)
    # A profile folder of this run's own: gdskit starts on this disk with nothing tuned or learned, and what
    # its first process learns is what the later ones start from (as on a machine where gdskit ran before).
    cache = os.path.join(r.out, disk, "profiles")
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["XDG_CACHE_HOME"] = cache
    data = os.path.join(folder, "compare.dat")
    size = int(a.size_gib * GIB) // (16 * MIB) * (16 * MIB)
    log(f"[{disk}] {folder}: data file {size / GIB:.2f} GiB, checkpoint {a.size_gib} GiB in {a.shards} shards")
    write_random(data, size)
    shards = write_checkpoint(os.path.join(folder, "ckpt"), int(a.size_gib * GIB), a.shards)
    ckpt_bytes = sum(os.path.getsize(p) for p in shards)
    gdskit = os.path.join(a.bin, "apps/gdskit/gdskit")
    threads = [int(x) for x in a.threads.split(",")]
    requests = [int(x) * MIB for x in a.requests.split(",")]

    # Ceilings.
    best = (0, None, 0, 0)
    grid = []
    for req in requests:
        for t in threads:
            drop_cache([data])
            g = dd_parallel(data, t, req, size)
            if g:
                grid.append(f"{t}x{req // MIB}M={g:.2f}")
                best = max(best, (g, f"{t} streams x {req // MIB} MiB", t, req))
    with open(os.path.join(r.out, disk, "raw_read_grid.log"), "w") as f:
        f.write(" ".join(grid) + "\n")
    r.put(disk, "ceiling raw O_DIRECT read", best[0], best[1] or "")
    wpath = data + ".wtest"
    wbest = (0, None)
    for req in requests:
        for t in threads:
            if os.path.exists(wpath):
                os.unlink(wpath)
            g = dd_parallel(wpath, t, req, size, write=True)
            if g:
                wbest = max(wbest, (g, f"{t} streams x {req // MIB} MiB"))
    if os.path.exists(wpath):
        os.unlink(wpath)
    r.put(disk, "ceiling raw O_DIRECT write", wbest[0], wbest[1] or "")
    hrb = os.path.join(a.bin, "bench/host_read_bench")
    if os.path.exists(hrb):
        rc, out = r.run(disk, "host_read_bench", [hrb, data, str(size), str(max(threads)), "1"])
        r.put(disk, "ceiling raw read into destination", first_float(r"raw best ([0-9.]+) GiB/s", out))
        r.put(disk, "gdskit pread cold (host_read_bench)", first_float(r"^\(b\) gdskit pread, cold\s+([0-9.]+)", out))

    # gdskit bench: one worker, 1 GiB requests over the whole file, as a loader reads.
    io = str(min(GIB, size))

    def bench(step, x, extra):
        rc, out = r.run(disk, step, [gdskit, "bench", "-f", data, "-w", "1", "-s", str(size), "-i", io,
                                     "-x", x, "--json"] + extra)
        return first_float(r'"throughput_gib_s":\s*([0-9.eE+-]+)', out) if rc == 0 else None

    r.put(disk, "gdskit host read cold", bench("gdskit_host_cold", "host", ["-I", "0", "--cold"]))
    r.put(disk, "gdskit host read warm", bench("gdskit_host_warm", "host", ["-I", "0", "--warm"]))
    if gpu_ok:
        # The first staged read of this disk learns its shape; the second starts from the learned profile.
        r.put(disk, "gdskit staged read cold, first process", bench("gdskit_staged_cold_first", "staged",
                                                                    ["-I", "0", "--cold"]))
        r.put(disk, "gdskit staged read cold", bench("gdskit_staged_cold", "staged", ["-I", "0", "--cold"]))
        r.put(disk, "gdskit staged read warm", bench("gdskit_staged_warm", "staged", ["-I", "0", "--warm"]))
        wfile = data + ".gdskit-w"
        rc, out = r.run(disk, "gdskit_staged_write", [gdskit, "bench", "-f", wfile, "-w", "1", "-s", str(size),
                                                      "-i", io, "-x", "staged", "-I", "1", "--json"])
        r.put(disk, "gdskit staged write", first_float(r'"throughput_gib_s":\s*([0-9.eE+-]+)', out))
        if os.path.exists(wfile):
            os.unlink(wfile)
        gcb = os.path.join(a.bin, "bench/gpu_compare_bench")
        if os.path.exists(gcb):
            rc, out = r.run(disk, "gpu_compare_bench", [gcb, data, str(size), str(max(threads))])
            r.put(disk, "ceiling host->device pinned copy",
                  first_float(r"^\s*pinned host->device copy\s+([0-9]+\.[0-9]+)", out))
            # Its verdicts compare one large transfer with ceilings measured in the same process.
            for key, pattern in (("gcb warm staged / min ceiling", r"warm staged / min\(buffered read.*?([0-9.]+)x"),
                                 ("gcb cold staged / raw read", r"cold staged / parallel O_DIRECT read\s+([0-9.]+)x"),
                                 ("gcb staged write / raw write", r"staged write / parallel O_DIRECT write\s+([0-9.]+)x"),
                                 ("gcb cold staged CPU-s/GiB", r"CPU time of the cold staged read\s+([0-9.]+)")):
                r.put(disk, key, first_float(pattern, out))
    else:
        r.skip(disk, "gdskit staged / write / host->device copy", "no GPU: " + gpu_why)

    # Head to head: the grid's best cell is the largest of a dozen single samples, which flatters the ceiling on
    # a device whose rate wanders. That cell is read again, alternating with gdskit's cold read (a fresh process
    # each, from the profile this disk's earlier processes learned), and the medians are compared. (The host
    # path has its own head to head in host_read_bench, against the raw read into a destination.)
    if gpu_ok and best[1] and a.rounds > 0:
        raw_rounds, ours_rounds = [], []
        for i in range(a.rounds):
            drop_cache([data])
            g = dd_parallel(data, best[2], best[3], size)
            if g:
                raw_rounds.append(g)
            g = bench(f"gdskit_staged_cold_round_{i}", "staged", ["-I", "0", "--cold"])
            if g:
                ours_rounds.append(g)
        if raw_rounds and ours_rounds:
            samples = lambda v: " ".join(f"{g:.2f}" for g in v)
            r.put(disk, "head to head: raw best cell, median", statistics.median(raw_rounds),
                  f"{best[1]}: {samples(raw_rounds)}")
            r.put(disk, "head to head: gdskit staged cold, median", statistics.median(ours_rounds),
                  samples(ours_rounds))

    # gdskit load: the whole checkpoint (index), cold and warm; CPU destination without a GPU.
    device = "0" if gpu_ok else "cpu"
    for state in ("cold", "warm"):
        vals = []
        for i in range(a.runs):
            if state == "cold":
                drop_cache(shards)
            else:
                for p in shards:
                    with open(p, "rb") as f:
                        while f.read(64 * MIB):
                            pass
            rc, out = r.run(disk, f"gdskit_load_{state}_{i}", [gdskit, "load", os.path.join(folder, "ckpt"),
                                                               "--device", device, "--json"])
            v = first_float(r'"gib_per_s":\s*([0-9.eE+-]+)', out) if rc == 0 else None
            if v:
                vals.append(v)
        r.put(disk, f"gdskit load {state}", max(vals) if vals else None, f"device {device}, {ckpt_bytes / GIB:.2f} GiB")

    # The same loads in-process, timed the way the fastsafetensors benchmark times its loads (an untimed first
    # run, then the median of the timed ones): these are the figures set against the peer.
    lb = os.path.join(os.path.dirname(os.path.abspath(__file__)), "load-bench.py")
    rc, out = r.run(disk, "gdskit_load_python", [sys.executable, lb, os.path.join(folder, "ckpt"), "--device",
                                                 "cuda:0" if gpu_ok else "cpu", "--runs", str(max(2, a.runs))])
    for state in ("cold", "warm"):
        r.put(disk, f"gdskit py load {state}", first_float(rf"^gdskit load_{state} ([0-9.]+)", out) if rc == 0 else None,
              "gdskit.load_safetensors in-process, untimed first run, median")

    # Peers.
    peers = os.path.abspath(a.peers)
    kv = os.path.join(peers, "kvikio", "kvikio_bench")

    def peer_blocked(what, key, path):
        why = ("--skip" if key in a.skip else "no GPU: " + gpu_why if not gpu_ok else
               f"{path} missing (copy ../shared/peers into {a.peers})" if not os.path.exists(path) else None)
        if why:
            r.skip(disk, what, why)
        return why is not None

    if not peer_blocked("KvikIO", "kvikio", kv):
        os.chmod(kv, 0o755)
        # kvikio_bench takes whole GiB and creates its file when missing.
        kv_file = data if size % GIB == 0 else os.path.join(folder, "kvikio.dat")
        rc, out = r.run(disk, "kvikio", [kv, kv_file, str(max(1, size // GIB)), "16", "4"],
                        env={"BENCH_RUNS": str(a.runs), "BENCH_MODES": "on"})
        # Every row it prints (the names carry its settings: compat_on, directio_compat_on, ...).
        for what, value in re.findall(r"^kvikio (\S+) ([0-9.]+)", out, re.M):
            r.put(disk, f"kvikio {what}", float(value))
    fst = os.path.join(peers, "fastsafetensors")
    if not peer_blocked("fastsafetensors", "fst", fst):
        site = "/tmp/gdskit-compare-fst"
        if not os.path.isdir(site):
            r.run(disk, "fst_build", ["bash", os.path.join(fst, "build.sh"), site])
        rc, out = r.run(disk, "fst", [sys.executable, os.path.join(fst, "bench_fst.py")] + shards +
                        ["--runs", str(a.runs), "--cold", "--only", "nogds,split", "--site", site],
                        env={"PYTHONPATH": site})
        for what in ("load_cold_nogds", "load_cold_nogds_split", "load_warm_nogds", "load_warm_nogds_split"):
            r.put(disk, f"fst {what}", first_float(rf"^fst {what} ([0-9.]+)", out))


def table(r, disks):
    rows = [
        ("cold read -> GPU / raw read", "gdskit staged read cold", "ceiling raw O_DIRECT read", 0.95),
        ("cold read -> GPU / raw, head to head (medians)", "head to head: gdskit staged cold, median",
         "head to head: raw best cell, median", 0.95),
        ("cold read -> GPU / KvikIO best", "gdskit staged read cold", "kvikio best cold", 1.2),
        ("same, first process on the disk", "gdskit staged read cold, first process", "kvikio best cold", 1.2),
        ("cold write / raw write", "gdskit staged write", "ceiling raw O_DIRECT write", 0.95),
        ("cold load / raw read", "gdskit py load cold", "ceiling raw O_DIRECT read", 0.90),
        ("cold load / fastsafetensors best", "gdskit py load cold", "fst best cold", 1.3),
        ("warm load / fastsafetensors best", "gdskit py load warm", "fst best warm", 2.5),
        # The library's parallel host read (host_read_bench); `gdskit bench -x host` keeps one request in flight
        # per worker, as gdsio does, and is listed above but not judged here.
        ("host cold read / raw read", "gdskit pread cold (host_read_bench)", "ceiling raw O_DIRECT read", 0.95),
        ("host cold read / raw into destination", "gdskit pread cold (host_read_bench)",
         "ceiling raw read into destination", 0.95),
    ]
    # Ratios gpu_compare_bench measured itself (one large transfer, ceilings in the same process).
    direct = [("one transfer: warm read -> GPU / min(buffered, H2D)", "gcb warm staged / min ceiling", 0.90),
              ("one transfer: cold read -> GPU / raw read", "gcb cold staged / raw read", 0.95),
              ("one transfer: write / raw write", "gcb staged write / raw write", 0.95),
              ("one transfer: cold read CPU-s/GiB (at most)", "gcb cold staged CPU-s/GiB", 0.05)]
    lines = [f"{'ratio':<52}" + "".join(f"{d:>22}" for d in disks) + f"{'target':>9}"]
    for label, num, den, target in rows:
        cells = []
        for d in disks:
            res = dict((k[1], v) for k, v in r.results.items() if k[0] == d)
            kv = [v for k, v in res.items() if k.startswith("kvikio read_cold")]
            fs = [v for k, v in res.items() if k.startswith("fst load_cold")]
            fw = [v for k, v in res.items() if k.startswith("fst load_warm")]
            if fw:
                res["fst best warm"] = max(fw)
            if kv:
                res["kvikio best cold"] = max(kv)
            if fs:
                res["fst best cold"] = max(fs)
            n, dv = res.get(num), res.get(den)
            cells.append(f"{n / dv:.3f} ({n:.2f}/{dv:.2f})" if n and dv else "-")
        lines.append(f"{label:<52}" + "".join(f"{c:>22}" for c in cells) + f"{target:>9}")
    for label, key, target in direct:
        cells = [r.results.get((d, key)) for d in disks]
        lines.append(f"{label:<52}" + "".join(f"{c:>22.3f}" if c else f"{'-':>22}" for c in cells) + f"{target:>9}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bin", default="build/release", help="build folder with apps/gdskit/gdskit and bench/*")
    ap.add_argument("--size-gib", type=float, default=8)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3,
                    help="head-to-head rounds: the best raw cell and gdskit's cold read, alternating (0: none)")
    ap.add_argument("--disks", default="virtio,fast")
    ap.add_argument("--virtio-dir", default="/var/tmp/gdskit-compare")
    ap.add_argument("--fastdisk", default="", help="fastdisk.sh (default: PEERS/fastdisk.sh, else ../shared/tools/fastdisk.sh)")
    ap.add_argument("--fast-mnt", default="/mnt/gdskit-fast")
    ap.add_argument("--fast-gib", type=float, default=0, help="loop device size (default: 3 x size + 2)")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--requests", default="1,4,8,16", help="MiB")
    ap.add_argument("--peers", default=".peers")
    ap.add_argument("--skip", default="")
    ap.add_argument("--keep", action="store_true", help="keep data files and the loop device")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    r = Runner(a.out)
    gdskit = os.path.join(a.bin, "apps/gdskit/gdskit")
    if not os.path.exists(gdskit):
        sys.exit(f"compare-bench: {gdskit} not found (--bin)")
    if not a.fastdisk:
        a.fastdisk = next((p for p in (os.path.join(a.peers, "fastdisk.sh"), "../shared/tools/fastdisk.sh")
                           if os.path.exists(p)), "fastdisk.sh")
    gpu_ok, gpu_why = (False, "--skip gpu") if "gpu" in a.skip else gpu_usable(gdskit)
    log(f"gpu: {gpu_why}")
    disks = [d for d in a.disks.split(",") if d]
    done = []
    for disk in disks:
        made_fast = False
        folder = None
        try:
            if disk == "virtio":
                os.makedirs(a.virtio_dir, exist_ok=True)
                folder = a.virtio_dir
            elif disk == "fast":
                if not os.path.ismount(a.fast_mnt):
                    gib = int(a.fast_gib) or int(3 * a.size_gib + 2)  # fastdisk.sh takes whole GiB
                    rc, out = r.run(disk, "fastdisk_up", ["bash", a.fastdisk, "up", str(gib), a.fast_mnt])
                    if rc != 0:
                        r.skip(disk, "all", "fastdisk.sh up failed: " + out.strip()[-200:])
                        continue
                    made_fast = True
                folder = os.path.join(a.fast_mnt, "compare")
                os.makedirs(folder, exist_ok=True)
            else:
                folder = disk
                disk = os.path.basename(disk.rstrip("/")) or "dir"
                os.makedirs(folder, exist_ok=True)
            # A folder of this run's own inside the one given: nothing there is overwritten or removed.
            folder = tempfile.mkdtemp(prefix="gdskit-compare-", dir=folder)
            measure_disk(r, a, disk, folder, gpu_ok, gpu_why)
            done.append(disk)
        finally:
            if not a.keep and folder is not None and os.path.basename(folder).startswith("gdskit-compare-"):
                shutil.rmtree(folder, ignore_errors=True)
            if made_fast and not a.keep:
                r.run(disk, "fastdisk_down", ["bash", a.fastdisk, "down", a.fast_mnt])
    t = table(r, done)
    skipped = "\n".join(f"skipped [{d}] {w}: {y}" for d, w, y in r.skipped)
    log("\n" + t + ("\n\n" + skipped if skipped else ""))
    with open(os.path.join(a.out, "table.txt"), "w") as f:
        f.write(t + "\n" + skipped + "\n")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"results": [{"disk": k[0], "name": k[1], "gib_per_s": v, "note": r.notes.get(k, "")}
                               for k, v in r.results.items()],
                   "skipped": [{"disk": d, "what": w, "why": y} for d, w, y in r.skipped]}, f, indent=1)


if __name__ == "__main__":
    main()
