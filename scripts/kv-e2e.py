#!/usr/bin/env python3
"""A long prompt's KV cache through the gdskit block store and back, with a real model runtime.

A Llama-shaped model with random weights (made on the spot, nothing downloaded) prefills a long prompt; its
KV cache (past_key_values) is laid out as store blocks and put into the store, and freed from GPU memory. For a
follow-up turn the cache comes back and the model continues. Reported: time to first token of the follow-up
turn when the prefix is recomputed, when its cache is read from the store cold (page cache dropped), and with
the common workaround (torch.save of the cache to a file in the same folder, torch.load back, also cold);
the continued logits must equal those of the uninterrupted run bit for bit (exit status 1 otherwise).

    GPU machine (transformers installed):
        python3 scripts/kv-e2e.py --store /mnt/kvtest --tokens 32768 --json kv-e2e.json
    Without transformers (or with --layout-only): the same store and layout path on a synthetic cache of the
    model's shapes, checked byte for byte, with the model part skipped and the reason printed:
        python3 scripts/kv-e2e.py --store /tmp/kv --device cpu --tiny

Layout: a store block holds --block-tokens tokens of every layer, K then V per layer, each as [kv_heads,
block_tokens, head_dim] in the cache's dtype; its key chains the prompt's token ids (as prefix caching does).
The prompt length must be a multiple of --block-tokens, so the whole prefix is stored. A run works in its own
subfolder of --store (removed at the end unless --keep). Exit status 77 when gdskit.kv is not in this build.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time

GIB = 1 << 30
MIB = 1 << 20


# ---- layout: past_key_values <-> store blocks (no model needed) ------------------------------------------------

def cache_layers(cache):
    """[(k, v)] per layer, each [batch, kv_heads, seq, head_dim], from a transformers cache (any recent layout)
    or a tuple of (k, v) pairs."""
    if hasattr(cache, "layers") and cache.layers and hasattr(cache.layers[0], "keys"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(k, v) for k, v in cache]


def block_keys(token_ids, block_tokens: int, namespace: str):
    """One 32-byte key per full block of token_ids: each key hashes the previous key and the block's tokens, so a
    block's key names its whole prefix."""
    keys, prev = [], hashlib.blake2b(namespace.encode(), digest_size=32).digest()
    for b in range(len(token_ids) // block_tokens):
        chunk = ",".join(str(int(t)) for t in token_ids[b * block_tokens:(b + 1) * block_tokens])
        prev = hashlib.blake2b(prev + chunk.encode(), digest_size=32).digest()
        keys.append(prev)
    return keys


def block_bytes_of(layers: int, kv_heads: int, head_dim: int, element_size: int, block_tokens: int) -> int:
    return layers * 2 * kv_heads * block_tokens * head_dim * element_size


def pack_blocks(torch, layers, block_tokens: int):
    """The cache of the first (seq // block_tokens) * block_tokens tokens as a uint8 tensor [blocks, block_bytes]
    on the cache's device. Batch size 1."""
    k0 = layers[0][0]
    if k0.shape[0] != 1:
        raise ValueError(f"batch size {k0.shape[0]}: the layout holds one sequence")
    heads, seq, dim = k0.shape[1], k0.shape[2], k0.shape[3]
    n = seq // block_tokens
    part = heads * block_tokens * dim * k0.element_size()
    out = torch.empty((n, 2 * len(layers) * part), dtype=torch.uint8, device=k0.device)
    col = 0
    for k, v in layers:
        for t in (k, v):
            if tuple(t.shape) != (1, heads, seq, dim) or t.dtype != k0.dtype:
                raise ValueError(f"layer tensor of shape {tuple(t.shape)} and {t.dtype}, not {(1, heads, seq, dim)}")
            blocks = t[0, :, :n * block_tokens].reshape(heads, n, block_tokens, dim).permute(1, 0, 2, 3)
            out[:, col:col + part].copy_(blocks.reshape(n, -1).view(torch.uint8))
            col += part
    return out


def unpack_blocks(torch, staging, n_layers: int, kv_heads: int, head_dim: int, dtype, block_tokens: int):
    """The inverse of pack_blocks: [(k, v)] per layer, each [1, kv_heads, blocks * block_tokens, head_dim]."""
    n = staging.shape[0]
    part = staging.shape[1] // (2 * n_layers)
    out, col = [], 0
    for _ in range(n_layers):
        pair = []
        for _ in range(2):
            x = staging[:, col:col + part].contiguous().view(dtype).view(n, kv_heads, block_tokens, head_dim)
            pair.append(x.permute(1, 0, 2, 3).reshape(1, kv_heads, n * block_tokens, head_dim))
            col += part
        out.append(tuple(pair))
    return out


# ---- page cache ----------------------------------------------------------------------------------------------------

def drop_tree(path):
    """fdatasync and posix_fadvise(DONTNEED) every regular file under path (no root needed)."""
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# ---- the run ---------------------------------------------------------------------------------------------------

def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__[__doc__.index("\n\n") + 2:])
    ap.add_argument("--store", required=True, help="folder for the store (on the device to measure)")
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    ap.add_argument("--tokens", type=int, default=32768, help="prompt tokens, a multiple of --block-tokens")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens of the follow-up turn")
    ap.add_argument("--block-tokens", type=int, default=64, help="tokens per store block")
    shape = ap.add_argument_group("model shape (Llama, random weights; the defaults make 2 MiB blocks and a "
                                  "1 GiB cache at 32K tokens)")
    shape.add_argument("--layers", type=int, default=8)
    shape.add_argument("--hidden", type=int, default=4096)
    shape.add_argument("--heads", type=int, default=32, help="attention heads")
    shape.add_argument("--kv-heads", type=int, default=8, help="key/value heads")
    shape.add_argument("--intermediate", type=int, default=14336, help="MLP size")
    shape.add_argument("--vocab", type=int, default=32000)
    shape.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per path (the median is reported)")
    ap.add_argument("--capacity-gib", type=float, default=None, help="store capacity (default: twice the cache)")
    ap.add_argument("--deadline-s", type=float, default=30.0, help="store deadline per operation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="small sizes for a CPU check (2 layers, 256 tokens)")
    ap.add_argument("--layout-only", action="store_true", help="skip the model even when transformers is present")
    ap.add_argument("--keep", action="store_true", help="keep the run's folder")
    ap.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    a = ap.parse_args(argv)
    if a.tiny:
        a.tokens, a.new_tokens, a.block_tokens, a.layers = 256, 8, 16, 2
        a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab = 256, 4, 2, 512, 1000
        a.rounds = min(a.rounds, 2)
    for name in ("tokens", "new_tokens", "block_tokens", "layers", "hidden", "heads", "kv_heads", "intermediate",
                 "vocab", "rounds"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if a.tokens % a.block_tokens:
        ap.error(f"--tokens {a.tokens} is not a multiple of --block-tokens {a.block_tokens}")
    if a.hidden % a.heads or a.heads % a.kv_heads:
        ap.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    return a


def _store_class():
    try:
        from gdskit.kv import BlockStore  # noqa: PLC0415
    except ImportError as e:
        return None, f"gdskit.kv.BlockStore is not in this build ({e})"
    return BlockStore, None


def _transformers():
    if os.environ.get("GDSKIT_E2E_NO_TRANSFORMERS"):
        return None, "GDSKIT_E2E_NO_TRANSFORMERS is set"
    try:
        import transformers  # noqa: PLC0415
    except ImportError as e:
        return None, f"transformers is not installed ({e}); Debian 12 has no python3-transformers package"
    return transformers, None


def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Model:
    """The Llama-shaped model with random weights, and the forward passes of the run."""

    def __init__(self, torch, transformers, a, device, dtype):
        cfg = transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                                       num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                       num_key_value_heads=a.kv_heads,
                                       max_position_embeddings=a.tokens + a.new_tokens + 16)
        torch.manual_seed(a.seed)
        if hasattr(torch.device, "__enter__"):  # create the weights on the device (fast), where supported
            with device:
                m = transformers.LlamaForCausalLM(cfg)
        else:
            m = transformers.LlamaForCausalLM(cfg)
        self.m = m.to(device=device, dtype=dtype).eval()
        self.torch, self.transformers, self.device = torch, transformers, device

    def forward(self, ids, cache=None):
        """(logits of the last position [vocab], cache) after running ids on top of cache."""
        with self.torch.inference_mode():
            out = self.m.model(input_ids=ids, past_key_values=cache, use_cache=True)
            logits = self.m.lm_head(out.last_hidden_state[:, -1:]).float()[0, 0]
        return logits, out.past_key_values

    def cache_of(self, layers):
        cache = self.transformers.DynamicCache()
        for i, (k, v) in enumerate(layers):
            cache.update(k, v, i)
        return cache


def run(a, store_class=None, out=print):
    """The whole run; returns the report (dict). store_class: the BlockStore class (gdskit.kv's by default)."""
    import torch  # noqa: PLC0415

    report = {"ok": False}
    if store_class is None:
        store_class, why = _store_class()
        if store_class is None:
            report["skipped"] = why
            return report
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, a.dtype)
    transformers, model_skip = (None, "--layout-only") if a.layout_only else _transformers()
    head_dim = a.hidden // a.heads
    elem = torch.empty((), dtype=dtype).element_size()
    bbytes = block_bytes_of(a.layers, a.kv_heads, head_dim, elem, a.block_tokens)
    n_blocks = a.tokens // a.block_tokens
    cache_bytes = n_blocks * bbytes
    report.update(device=str(device), dtype=a.dtype, tokens=a.tokens, new_tokens=a.new_tokens, layers=a.layers,
                  kv_heads=a.kv_heads, head_dim=head_dim, block_tokens=a.block_tokens, block_bytes=bbytes,
                  blocks=n_blocks, cache_bytes=cache_bytes, model=transformers is not None, model_skipped=model_skip,
                  torch=torch.__version__, transformers=getattr(transformers, "__version__", None))
    out(f"KV cache: {a.tokens} tokens x {a.layers} layers = {cache_bytes / MIB:.1f} MiB in {n_blocks} blocks of "
        f"{bbytes / MIB:.2f} MiB on {device}")
    if model_skip:
        out(f"model part skipped: {model_skip}")

    work = os.path.join(a.store, f"kv-e2e-{os.getpid()}")
    os.makedirs(work)
    store_dir = os.path.join(work, "store")
    os.makedirs(store_dir)
    save_path = os.path.join(work, "cache.pt")
    capacity = int(a.capacity_gib * GIB) if a.capacity_gib else 2 * cache_bytes + 64 * MIB
    namespace = f"kv-e2e|{a.layers}x{a.kv_heads}x{head_dim}|{a.dtype}|{a.block_tokens}|seed{a.seed}"
    g = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(0, a.vocab, (1, a.tokens), generator=g)
    follow = torch.randint(0, a.vocab, (1, a.new_tokens), generator=g)
    keys = block_keys(prompt[0].tolist(), a.block_tokens, namespace)
    try:
        store = store_class(store_dir, capacity_bytes=capacity, block_bytes=bbytes, namespace=namespace,
                            durability="cache", deadline_s=a.deadline_s)
        try:
            report.update(_measure(torch, a, store, keys, bbytes, prompt, follow, transformers, device, dtype,
                                   head_dim, save_path, out))
        finally:
            store.close()
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return report


