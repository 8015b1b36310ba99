"""Distributed load and save over the job's own torch.distributed process group.

    import gdskit, torch.distributed as dist
    dist.init_process_group("nccl")
    sd = gdskit.load_safetensors("/models/llama-70b", device=f"cuda:{local_rank}", group=dist.group.WORLD,
                                 tp_rank=dist.get_rank(), tp_world=dist.get_world_size(),
                                 placement=gdskit.distributed.llama_tp)

Every byte a node needs is read from storage once on that node: each rank reads a disjoint share of what the
ranks of its node need (its own slices, plus a share of the tensors several of them need, balanced by bytes and
contiguous in the file), then the shared parts are broadcast as raw bytes over subgroups of the node's ranks.
gdskit moves bytes between storage and memory; the process group moves them between ranks. See
docs/distributed.md for the placement contract, what is read where, the statistics and the limits.
"""

from __future__ import annotations

import errno as _errno
import hashlib
import json
import os
import socket
import time

from . import _frameworks
from . import _gdskit
from ._buffers import buffer_of

__all__ = ["load_safetensors", "save_sharded", "last_stats", "llama_tp", "REPLICATED", "COLUMN", "ROW",
           "NODE_ENV"]

REPLICATED = "replicated"
COLUMN = ("split", 0)   # column parallel: output features (rows of the weight) split across ranks
ROW = ("split", 1)      # row parallel: input features (columns of the weight) split across ranks
NODE_ENV = "GDSKIT_NODE"  # overrides the host name as the node identity (tests simulate several nodes)

# Segments of a strided slice below this size are read by the single-process loader through a window that
# spans the neighbouring ranks' bytes (the loader's own figure). When several ranks of a node need different
# slices of such a tensor, one rank reads the whole tensor and broadcasts it.
_DIRECT_SEGMENT_BYTES = _gdskit.LOAD_DIRECT_SEGMENT_BYTES

_last_stats: dict = {}
_subgroups: dict = {}


def last_stats() -> dict:
    """Statistics of this rank's last distributed load or save (see docs/distributed.md)."""
    return dict(_last_stats)


# ---------------------------------------------------------------------------------------------------------------
# Placement rules

_LLAMA_COLUMN = ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj",
                 "embed_tokens", "lm_head", "wq", "wk", "wv", "w1", "w3", "tok_embeddings", "output")
_LLAMA_ROW = ("o_proj", "down_proj", "wo", "w2")


def llama_tp(name: str, shape, dtype) -> object:
    """Megatron-style tensor parallelism for Llama-family checkpoints (Hugging Face and Meta names):
    q/k/v/gate/up projections, embeddings and lm_head split along dim 0 (column parallel), o/down projections
    along dim 1 (row parallel; their biases replicated), everything else (norms, rotary tables) replicated."""
    del dtype
    parts = name.split(".")
    module = parts[-2] if len(parts) >= 2 else ""
    leaf = parts[-1]
    if module in _LLAMA_COLUMN:
        return COLUMN
    if module in _LLAMA_ROW:
        return ROW if leaf == "weight" and len(shape) >= 2 else REPLICATED
    return REPLICATED


# ---------------------------------------------------------------------------------------------------------------
# Planning: deterministic on every rank from the headers, the placement and every rank's (node, tp) identity.

class _Info:
    """One tensor of the checkpoint as its header describes it."""

    __slots__ = ("name", "dtype", "shape", "file_index", "file_offset", "nbytes")

    def __init__(self, name, dtype, shape, file_index, file_offset, nbytes):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.file_index, self.file_offset, self.nbytes = file_index, file_offset, nbytes


def _fail(code, msg, op="load"):
    return OSError(code, f"gdskit distributed {op}: {msg}")


