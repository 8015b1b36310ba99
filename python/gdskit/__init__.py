"""gdskit: move data between storage and GPU memory, and say which path it took.

    import gdskit
    tensors = gdskit.load_file("model.safetensors", device="cuda:0")          # as safetensors.torch.load_file
    gdskit.save_file(tensors, "copy.safetensors")                              # as safetensors.torch.save_file
    data = gdskit.save(tensors); tensors = gdskit.load(data)                  # as safetensors.torch.save/load
    with gdskit.safe_open("model.safetensors", framework="pt") as f:           # as safetensors.safe_open
        part = f.get_slice("embed.weight")[:, :1024]
    tensors = gdskit.load_safetensors("model-dir/", device="cuda:0")          # files, indexes, folders, slices
    with gdskit.File("data.bin", "rb") as f:                                   # KvikIO's CuFile arguments
        f.read(tensor, file_offset=0)
    path, reasons = gdskit.plan("model.safetensors", device="cuda:0")          # ("staged", ["nvidia-fs ..."])
    with gdskit.settings(direct="off"):                                        # settings, restored after
        ...

Devices are "cpu", "cuda", "cuda:N", N or a torch.device everywhere; a CUDA device this machine cannot use is
OSError(ENODEV) with the reason. Errors: OSError subclasses with errno and filename for I/O (FileNotFoundError,
IsADirectoryError, PermissionError, ...), SafetensorError (a ValueError and an OSError with errno EBADMSG) for a
malformed file, InvalidArgumentError (a ValueError and an OSError with errno EINVAL) for input the engine
refuses, ValueError/TypeError for bad arguments.
"""

from __future__ import annotations

import os

from . import _frameworks
from . import _gdskit
from ._buffers import buffer_of as _buffer_of
from ._devices import device_name as _device_name
from ._devices import parse_device as _parse_device
from ._file import File, IOFuture
from ._safetensors import SafetensorError, load_file, safe_open
from ._settings import _say_learned, settings

__version__ = _gdskit.__version__
Tensor = _gdskit.Tensor
InvalidArgumentError = _gdskit.InvalidArgumentError

__all__ = ["load_file", "safe_open", "SafetensorError", "InvalidArgumentError", "File", "IOFuture", "settings",
           "load_safetensors", "load_safetensors_raw", "read", "plan", "header", "gpu_available", "last_stats",
           "Tensor", "__version__"]

_last_stats: dict = {}


def load_safetensors_raw(path, device="cpu", *, only=None, rank=None, world=None, split_dim: int = 0,
                         allocate=None):
    """Loads like load_safetensors but returns gdskit.Tensor objects (DLPack exporters) and the stats dict.
    Works without torch or numpy: each Tensor has .dtype, .shape, .nbytes, .tobytes() (host) and __dlpack__.
    allocate(nbytes), if given, returns an allocation: a contiguous torch tensor or numpy array of at least
    nbytes bytes on `device` (checked; the tensors keep it alive). It is called once per shard that has selected
    tensors (once for a single file), in file order, on the calling thread."""
    return _load_raw(path, _parse_device(device), only, rank, world, split_dim, allocate)


def _load_raw(path, index: int, only, rank, world, split_dim, allocate):
    callback = None if allocate is None else _checked_allocate(allocate, index)
    try:
        return _gdskit.load(_path(path), index, _names(only), _count(rank, "rank"), _count(world, "world"),
                            _count(split_dim, "split_dim"), callback)
    finally:
        _say_learned()


def _checked_allocate(allocate, device: int):
    if not callable(allocate):
        raise TypeError("allocate must be callable: allocate(nbytes) -> tensor or array")

    def call(nbytes):
        buf = allocate(nbytes)
        ptr, have, where = _buffer_of(buf, writable=True, what="allocate")
        if have < nbytes:
            raise ValueError(f"allocate returned {have} bytes; the load needs {nbytes}")
        if where != device:
            raise ValueError(f"allocate returned memory on {_device_name(where)}; the load is for "
                             f"{_device_name(device)}")
        return ptr, have, buf

    return call


def _path(path) -> str:
    try:
        return os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}") from None


def _names(only):
    if only is None:
        return []
    if isinstance(only, str):
        return [_utf8(only, "only: name")]
    names = list(only)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"only: names must be str, not {type(n).__name__}")
        _utf8(n, "only: name")
    return names


def _count(value, what):
    if value is None:
        return None if what != "split_dim" else 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must be >= 0, not {value}")
    return value