def _timed(torch, device, fn):
    _sync(torch, device)
    t0 = time.perf_counter()
    r = fn()
    _sync(torch, device)
    return time.perf_counter() - t0, r


def _measure(torch, a, store, keys, bbytes, prompt, follow, transformers, device, dtype, head_dim, save_path, out):
    rep = {}
    model = Model(torch, transformers, a, device, dtype) if transformers is not None else None
    prompt_d, follow_d, full_d = prompt.to(device), follow.to(device), torch.cat([prompt, follow], 1).to(device)

    # Prefill (the model's cache) or a synthetic cache of the same shapes.
    if model is not None:
        model.forward(prompt_d[:, :a.block_tokens])  # kernels loaded before anything is timed
        t, (_, cache) = _timed(torch, device, lambda: model.forward(prompt_d))
        rep["prefill_s"] = t
        layers = [(k.clone(), v.clone()) for k, v in cache_layers(cache)]
    else:
        g = torch.Generator().manual_seed(a.seed + 2)
        layers = [tuple(torch.randn((1, a.kv_heads, a.tokens, head_dim), generator=g).to(device=device, dtype=dtype)
                        for _ in range(2)) for _ in range(a.layers)]
        cache = None
    packed = pack_blocks(torch, layers, a.block_tokens)
    reference = None
    if model is not None:
        t, (reference, grown) = _timed(torch, device, lambda: model.forward(follow_d, cache))
        rep["ttft_uninterrupted_s"] = t
        del grown

    # Offload: the store, and the workaround (torch.save to a file in the same folder, made durable).
    t, mask = _timed(torch, device, lambda: store.put(keys, packed))
    if not all(mask):
        raise RuntimeError(f"the store took {sum(map(bool, mask))} of {len(keys)} blocks")
    rep["put_s"] = t

    def save():
        torch.save([(k, v) for k, v in layers], save_path)
        fd = os.open(save_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    rep["torch_save_s"], _ = _timed(torch, device, save)
    expect = [(k.cpu(), v.cpu()) for k, v in layers] if model is None else None
    if device.type == "cuda":
        rep["gpu_bytes_before_free"] = torch.cuda.memory_allocated(device)
    del layers, packed, cache
    if device.type == "cuda":
        torch.cuda.empty_cache()
        rep["gpu_bytes_after_free"] = torch.cuda.memory_allocated(device)
        out(f"GPU memory: {rep['gpu_bytes_before_free'] / GIB:.2f} GiB with the cache, "
            f"{rep['gpu_bytes_after_free'] / GIB:.2f} GiB after freeing it (the model's weights)")

    n_layers, bt = a.layers, a.block_tokens

    def from_store():
        staging = torch.empty((len(keys), bbytes), dtype=torch.uint8, device=device)
        t0 = time.perf_counter()
        hits = store.get(keys, staging)
        _sync(torch, device)
        t_get = time.perf_counter() - t0
        if not all(hits):
            raise RuntimeError(f"the store returned {sum(map(bool, hits))} of {len(keys)} blocks")
        return unpack_blocks(torch, staging, n_layers, a.kv_heads, head_dim, dtype, bt), t_get

    def from_file():
        t0 = time.perf_counter()
        loaded = torch.load(save_path, map_location=device)
        _sync(torch, device)
        return loaded, time.perf_counter() - t0

    paths = {"store_cold": from_store, "torch_load_cold": from_file}
    times = {name: [] for name in paths}
    io = {name: [] for name in paths}
    same = {name: True for name in paths}
    if model is not None:
        times["recompute"] = []
    for _ in range(a.rounds):
        if model is not None:
            t, (logits, c) = _timed(torch, device, lambda: model.forward(full_d))
            times["recompute"].append(t)
            rep["recompute_max_abs_diff"] = float((logits - reference).abs().max())
            del c, logits
        for name, fetch in paths.items():
            drop_tree(os.path.dirname(save_path))
            if device.type == "cuda":
                torch.cuda.empty_cache()

            def turn():
                got, t_io = fetch()
                if model is None:
                    return got, t_io, None
                logits, _ = model.forward(follow_d, model.cache_of(got))
                int(logits.argmax())  # the first token
                return got, t_io, logits
            t, (got, t_io, logits) = _timed(torch, device, turn)
            times[name].append(t)
            io[name].append(t_io)
            if model is not None:
                same[name] &= bool(torch.equal(logits, reference))
            else:
                same[name] &= all(torch.equal(x.cpu().view(torch.uint8), y.view(torch.uint8))
                                  for pair_a, pair_b in zip(got, expect) for x, y in zip(pair_a, pair_b))
            del got, logits
    label = "ttft" if model is not None else "load"
    for name, ts in times.items():
        rep[f"{label}_{name}_s"] = statistics.median(ts)
        rep[f"{label}_{name}_rounds_s"] = ts
    for name, ts in io.items():
        rep[f"read_{name}_s"] = statistics.median(ts)
        rep[f"read_{name}_gib_per_s"] = len(keys) * bbytes / GIB / statistics.median(ts)
    rep["equal"] = same
    rep["ok"] = all(same.values())
    rep["store_stats"] = store.stats()
    what = "continued logits equal the uninterrupted run's" if model is not None else "cache bytes equal"
    out(f"{label} (median of {a.rounds}): " + ", ".join(f"{n} {rep[f'{label}_{n}_s'] * 1e3:.1f} ms" for n in times))
    out("read part: " + ", ".join(f"{n} {rep[f'read_{n}_s'] * 1e3:.1f} ms" for n in io))
    out(f"{what}: " + ", ".join(f"{n} {'yes' if s else 'NO'}" for n, s in same.items()))
    if "recompute_max_abs_diff" in rep:
        out(f"recomputed logits differ from the uninterrupted run by at most {rep['recompute_max_abs_diff']:.3g} "
            "(other kernel shapes; not required equal)")
    return rep


def main(argv=None):
    a = parse(argv)
    if not os.path.isdir(a.store):
        print(f"kv-e2e: --store {a.store!r} is not a folder", file=sys.stderr)
        return 2
    report = run(a)
    if "skipped" in report:
        print(f"kv-e2e: skipped: {report['skipped']}")
        return 77
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