def _read_headers(path, only):
    """Files in load order, their tensors as [_Info] in file order, each file's header size in bytes, and what
    identifies the checkpoint across ranks: per file (name relative to the path, size, digest of its header)."""
    shards = _gdskit.resolve_shards(os.fspath(path))
    base = os.fspath(path) if os.path.isdir(path) else (os.path.dirname(os.fspath(path)) or os.curdir)
    files, infos, header_sizes, identity = [], [], [], []
    used = [False] * len(only or [])
    for fi, (file, names) in enumerate(shards):
        entries, metadata = _gdskit.header(file)
        size = os.path.getsize(file)
        text = json.dumps([entries, metadata], sort_keys=True)
        identity.append((os.path.relpath(file, base), size, hashlib.sha256(text.encode()).hexdigest()))
        starts = [e["file_offset"] - e["data_offsets"][0] for e in entries]
        header_sizes.append(min(starts) if starts else size)
        wanted = set(names) if names else None
        for e in entries:
            if wanted is not None and e["name"] not in wanted:
                continue
            if only:
                hit = [i for i, o in enumerate(only) if _gdskit.name_matches(o, e["name"])]
                if not hit:
                    continue
                for i in hit:
                    used[i] = True
            b, end = e["data_offsets"]
            infos.append(_Info(e["name"], e["dtype"], e["shape"], fi, e["file_offset"], end - b))
        files.append(file)
    for i, u in enumerate(used):
        if not u:
            raise _fail(_errno.EINVAL, f"no tensor matches {only[i]!r} in {path}")
    infos.sort(key=lambda t: (t.file_index, t.file_offset, t.name))
    return files, infos, header_sizes, identity


def _same_checkpoint(identities, plans):
    """Raises the same EINVAL on every rank (each computes it from the same gathered values) unless every rank
    sees the same files (names, sizes and headers) and derived the same plan from them."""
    mine = identities[0]
    for r, other in enumerate(identities[1:], 1):
        if other == mine:
            continue
        names0, names = [f[0] for f in mine], [f[0] for f in other]
        if names != names0:
            i = next((i for i, (a, b) in enumerate(zip(names0, names)) if a != b), min(len(names0), len(names)))
            say = lambda ns: repr(ns[i]) if i < len(ns) else "nothing"  # noqa: E731
            what = (f"file {i + 1} is {say(names0)} of {len(names0)} on rank 0 and {say(names)} of {len(names)} "
                    f"on rank {r}")
        else:
            (f, size0, h0), (_, size, h) = next((a, b) for a, b in zip(mine, other) if a != b)
            what = (f"{f!r} is {size0} bytes on rank 0 and {size} on rank {r}" if size != size0 else
                    f"the header of {f!r} differs between rank 0 and rank {r}")
        raise _fail(_errno.EINVAL, f"the ranks do not see the same checkpoint: {what}; every rank must load the "
                                   "same files (same names, sizes and headers)")
    for r, other in enumerate(plans[1:], 1):
        if other != plans[0]:
            raise _fail(_errno.EINVAL, f"rank 0 and rank {r} planned different loads from the same files: the "
                                       "placement, only= and tp_world must give the same on every rank")


def _normalize(t: _Info, spec, world, tps):
    """Per rank: None (not needed), "whole", or (dim, index, count) (numpy.array_split piece)."""
    whole = ["whole"] * world
    if spec is None:
        return [None] * world
    if isinstance(spec, str):
        if spec == REPLICATED:
            return whole
        raise _fail(_errno.EINVAL, f"placement of {t.name!r}: unknown rule {spec!r}")
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "split":
        dim = spec[1]
        if not isinstance(dim, int) or dim < 0:
            raise _fail(_errno.EINVAL, f"placement of {t.name!r}: split dimension must be an int >= 0, not {dim!r}")
        if dim >= len(t.shape):
            return whole  # biases, norms and scalars of a split layer: every rank takes them whole
        if tps is None:
            raise _fail(_errno.EINVAL, f"placement of {t.name!r} splits it: pass tp_rank and tp_world")
        return [_piece(t, (dim, r, n)) for r, n in tps]
    if isinstance(spec, dict):
        out = [None] * world
        for r, v in spec.items():
            if not isinstance(r, int) or not 0 <= r < world:
                raise _fail(_errno.EINVAL, f"placement of {t.name!r}: rank {r!r} is not in the group of {world}")
            if v is None:
                continue
            if v in ("full", REPLICATED, True):
                out[r] = "whole"
            elif isinstance(v, tuple) and len(v) == 4 and v[0] == "split":
                out[r] = _piece(t, tuple(v[1:]))
            else:
                raise _fail(_errno.EINVAL, f"placement of {t.name!r}, rank {r}: {v!r} is not None, 'full' or "
                                           "('split', dim, index, count)")
        return out
    raise _fail(_errno.EINVAL, f"placement of {t.name!r}: {spec!r} is not 'replicated', ('split', dim), a "
                               "{rank: part} dict or None")


