"""What the benchmark scripts share: the Llama-shaped state dict, the raw O_DIRECT writer of the write ceilings,
fsync of a written file and the THREADSxMIB cell lists. Scripts run as `python3 scripts/NAME.py` import it
directly (their folder is first on sys.path)."""

import mmap
import os
import resource
import threading
import time

MIB = 1 << 20
GIB = 1 << 30


def cells_of(text):
    """"4x1,2x2" -> [(4, 1), (2, 2)]: (threads or depth, MiB) pairs."""
    out = []
    for c in filter(None, text.split(",")):
        t, r = c.lower().split("x")
        out.append((int(t), int(r)))
    return out


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(fn, device):
    """Runs fn(): seconds, CPU seconds of this process (all threads) and the bytes fn allocated on `device` beyond
    what was there (0 on the CPU)."""
    import torch  # noqa: PLC0415
    gpu = torch.device(device).type == "cuda"
    if gpu:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return dt, cpu, torch.cuda.max_memory_allocated(device) - base if gpu else 0


def llama_state(size_gib, device):
    """A Llama-shaped bf16 state dict of about size_gib on `device` ("cpu" or a CUDA device; hidden 4096, MLP 11008, vocabulary 32000, as
    many layers as fit), random and reproducible. Returns (state dict, layers)."""
    import torch  # noqa: PLC0415
    hidden, inter, vocab = 4096, 11008, 32000
    per_layer = (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden) * 2
    fixed = (2 * vocab * hidden + hidden) * 2
    layers = max(1, round((size_gib * GIB - fixed) / per_layer))
    if torch.device(device).type == "cuda":
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    else:
        # The CPU's generator fills a few hundred MB/s: random bytes copied from one block, at another start in
        # each tensor (the bytes are written, never computed with).
        made = [0]

        def w(*shape):
            t = torch.empty(*shape, dtype=torch.bfloat16)
            fill_random(t, made[0])
            made[0] += 1
            return t

    sd = {"model.embed_tokens.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{n}.weight"] = w(hidden, hidden)
        sd[p + "mlp.gate_proj.weight"] = w(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = w(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = w(hidden, inter)
        sd[p + "input_layernorm.weight"] = w(hidden)
        sd[p + "post_attention_layernorm.weight"] = w(hidden)
    sd["model.norm.weight"] = w(hidden)
    sd["lm_head.weight"] = w(vocab, hidden)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return sd, layers


_BLOCK = None


def fill_random(t, seed=0):
    """Fills the CPU tensor `t` with random bytes at memory-copy speed: 64 MiB of os.urandom copied over it, from
    a start that depends on `seed`."""
    import torch  # noqa: PLC0415
    global _BLOCK
    if _BLOCK is None:
        b = torch.frombuffer(bytearray(os.urandom(64 * MIB)), dtype=torch.uint8)
        _BLOCK = torch.cat([b, b])
    k = 64 * MIB
    start = (seed * 1048573) % k
    flat = t.view(-1).view(torch.uint8)
    for off in range(0, flat.numel(), k):
        m = min(k, flat.numel() - off)
        flat[off:off + m].copy_(_BLOCK[start:start + m])


def write_once(path, prepare, nbytes, threads, request, source_bytes=0):
    """The raw O_DIRECT writer: `threads` threads of `request`-byte writes into a new file at `path` (deleted
    afterwards), then fdatasync; returns GiB/s, the file's preparation included. prepare: "fallocate" (reserved
    blocks, as gdskit's saves do), "ftruncate" (a hole) or "grown" (nothing: the writes grow the file).
    source_bytes 0: each thread writes one reused buffer (which stays in the CPU's cache); else the requests take
    their bytes in file order from one buffer of that size (a source the cache cannot hold). A file already at
    `path` is left alone (FileExistsError): the caller names a file of its own."""
    count = (nbytes + request - 1) // request
    if source_bytes:
        src = mmap.mmap(-1, source_bytes)
        for off in range(0, source_bytes, 16 * MIB):
            src[off:off + 16 * MIB] = os.urandom(16 * MIB)
        view = memoryview(src)
        slots = source_bytes // request
        sources = [view[s * request:(s + 1) * request] for s in range(slots)]
    else:
        sources = []
        for _ in range(threads):
            b = mmap.mmap(-1, request)
            b.write(os.urandom(request))
            sources.append(b)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
    try:
        taken = [0]
        lock = threading.Lock()
        t0 = time.perf_counter()
        if prepare == "fallocate":
            os.posix_fallocate(fd, 0, count * request)
        elif prepare == "ftruncate":
            os.ftruncate(fd, count * request)

        def writer(i):
            while True:
                with lock:
                    k = taken[0]
                    taken[0] += 1
                if k >= count:
                    return
                os.pwrite(fd, sources[k % len(sources)] if source_bytes else sources[i], k * request)

        pool = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        os.fdatasync(fd)
        return count * request / (time.perf_counter() - t0) / GIB
    finally:
        os.close(fd)
        os.unlink(path)
        if source_bytes:
            for s in sources:
                s.release()
            view.release()
            src.close()