def load_safetensors(path, device="cpu", *, only=None, rank=None, world=None, split_dim: int = 0,
                     framework: str = "auto", group=None, **distributed):
    """Loads a .safetensors file, a *.safetensors.index.json or a folder onto `device` ("cpu", "cuda", "cuda:N",
    N or a torch.device), one allocation per shard, and returns {name: tensor} in file order.

    only: names, or prefixes ending in '.' or '*'. rank/world/split_dim: this rank's slice (numpy.array_split
    rule) of every tensor with more than split_dim dimensions. framework: "torch", "numpy", "dlpack" (gdskit.Tensor
    objects) or "auto" (torch if importable, else numpy for cpu, else dlpack). An allocation is freed when the
    last tensor that views it is gone. Statistics of the load: gdskit.last_stats().
    """
    global _last_stats
    # Distributed load over a torch.distributed group (tp_rank, tp_world, placement, node, timeout): distributed.py
    if group is not None or distributed:
        from . import distributed as _distributed  # noqa: PLC0415
        out = _distributed.load_safetensors(path, device, group=group, only=only, **distributed)
        _last_stats = _distributed.last_stats()
        return out
    return _load(path, _parse_device(device), only, rank, world, split_dim, framework)


def _load(path, index: int, only=None, rank=None, world=None, split_dim: int = 0, framework: str = "auto"):
    """load_safetensors with the device already parsed (-1: the CPU, N: cuda:N)."""
    global _last_stats
    if framework == "auto":
        if _frameworks.torch() is not None:
            framework = "torch"
        elif index < 0 and _frameworks.numpy() is not None:
            framework = "numpy"
        else:
            framework = "dlpack"
    if framework not in ("torch", "numpy", "dlpack"):
        raise ValueError(f"framework must be auto, torch, numpy or dlpack, not {framework!r}")
    if framework == "numpy" and index >= 0:
        raise ValueError("framework='numpy' gives numpy arrays, which live on the CPU: use device='cpu'")
    allocate = None
    if framework == "torch":
        # The allocations come from torch (its caching allocator on a GPU: no cuMemAlloc per load when torch
        # has the memory cached), one uint8 tensor per shard; the tensors are made from them once, through
        # DLPack, and keep them alive.
        torch = _frameworks.torch(required="framework='torch'")
        where = _device_name(index)

        def allocate(nbytes):
            return torch.empty(nbytes, dtype=torch.uint8, device=where)
    elif framework == "numpy":
        _frameworks.numpy(required="framework='numpy'")
    tensors, stats = _load_raw(path, index, only, rank, world, split_dim, allocate)
    _last_stats = stats
    if framework == "dlpack":
        return tensors
    short = "pt" if framework == "torch" else "np"
    return {k: _frameworks.from_tensor(short, v) for k, v in tensors.items()}


def last_stats() -> dict:
    """Statistics of the last load_safetensors call: seconds (the reads), header_seconds, alloc_seconds,
    gib_per_s, tensor_bytes, bytes_read, read_requests, files, path, reasons, metadata."""
    return dict(_last_stats)


def read(path, tensor, offset: int = 0) -> int:
    """Reads tensor.nbytes bytes at `offset` of the file into `tensor` (a contiguous torch tensor on the CPU or
    a CUDA device, or a C-contiguous numpy array). Returns the bytes read (fewer only at end of file)."""
    with File(path, "r") as f:
        return f.read(tensor, file_offset=offset)


def plan(path, device="cuda:0"):
    """The data path gdskit takes to read `path` into memory on `device`, and the reasons:
    ("gds" | "staged" | "compat" | "host", [reason, ...]). A CUDA device without a usable GPU raises
    OSError(ENODEV) with the reason, as a read would."""
    with File(path, "r") as f:
        return f.plan(device)


def header(path):
    """The validated safetensors header: ([{name, dtype, shape, data_offsets, file_offset}], metadata)."""
    return _gdskit.header(_path(path))


def gpu_available():
    """(True, "") when a CUDA GPU can be used, else (False, reason)."""
    return _gdskit.gpu_available()


# Batches of many ranges and row gathers (gdskit/_batch.py).
from ._batch import (BatchError, BatchFuture, BatchResult, ItemResult, RowFile, gather_rows,  # noqa: E402
                     read_into, submit_reads, submit_writes, write_from)

__all__ += ["read_into", "write_from", "submit_reads", "submit_writes", "BatchFuture", "BatchResult", "BatchError",
            "ItemResult", "gather_rows", "RowFile"]

# Saving: safetensors files and sharded checkpoints (gdskit/_save.py).
from ._save import _utf8, last_save_stats, load, save, save_file, save_sharded  # noqa: E402

__all__ += ["save_file", "save_sharded", "last_save_stats", "save", "load"]

# Distributed save over a torch.distributed group (distributed.py); without group= the single-process save.
_save_sharded_single = save_sharded


def save_sharded(tensors, folder, max_shard_size="5GB", metadata=None, overwrite: bool = False, *, group=None,
                 **options):
    if group is None:
        return _save_sharded_single(tensors, folder, max_shard_size, metadata, overwrite, **options)
    from . import distributed as _distributed  # noqa: PLC0415
    return _distributed.save_sharded(tensors, folder, max_shard_size, metadata, overwrite, group=group, **options)


save_sharded.__doc__ = (_save_sharded_single.__doc__ or "") + """
    group: a torch.distributed process group: every rank passes the tensors it holds and the ranks write the
    files in parallel (gdskit.distributed.save_sharded, docs/distributed.md)."""