def _piece(t: _Info, key):
    dim, k, n = key
    if not all(isinstance(x, int) for x in key) or n <= 0 or not 0 <= k < n or dim < 0:
        raise _fail(_errno.EINVAL, f"placement of {t.name!r}: bad split {key!r} (need 0 <= index < count)")
    if dim >= len(t.shape):
        return "whole"
    return (dim, k, n)


def _row_bytes(t: _Info, dim):
    """Bytes of one index of dimension `dim`: the loader's slice plan says (a split along it reads such rows)."""
    return _gdskit.slice_plan(t.dtype, list(t.shape), dim, 0, 1)[4]


def _slice_bytes(t: _Info, key):
    if key == "whole":
        return t.nbytes
    _, seg, _, segments, _ = _gdskit.slice_plan(t.dtype, list(t.shape), *key)
    return seg * segments


class _Unit:
    """Bytes of one tensor that one rank reads for a set of ranks of its node."""

    __slots__ = ("t", "key", "needers", "reader", "post")

    def __init__(self, t, key, needers, post=False):
        self.t, self.key, self.needers, self.reader, self.post = t, key, needers, None, post


def _plan(infos, needs_of, nodes):
    """Units per node with readers assigned; needs_of[i][r] as _normalize returns."""
    node_ranks = {}
    for r, n in enumerate(nodes):
        node_ranks.setdefault(n, []).append(r)
    units = []
    for node in sorted(node_ranks):
        ranks = node_ranks[node]
        mine = []
        for t, needs in zip(infos, needs_of):
            by_key = {}
            for r in ranks:
                if needs[r] is not None:
                    by_key.setdefault(needs[r], []).append(r)
            if not by_key:
                continue
            split_keys = [k for k in by_key if k != "whole"]
            strided = [k for k in split_keys if k[0] > 0 and t.shape[k[0]] > 0 and
                       _row_bytes(t, k[0]) < _DIRECT_SEGMENT_BYTES]
            if len(by_key) > 1 and strided:
                # Several ranks need different small-row slices: reading each would read the tensor many times.
                mine.append(_Unit(t, "whole", tuple(sorted(r for rs in by_key.values() for r in rs)), post=True))
                continue
            for key, rs in by_key.items():
                mine.append(_Unit(t, key, tuple(rs)))
        load = {r: 0 for r in ranks}
        shared = {}
        for u in mine:
            if len(u.needers) == 1:
                u.reader = u.needers[0]
                load[u.reader] += _slice_bytes(u.t, u.key)
            else:
                shared.setdefault(u.needers, []).append(u)
        for needers in sorted(shared):
            _assign(shared[needers], needers, load)
        units.extend(mine)
    return units


def _assign(units, needers, load):
    """Contiguous runs of `units` (in file order) to `needers`, evening out the bytes each rank reads."""
    units.sort(key=lambda u: (u.t.file_index, u.t.file_offset, str(u.key)))
    sizes = [_slice_bytes(u.t, u.key) for u in units]
    total = sum(sizes) + sum(load[r] for r in needers)
    target = total / len(needers)
    i = 0
    for j, r in enumerate(needers):
        last = j == len(needers) - 1
        while i < len(units):
            s = sizes[i]
            if not last and load[r] > 0 and load[r] + s / 2 > target:
                break
            units[i].reader = r
            load[r] += s
            i += 1


# ---------------------------------------------------------------------------------------------------------------
# Process-group helpers

def _torch():
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    return torch, dist


def _joined(group):
    """torch, torch.distributed, this rank and the size of `group`; EINVAL without an initialized group."""
    torch, dist = _torch()
    if not dist.is_available() or not dist.is_initialized():
        raise _fail(_errno.EINVAL, "group= needs an initialized torch.distributed process group")
    return torch, dist, dist.get_rank(group), dist.get_world_size(group)


def _global_rank(dist, group, r):
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, r)
    from torch.distributed import distributed_c10d as c10d  # noqa: PLC0415
    if group is None or group is dist.group.WORLD:
        return r
    return c10d._get_global_rank(group, r)  # noqa: SLF001


def _subgroup(dist, group, members, timeout):
    """The process group of `members` (ranks of `group`), created once and cached. Every rank calls this for the
    same member sets in the same order, so dist.new_group sees one global sequence."""
    world = dist.get_world_size(group)
    if len(members) == world:
        return group
    granks = tuple(_global_rank(dist, group, r) for r in range(world))
    key = (granks, tuple(members))
    g = _subgroups.get(key)
    if g is not None:
        return g
    ranks = [granks[r] for r in members]
    kwargs = {"timeout": timeout} if timeout is not None else {}
    if world == dist.get_world_size():
        g = dist.new_group(ranks=ranks, **kwargs)
    else:
        try:
            g = dist.new_group(ranks=ranks, use_local_synchronization=True, **kwargs)
        except TypeError as e:
            raise _fail(_errno.ENOTSUP, "a group smaller than the whole job needs torch >= 2.1 "
                                        "(new_group(use_local_synchronization=True))") from e
        if dist.get_rank() not in ranks:
            return None
    _subgroups[key] = g
    return g


def _agree(dist, group, mine, err, op="load"):
    """all_gather_object of (error, payload): every rank learns every rank's outcome; any error raises on all."""
    world = dist.get_world_size(group)
    out = [None] * world
    dist.all_gather_object(out, (None if err is None else (getattr(err, "errno", None) or _errno.EIO,
                                                            f"{type(err).__name__}: {err}"), mine), group=group)
    failed = [(r, e) for r, (e, _) in enumerate(out) if e is not None]
    if failed:
        if err is not None:
            raise err
        r, (code, msg) = failed[0]
        raise _fail(code, f"rank {r} failed: {msg}" + (f" (and {len(failed) - 1} more ranks)" if len(failed) > 1
                                                       else ""), op)
    return [p for _, p in out]


def _node_identity(node):
    if node is not None:
        return str(node)
    env = os.environ.get(NODE_ENV)
    if env:
        return env
    return socket.gethostname()


# ---------------------------------------------------------------------------------------------------------------
# Load

def load_safetensors(path, device: str = "cpu", *, group, tp_rank=None, tp_world=None, placement=None, node=None,
                     only=None, timeout=None):
    """Loads a safetensors file, index or folder with the ranks of `group` sharing the storage reads.

    placement: None (every tensor whole on every rank; with tp_rank/tp_world, ("split", 0) as the single-process
    load_safetensors(rank=, world=) slices), "replicated", ("split", dim), or a callable
    (name, shape, dtype) -> "replicated" | ("split", dim) | {rank: None | "full" | ("split", dim, index, count)}
    | None (no rank loads it). It must return the same on every rank. node: this rank's node identity (default:
    $GDSKIT_NODE, else the host name). timeout: a datetime.timedelta for the subgroups gdskit creates.
    Returns {name: torch.Tensor} with the tensors (or slices) this rank needs; statistics: gdskit.last_stats().
    """
    global _last_stats
    torch, dist, rank, world = _joined(group)
    t_start = time.perf_counter()
    from ._devices import device_name, parse_device  # noqa: PLC0415
    index = parse_device(device)
    device = device_name(index)
    if (tp_rank is None) != (tp_world is None):
        raise _fail(_errno.EINVAL, "pass both tp_rank and tp_world, or neither")
    me = (_node_identity(node), None if tp_rank is None else (int(tp_rank), int(tp_world)))
    ids = [None] * world
    dist.all_gather_object(ids, me, group=group)
    nodes = [n for n, _ in ids]

    stats = {"rank": rank, "world": world, "node": nodes[rank], "node_ranks": nodes.count(nodes[rank]),
             "bytes_read": 0, "header_bytes_read": 0, "read_requests": 0, "read_seconds": 0.0,
             "bytes_sent": 0, "bytes_received": 0, "comm_seconds": 0.0, "tensor_bytes": 0, "tensors": 0,
             "broadcasts": 0, "read_ranges": [], "path": None, "reasons": []}
    err, mine, plan, order = None, {}, None, []
    held = {}  # batch index -> (storage tensor, {name: (offset, nbytes, dtype, shape)})
    # Every rank's files and plan are checked against rank 0's before any read: ranks that see different files
    # under the same names would otherwise read and broadcast parts of different checkpoints.
    identity = None
    try:
        files, infos, header_sizes, files_identity = _read_headers(path, only)
        order = [t.name for t in infos]
        stats["header_bytes_read"] += sum(header_sizes)
        plan = _make_plan(infos, ids, world, placement)
        plan_text = repr([(b["file"], b["members"], b["reader"], b["key"], b["names"], b["post"]) for b in plan])
        identity = (files_identity, hashlib.sha256(plan_text.encode()).hexdigest())
    except Exception as e:  # noqa: BLE001  (every rank must learn of it, or the others would hang)
        err = e
    agreed = _agree(dist, group, identity, err)
    _same_checkpoint([a for a, _ in agreed], [b for _, b in agreed])
    try:
        t0 = time.perf_counter()
        for bi, b in enumerate(plan):
            if b["reader"] != rank:
                continue
            storage, layout, st = _read_batch(torch, files[b["file"]], index, b)
            st["header_bytes"] = header_sizes[b["file"]]  # the loader reads the header once more
            held[bi] = (storage, layout)
            stats["bytes_read"] += st["bytes_read"]
            stats["read_requests"] += st["read_requests"]
            stats["header_bytes_read"] += st["header_bytes"]
            stats["path"], stats["reasons"] = st["path"], st["reasons"]
            stats["read_ranges"].extend(st["ranges"])
            if len(b["members"]) > 1:
                mine[bi] = (int(storage.numel()), layout)
        stats["read_seconds"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001  (every rank must learn of it, or the others would hang)
        err = e
    layouts = {}
    for part in _agree(dist, group, mine, err):
        layouts.update(part)

    # Receive buffers first, so an allocation failure is an agreed error rather than a hang in a broadcast.
    err = None
    try:
        for bi, b in enumerate(plan):
            if rank in b["members"] and b["reader"] != rank:
                size, layout = layouts[bi]
                held[bi] = (torch.empty(size, dtype=torch.uint8, device=device), layout)
    except Exception as e:  # noqa: BLE001
        err = e
    _agree(dist, group, None, err)

    t0 = time.perf_counter()
    for bi, b in enumerate(plan):
        if len(b["members"]) < 2:
            continue
        g = _subgroup(dist, group, b["members"], timeout)
        if rank not in b["members"]:
            continue
        buf = held[bi][0]
        if buf.numel():
            dist.broadcast(buf, src=_global_rank(dist, group, b["reader"]), group=g)
        stats["broadcasts"] += 1
        if b["reader"] == rank:
            stats["bytes_sent"] += int(buf.numel())
        else:
            stats["bytes_received"] += int(buf.numel())
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    stats["comm_seconds"] = time.perf_counter() - t0

    out = {}
    wanted = {}
    for bi, b in enumerate(plan):
        if rank not in b["needers"] or bi not in held:
            continue
        storage, layout = held[bi]
        views = _views(storage, layout)
        for name, (_, _, _, shape) in layout.items():
            x = views[name]
            key = b["post"].get(name, {}).get(rank) if b["post"] else None
            if key is not None and key != "whole":
                dim, k, n = key
                start, count = _gdskit.split_rows(shape[dim], k, n)
                x = x.narrow(dim, start, count).contiguous()
            wanted[name] = x
    for name in order:
        if name in wanted:
            out[name] = wanted[name]
    stats["tensors"] = len(out)
    stats["tensor_bytes"] = sum(int(x.numel() * x.element_size()) for x in out.values())
    stats["seconds"] = time.perf_counter() - t_start
    _last_stats = stats
    return out


def _make_plan(infos, ids, world, placement):
    """Batches (one loader call, then at most one broadcast each), in one global order."""
    tps = [tp for _, tp in ids]
    if all(tp is None for tp in tps):
        tps = None
    elif any(tp is None for tp in tps) or len({n for _, n in tps}) != 1:
        raise _fail(_errno.EINVAL, "every rank must pass tp_rank and tp_world, with one tp_world")
    if placement is None:
        placement = COLUMN if tps else REPLICATED  # as load_safetensors(rank=, world=, split_dim=0) slices
    if callable(placement):
        rule = placement
    else:
        rule = lambda n, s, d: placement  # noqa: E731
    needs_of = [_normalize(t, rule(t.name, list(t.shape), t.dtype), world, tps) for t in infos]
    nodes = [n for n, _ in ids]
    units = _plan(infos, needs_of, nodes)
    index = {id(t): i for i, t in enumerate(infos)}
    groups = {}
    for u in units:
        members = tuple(sorted(set(u.needers) | {u.reader}))
        k = (u.t.file_index, members, u.reader, u.key, u.post)
        groups.setdefault(k, []).append(u)
    plan = []
    for k in sorted(groups, key=lambda k: (k[1], k[2], k[0], str(k[3]), k[4])):
        us = sorted(groups[k], key=lambda u: (u.t.file_offset, u.t.name))
        post = {}
        for u in us:
            if u.post:
                post[u.t.name] = {r: needs_of[index[id(u.t)]][r] for r in u.needers}
        plan.append({"file": k[0], "members": k[1], "reader": k[2], "key": k[3], "needers": set(u.needers),
                     "names": [u.t.name for u in us], "post": post, "infos": us})
    return plan


def _read_batch(torch, file, index, b):
    """One loader call for a batch: its tensors (or their slices) into one uint8 torch allocation on device
    `index` (-1: the CPU)."""
    from ._devices import device_name  # noqa: PLC0415
    device = device_name(index)
    storage = []

    def allocate(nbytes):
        storage.append(torch.empty(nbytes, dtype=torch.uint8, device=device))
        return storage[-1].data_ptr(), nbytes, storage[-1]

    key = b["key"]
    rank_, world_, dim = (None, None, 0) if key == "whole" else (key[1], key[2], key[0])
    tensors, st = _gdskit.load(file, index, list(b["names"]), rank_, world_, dim, allocate, 0)
    if storage:
        base, nbytes, _ = buffer_of(storage[0], writable=False, what="load")
    else:
        base, nbytes = 0, 0
    # Where each tensor lies in the allocation, as every rank that receives it will view it (tensors_in).
    layout = _gdskit.tensor_layout(tensors, list(b["names"]), base, nbytes)
    ranges = []
    for u in b["infos"]:
        ranges.extend(_byte_ranges(u.t, u.key))
    return (storage[0] if storage else torch.empty(0, dtype=torch.uint8, device=device)), layout, {
        "bytes_read": st["bytes_read"], "read_requests": st["read_requests"], "path": st["path"],
        "reasons": list(st["reasons"]), "ranges": [(file, a, z) for a, z in ranges]}


def _byte_ranges(t: _Info, key):
    """The file byte ranges [a, z) a piece covers (merged), as the loader reads them."""
    if t.nbytes == 0:
        return []
    if key == "whole":
        return [(t.file_offset, t.file_offset + t.nbytes)]
    dim, k, n = key
    first, seg, stride, segments, _ = _gdskit.slice_plan(t.dtype, list(t.shape), dim, k, n)
    if seg == 0:
        return []
    base = t.file_offset + first
    return [(base + i * stride, base + i * stride + seg) for i in range(segments)]


def _views(storage, layout):
    """{name: torch.Tensor} viewing `storage` (a uint8 torch tensor) laid out as `layout` says: the compiled
    module makes the tensors (tensors_in), torch takes them through DLPack with load_file's dtypes and shapes."""
    ptr, nbytes, device = buffer_of(storage, writable=False, what="load")
    return {name: _frameworks.from_tensor("pt", t)
            for name, t in _gdskit.tensors_in(ptr, nbytes, device, storage, layout).items()}


# ---------------------------------------------------------------------------------------------------------------
# Save

def save_sharded(tensors, folder, max_shard_size="5GB", metadata=None, overwrite: bool = False, *, group,
                 timeout=None):
    """Saves the union of every rank's {name: tensor} into `folder` as one Hugging Face checkpoint
    (model-0000k-of-0000n.safetensors + model.safetensors.index.json, or model.safetensors alone), the ranks of
    `group` writing a byte-balanced share of the files in parallel; the same files whatever the world size.

    A name held by several ranks must have one dtype and shape everywhere (a replicated tensor: one holder
    writes it). The order of the checkpoint is rank 0's dict, then the names rank 1 adds, and so on; shards are
    planned on it as gdskit.save_sharded plans them. A file is written by a rank that holds most of its bytes;
    the tensors it lacks come from a holder over the group. Rank 0 writes the index once every rank has reported
    its files written; a failure on any rank makes every rank raise (no index is published, the shards this save
    published are removed unless overwrite). Returns the final file names on every rank.
    Statistics: gdskit.distributed.last_stats()."""
    global _last_stats
    from . import _save  # noqa: PLC0415  (the single-process writer: save_file and its rules)
    torch, dist, rank, world = _joined(group)
    t_start = time.perf_counter()
    folder = os.fspath(folder)
    stats = {"rank": rank, "world": world, "files_written": 0, "bytes_written": 0, "write_seconds": 0.0,
             "sync_seconds": 0.0, "bytes_sent": 0, "bytes_received": 0, "comm_seconds": 0.0, "written": []}
    err, desc, limit, settings, token, created = None, [], 0, None, None, False
    try:
        limit = _save.parse_shard_size(max_shard_size)
        settings = (limit, bool(overwrite), _save._metadata(metadata))  # noqa: SLF001
        for name, t in tensors.items():
            _save._utf8(name, "tensor name")  # noqa: SLF001
            desc.append((name, str(t.dtype), tuple(t.shape), int(t.numel() * t.element_size())))
        if rank == 0:
            # The folder every rank writes to: rank 0 makes it and leaves a token in it that the others must
            # find, so that ranks writing to folders of their own (node-local disks) fail before any write.
            created = not os.path.isdir(folder)
            os.makedirs(folder, exist_ok=True)
            token = _leave_token(folder)
    except Exception as e:  # noqa: BLE001
        err = e
    try:
        descs = _check_save_preconditions(dist, group, rank, folder, desc, settings, token, err)
    except BaseException:
        if created:
            _remove_empty(folder)
        raise

    order, info, holders = [], {}, {}
    for r, d in enumerate(descs):
        for name, dtype, shape, nbytes in d:
            if name not in info:
                info[name] = (dtype, shape, nbytes)
                order.append(name)
            elif info[name] != (dtype, shape, nbytes):
                # Every rank sees the same descriptions, so every rank raises here.
                raise _fail(_errno.EINVAL, f"tensor {name!r}: rank {holders[name][0]} has {info[name][:2]}, "
                                           f"rank {r} has {(dtype, shape)}", "save")
            holders.setdefault(name, []).append(r)
    shards = _gdskit.plan_shards([info[n][2] for n in order], limit) if order else []
    count = max(1, len(shards))
    files = [_gdskit.shard_file_name(k + 1, count) for k in range(count)]
    parts = [[order[i] for i in s] for s in shards] or [[]]
    writers = _assign_writers(parts, info, holders, world)
    transfers = [(name, holders[name][0], w) for part, w in zip(parts, writers) for name in part
                 if w not in holders[name]]

    # Nothing exists that must not be replaced: checked by the writers (and rank 0 for the index) first.
    err = None
    try:
        if not overwrite:
            mine = [os.path.join(folder, f) for f, w in zip(files, writers) if w == rank]
            if rank == 0 and count > 1:
                mine.append(os.path.join(folder, "model.safetensors.index.json"))
            for p in mine:
                if os.path.lexists(p):
                    raise FileExistsError(_errno.EEXIST, "exists; overwrite=True replaces it", p)
    except Exception as e:  # noqa: BLE001
        err = e
    try:
        _agree(dist, group, None, err, "save")
    except BaseException:
        if created:
            _remove_empty(folder)
        raise

    # Tensors a writer lacks, point to point in one global order (a blocking pair at a time: no cycles).
    received = {}
    t0 = time.perf_counter()
    if transfers:
        cuda = dist.get_backend(group) == "nccl"
        dev = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
        for name, src, dst in transfers:
            if info[name][2] == 0:
                if rank == dst:
                    received[name] = _typed(torch, torch.empty(0, dtype=torch.uint8, device=dev), *info[name][:2])
                continue
            if rank == src:
                x = _raw_bytes(torch, tensors[name]).to(dev)
                dist.send(x, dst=_global_rank(dist, group, dst), group=group)
                stats["bytes_sent"] += int(x.numel())
            elif rank == dst:
                dtype, shape, nbytes = info[name]
                buf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
                dist.recv(buf, src=_global_rank(dist, group, src), group=group)
                stats["bytes_received"] += nbytes
                received[name] = _typed(torch, buf, dtype, shape)
    stats["comm_seconds"] = time.perf_counter() - t0

    err, published = None, []
    t0 = time.perf_counter()
    try:
        for part, fname, w in zip(parts, files, writers):
            if w != rank:
                continue
            path = os.path.join(folder, fname)
            _save.save_file({n: received[n] if n in received else tensors[n] for n in part}, path, metadata,
                            overwrite=overwrite)
            published.append(path)
            st = _save.last_save_stats()
            stats["files_written"] += 1
            stats["bytes_written"] += st.get("file_bytes", 0)
            stats["sync_seconds"] += st.get("sync_seconds", 0.0)
    except Exception as e:  # noqa: BLE001
        err = e
    stats["write_seconds"] = time.perf_counter() - t0
    received.clear()
    try:
        _agree(dist, group, None, err, "save")
    except BaseException:
        if not overwrite:  # the files did not exist before this save
            for p in published:
                try:
                    os.unlink(p)
                except OSError:
                    pass
        raise

    written = [os.path.join(folder, f) for f in files]
    err = None
    if count > 1:
        if rank == 0:
            try:
                weight_map = [(n, f) for part, f in zip(parts, files) for n in part]
                _gdskit.write_index(folder, weight_map, sum(info[n][2] for n in order), bool(overwrite))
            except Exception as e:  # noqa: BLE001
                err = e
        _agree(dist, group, None, err, "save")
        written.append(os.path.join(folder, "model.safetensors.index.json"))
    stats["written"] = written
    stats["seconds"] = time.perf_counter() - t_start
    _last_stats = stats
    return written


_TOKEN_PREFIX = ".gdskit-shared-"


def _leave_token(folder):
    """Creates a file of random name and content in `folder`; returns (name, content, folder)."""
    name, content = _TOKEN_PREFIX + os.urandom(8).hex(), os.urandom(16).hex()
    fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, content.encode())
    finally:
        os.close(fd)
    return name, content, folder


def _sees_token(folder, token) -> bool:
    """Whether `folder` holds the token rank 0 left (the same folder, as this rank sees it)."""
    name, content, _ = token
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.read(fd, 64) == content.encode()
    except OSError:
        return False
    finally:
        os.close(fd)


def _remove_empty(folder):
    try:
        os.rmdir(folder)
    except OSError:
        pass


def _check_save_preconditions(dist, group, rank, folder, desc, settings, token, err):
    """Two collectives that every rank passes or fails alike, before anything is written: every rank's
    descriptions and settings (max_shard_size, overwrite, metadata: the same everywhere), and whether each rank
    sees the token rank 0 left in the folder. Removes the token (rank 0). Returns the descriptions."""
    try:
        gathered = _agree(dist, group, (desc, settings, token), err, "save")
        token = gathered[0][2]
        for r, (_, other, _) in enumerate(gathered[1:], 1):
            if other != gathered[0][1]:
                names = ("max_shard_size", "overwrite", "metadata")
                what = next(n for n, a, b in zip(names, gathered[0][1], other) if a != b)
                raise _fail(_errno.EINVAL, f"rank 0 and rank {r} pass different {what}: every rank must pass the "
                                           "same max_shard_size, overwrite and metadata", "save")
        sees = rank == 0
        sees_err = None
        try:
            sees = sees or _sees_token(folder, token)
        except Exception as e:  # noqa: BLE001
            sees_err = e
        seen = _agree(dist, group, sees, sees_err, "save")
    finally:
        if rank == 0 and token is not None:
            try:
                os.unlink(os.path.join(folder, token[0]))
            except OSError:
                pass
    blind = [r for r, ok in enumerate(seen) if not ok]
    if blind:
        ranks = ", ".join(str(r) for r in blind)
        raise _fail(_errno.EINVAL, f"rank{'s' if len(blind) > 1 else ''} {ranks} cannot see the folder rank 0 "
                                   f"writes to ({token[2]!r} on rank 0): a distributed save needs one shared folder "
                                   "that every rank reaches (a node-local path on each node gives each node part "
                                   "of the checkpoint)", "save")
    return [d for d, _, _ in gathered]


def _assign_writers(parts, info, holders, world):
    """A writer per file: among the ranks holding the most of its bytes, the one with the fewest bytes to write
    so far (largest files first)."""
    load = [0] * world
    writers = [0] * len(parts)
    for k in sorted(range(len(parts)), key=lambda k: -sum(info[n][2] for n in parts[k])):
        held = [0] * world
        for n in parts[k]:
            for r in holders[n]:
                held[r] += info[n][2]
        best = max(held) if parts[k] else 0
        w = min((r for r in range(world) if held[r] == best), key=lambda r: (load[r], r))
        writers[k] = w
        load[w] += sum(info[n][2] for n in parts[k])
    return writers


def _raw_bytes(torch, t):
    from ._save import _resolved  # noqa: PLC0415  (conjugate and negative views: their values, not their memory)
    t = _resolved(t.detach()).contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def _typed(torch, buf, dtype, shape):
    """A received tensor's raw bytes as the dtype (torch's name, e.g. 'torch.bfloat16') and shape it was sent."""
    dt = getattr(torch, dtype.split(".")[-1])
    if buf.numel() == 0:
        return torch.empty(shape, dtype=dt, device=buf.device)
    return buf.view(dt).view(shape)
